"""The fast backends on the real default model: the TransformerLens path's tokens and selected sets."""

import pytest

from dysco_interp.decoding.config import DecodingConfig
from dysco_interp.decoding.loop import compare_methods
from dysco_interp.heads import shipped_heads
from dysco_interp.tasks.path_traversal import generate_instance

pytestmark = pytest.mark.real_model


def test_sdpa_and_static_decode_a_path_traversal_prompt_like_the_bridge(real_model):
    instance = generate_instance(real_model.tokenizer, 1000, seed=3)
    heads = shipped_heads("smollm2-135m", spec=real_model.spec)
    configs = {
        "vanilla": DecodingConfig(method="vanilla", max_new_tokens=16),
        "dysco": DecodingConfig(max_new_tokens=16, record_positions=True),
    }
    runs = {
        b: compare_methods(real_model, instance.prompt, configs, heads, backend=b) for b in ("bridge", "sdpa", "static")
    }
    for backend in ("sdpa", "static"):
        for name in configs:
            ours, ref = runs[backend][name], runs["bridge"][name]
            assert ours.tokens == ref.tokens, (backend, name)
            assert [s.selected for s in ours.trace.steps] == [s.selected for s in ref.trace.steps], (backend, name)
    steps = runs["bridge"]["dysco"].trace.steps
    assert any(s.selected for s in steps) and len(runs["bridge"]["dysco"].tokens) == 16
