"""The exactness check of the static backend's decoding paths against its float32 reference."""

import pytest
import torch

from dysco_interp.analysis import decode_exactness as ex
from dysco_interp.heads import HeadSet


def heads_for(model):
    s = model.spec
    return HeadSet([(1, 0), (2, 3), (3, 1)], model=s.name, n_layers=s.n_layers, n_heads=s.n_heads,
                   n_kv_heads=s.n_kv_heads)


def test_in_float32_every_path_is_the_reference_up_to_rounding(tiny_of):
    model = tiny_of("qwen3")
    ids = ex.source_prompt(model, 300)
    assert 250 < ids.shape[1] <= 300
    out = ex.compare_paths(model, heads_for(model), ids, top_p=0.5)
    assert set(out) == {"prompt_tokens", "logit_scale", "n_selected", "fused-plain", "hf-sdpa"}  # no CUDA: no compile
    assert 0 < out["n_selected"] < ids.shape[1] - 2
    for name in ("fused-plain", "hf-sdpa"):
        assert out[name]["argmax_equal"]
        assert out[name]["max_abs_logit_diff_plain"] < 1e-4 and out[name]["max_abs_logit_diff_biased"] < 1e-4
        assert out[name]["max_abs_relevance_diff"] < 1e-5


def test_differences_are_measured_not_assumed(tiny_of):
    model = tiny_of("qwen3")
    ids = ex.source_prompt(model, 200)
    ref = ex.two_steps(model, heads_for(model), ids, ex.PATHS[ex.REFERENCE], ex.BiasOf(0.5, 4096, 2.0))
    # another prompt (tokens near the end changed) stands in for a path that computes something else
    changed = ids.clone()
    changed[0, -12:-4] = 100 + torch.arange(8)
    other = ex.two_steps(model, heads_for(model), changed, ex.PATHS["hf-sdpa"], ex.BiasOf(0.5, 4096, 2.0))
    same = ex.differences(ref, ref)
    assert same["max_abs_logit_diff_plain"] == same["max_abs_logit_diff_biased"] == 0.0 and same["argmax_equal"]
    assert ex.differences(ref, other)["max_abs_logit_diff_plain"] > 1e-3


def test_a_prompt_too_short_is_refused(tiny_of):
    model = tiny_of("qwen3")
    with pytest.raises(ValueError, match="at least 3 tokens"):
        ex.compare_paths(model, heads_for(model), torch.tensor([[5, 6]]))
    with pytest.raises(ValueError, match="no room"):
        ex.source_prompt(model, 10)


def test_first_difference_is_the_first_new_token_that_leaves_the_reference():
    assert ex.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert ex.first_difference([1, 5, 3], [1, 2, 3]) == 1
    assert ex.first_difference([1, 2], [1, 2, 3]) == 2  # stopped early
    assert ex.first_difference([1, 2, 3], [1, 2]) == 2


def test_in_float32_every_path_decodes_the_bridge_s_tokens(tiny_of):
    model = tiny_of("qwen3")
    ids = ex.source_prompt(model, 200)
    out = ex.token_agreement(model, heads_for(model), ids, 6)
    assert out["new_tokens"] == 6 and out["prompt_tokens"] == ids.shape[1]
    assert {name: out[name] for name in ex.paths_for(model.device)} == {
        name: {"vanilla": None, "dysco": None} for name in ex.paths_for(model.device)}
