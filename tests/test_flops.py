"""Analytic FLOPs: hand-computed small cases, sums against closed forms, the paper's setting."""

from __future__ import annotations

import pytest

from dysco_interp.analysis import flops as F
from dysco_interp.errors import ConfigError

# 2 layers, d_model 4, 2 query heads sharing 1 KV head of width 2, gated MLP of 8, vocab 10
TINY = F.ModelShape(n_layers=2, d_model=4, n_heads=2, n_kv_heads=1, d_head=2, d_mlp=8, vocab=10)
QWEN3_8B = F.ModelShape(36, 4096, 32, 8, 128, 12288, 151936, name="Qwen3-8B")


def test_per_token_parts_by_hand():
    # Q 4x4 (32) + K 4x2 (16) + V 4x2 (16) + O 4x4 (32)
    assert F.projection_flops(TINY) == 96
    assert F.mlp_flops(TINY) == 2 * 3 * 4 * 8 == 192
    assert F.mlp_flops(F.ModelShape(2, 4, 2, 1, 2, 8, 10, mlp_matrices=2)) == 128
    assert F.attention_flops(TINY, 3) == 2 * 2 * (2 * 2 * 3)  # q.K and p.V, 2 heads, 3 keys
    assert F.unembed_flops(TINY) == 80
    assert F.decode_token_flops(TINY, 3) == 2 * (96 + 192 + 48) + 80 == 752


def test_prefill_and_decode_by_hand():
    # token i of the prompt attends i keys; logits only for the last one
    assert F.prefill_flops(TINY, 3) == 2 * (3 * 288 + 16 * (1 + 2 + 3)) + 80 == 2000
    # two decode steps after 3 prompt tokens attend 4 and 5 keys
    assert F.decode_flops(TINY, 3, 2) == (2 * (288 + 64) + 80) + (2 * (288 + 80) + 80) == 1600


@pytest.mark.parametrize("n_prompt,n_new", [(1, 1), (7, 5), (300, 41)])
def test_closed_forms_equal_the_step_sums(n_prompt, n_new):
    s = F.ModelShape(3, 24, 6, 2, 4, 40, 50)
    per_token_no_logits = [F.decode_token_flops(s, i) - F.unembed_flops(s) for i in range(1, n_prompt + 1)]
    assert F.prefill_flops(s, n_prompt) == sum(per_token_no_logits) + F.unembed_flops(s)
    steps = range(n_prompt + 1, n_prompt + n_new + 1)
    assert F.decode_flops(s, n_prompt, n_new) == sum(F.decode_token_flops(s, n) for n in steps)
    total = sum((F.dysco_extra_token(s, n, 1, 3) for n in steps), F.DyscoExtra(0, 0, 0, 0))
    assert F.dysco_extra_flops(s, n_prompt, n_new, 1, 3) == total


def test_dysco_extra_by_hand():
    extra = F.dysco_extra_token(TINY, 4, deepest_layer=0, n_qr_heads=1)
    assert extra.partial == 1 * (96 + 192 + 16 * 4)  # layer 0 only, no unembedding
    assert extra.relevance == 1 * (2 * 2 + 3 + 1) * 4 + 3 * 4  # q.K, softmax, mean; momentum
    assert extra.selection == 4 * 2 + 4  # sort 4 keys (4 * log2 4), cumulative sum
    assert extra.bias == 2 * 2 * 4  # every head of every layer
    assert extra.total == 352 + 44 + 12 + 16
    assert F.dysco_extra_flops(TINY, 3, 2, 0, 1).total == 424 + (368 + 55 + 20 + 20)
    assert F.selection_ops(1) == 1 and F.selection_ops(5) == 5 * 3 + 5


def test_deeper_heads_cost_more_and_a_full_depth_pass_about_doubles_a_step():
    s = F.ModelShape(8, 64, 4, 4, 16, 256, 100)
    costs = [F.dysco_extra_token(s, 512, d, 2).total for d in range(8)]
    assert costs == sorted(costs) and len(set(costs)) == 8
    ratio = 1 + costs[-1] / F.decode_token_flops(s, 512)
    assert 1.9 < ratio < 2.05  # all layers again, minus the unembedding, plus small terms


def test_paper_setting_matches_the_layer_floor():
    o = F.overhead(QWEN3_8B, 100_000, 4096, deepest_layer=24, n_qr_heads=16)
    floor = 1 + 25 / 36
    # below the layer floor (no unembedding in the partial pass), but close to it at 100K
    assert 1.6 < o["token_ratio_first"] < floor and 1.6 < o["decode_ratio"] < floor
    assert o["partial_layers"] == 25
    assert o["dysco_extra_flops"]["partial"] > 0.95 * o["dysco_extra_flops"]["total"]
    assert 0.03 < o["extra_share_of_total"] < 0.06  # prefill of 100K dominates a 4K decode
    longer = F.overhead(QWEN3_8B, 100_000, 8192, 24, 16)
    assert longer["extra_share_of_total"] > o["extra_share_of_total"]


def test_shape_from_hf_config_and_bad_input():
    cfg = {"num_hidden_layers": 24, "hidden_size": 896, "num_attention_heads": 14, "num_key_value_heads": 2,
           "intermediate_size": 4864, "vocab_size": 151936}
    s = F.ModelShape.from_hf_config(cfg, "qwen")
    assert (s.d_head, s.n_kv_heads, s.name) == (64, 2, "qwen")
    with pytest.raises(ConfigError, match="size field"):
        F.ModelShape.from_hf_config({"hidden_size": 8}, "broken")
    with pytest.raises(ConfigError, match="multiple of n_kv_heads"):
        F.ModelShape(2, 4, 3, 2, 2, 8, 10)
    with pytest.raises(ConfigError, match="d_model"):
        F.ModelShape(2, 0, 2, 1, 2, 8, 10)
    with pytest.raises(ConfigError, match="deepest QRHead layer"):
        F.dysco_extra_token(TINY, 4, deepest_layer=2, n_qr_heads=1)
    with pytest.raises(ConfigError, match="number of QRHeads"):
        F.dysco_extra_token(TINY, 4, deepest_layer=0, n_qr_heads=5)
    with pytest.raises(ConfigError, match="n_new"):
        F.decode_flops(TINY, 3, 0)
