"""A prompt chunk's attention split by keys and merged by log-sum-exps equals the single call."""

import math

import pytest
import torch

from dysco_interp.decoding.backends.prefill_attention import chunk_attention, merged, single_call, with_lse


def explicit(q, keys, values, scale, causal):
    """Attention and its log-sum-exp written out in float64, grouped keys repeated."""
    groups = q.shape[1] // keys.shape[1]
    k, v = (t.double().repeat_interleave(groups, dim=1) for t in (keys, values))
    scores = q.double() @ k.transpose(-1, -2) * scale
    if causal:  # square: query i sees keys 0..i
        scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), -math.inf)
    lse = scores.logsumexp(-1)
    return ((scores - lse[..., None]).exp() @ v).to(q.dtype), lse.float()


def inputs(batch, kv_heads, groups, s, n, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, kv_heads * groups, s, 16, generator=g, dtype=torch.float64)
    keys, values = (torch.randn(batch, kv_heads, n, 16, generator=g, dtype=torch.float64) for _ in range(2))
    return (t.to(dtype=dtype, device=device) for t in (q, keys, values))


def test_two_key_sets_merge_into_the_attention_over_both():
    q, keys, values = inputs(2, 3, 1, 5, 40)
    whole, lse = explicit(q, keys, values, 0.25, False)
    a = explicit(q, keys[:, :, :13], values[:, :, :13], 0.25, False)
    b = explicit(q, keys[:, :, 13:], values[:, :, 13:], 0.25, False)
    torch.testing.assert_close(merged(*a, *b), whole, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(torch.logaddexp(a[1], b[1]), lse)
    # a set far below the other adds nothing, and no NaN
    far = (a[0], a[1] - 1e4)
    torch.testing.assert_close(merged(*far, *b), b[0])


@pytest.mark.parametrize("groups", [1, 4, 7])
@pytest.mark.parametrize("earlier", [0, 9, 32])
def test_a_split_chunk_equals_one_lower_right_causal_call(groups, earlier):
    q, keys, values = inputs(2, 2, groups, 6, earlier + 6, seed=groups + earlier)
    ref = single_call(q, keys, values, 0.3, groups)
    calls = []

    def kernel(*args):
        calls.append(args[1].shape[2])
        return explicit(*args)

    torch.testing.assert_close(chunk_attention(q, keys, values, 0.3, groups, kernel=kernel), ref,
                               atol=1e-5, rtol=1e-4)
    assert calls == ([6] if earlier == 0 else [6, earlier])  # the own block, then the earlier keys


def test_without_a_fused_kernel_the_chunk_takes_the_single_call():
    q, keys, values = inputs(1, 2, 3, 4, 10)
    assert torch.equal(chunk_attention(q, keys, values, 0.3, 3), single_call(q, keys, values, 0.3, 3))
    assert torch.equal(chunk_attention(q, keys, values, 0.3, 3, kernel=lambda *args: None),
                       single_call(q, keys, values, 0.3, 3))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("groups", [4, 6, 7])
@pytest.mark.parametrize("earlier", [0, 1000, 4096])
def test_on_a_gpu_the_fused_split_matches_the_single_call(groups, earlier):
    s = 512
    q, keys, values = inputs(2, 2, groups, s, earlier + s, dtype=torch.bfloat16, device="cuda")
    q, keys, values = (torch.nn.functional.pad(t, (0, 112)) for t in (q, keys, values))  # d 128, as the models
    own = (keys[:, :, earlier:], values[:, :, earlier:])
    fused = with_lse(q, *own, 0.09, True)
    assert fused is not None  # a fused kernel runs, and its log-sum-exp is in natural-log units
    torch.testing.assert_close(fused[1], explicit(q, *own, 0.09, True)[1], atol=1e-2, rtol=1e-3)
    torch.testing.assert_close(chunk_attention(q, keys, values, 0.09, groups),
                               single_call(q, keys, values, 0.09, groups), atol=2e-2, rtol=2e-2)
