"""A prompt chunk's attention: every earlier key, and causally the chunk's own keys. Pure tensor math.

One SDPA call with a lower-right causal bias computes it, but PyTorch runs that bias only on
its FlashAttention-2 or memory-efficient kernel, well below cuDNN's rate on a Hopper card (a
prefill of 102,400 tokens of the Qwen3-8B shape on an H200: 12.1 s that way, 8.5 s split, the
other pieces alike). On a GPU the chunk's attention is split instead, by keys:
- the earlier keys need no mask. Each KV head's query heads are folded into its query rows, so
  the call is plain multi-head attention that cuDNN's fused kernel runs;
- the chunk's own keys form a square causal block, which every kernel takes (`is_causal`);
- the two partial softmaxes are merged exactly by their log-sum-exps.

Its temporaries (two partial outputs, one float32 merge) stay below the MLP's, so prefill's peak
memory did not rise. Where no fused kernel with log-sum-exp runs (the CPU), the single call is used.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.backends.cuda import SDPAParams, can_use_cudnn_attention, can_use_flash_attention
from torch.nn.attention.bias import causal_lower_right
from torch.nn.functional import scaled_dot_product_attention


def single_call(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float,
                groups: int) -> torch.Tensor:
    """The reference: one SDPA call under the lower-right causal bias, `[B, heads, s, d]`."""
    causal = causal_lower_right(q.shape[2], keys.shape[2])  # earlier keys all visible
    return scaled_dot_product_attention(q, keys, values, attn_mask=causal, scale=scale, enable_gqa=groups > 1)


def merged(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor) -> torch.Tensor:
    """The softmax attention over two disjoint key sets from each set's own: outputs
    `[B, heads, s, d]` and natural-log log-sum-exps `[B, heads, s]` (float32). The weight of the
    first set is sigmoid(lse_a - lse_b); the sum is formed in float32."""
    weight = torch.sigmoid(lse_a - lse_b).unsqueeze(-1)
    return out_a.float().sub_(out_b).mul_(weight).add_(out_b).to(out_a.dtype)


def with_lse(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float,
             causal: bool) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Attention and its log-sum-exp `[B, heads, s]` through a fused kernel that returns both
    (cuDNN's, else FlashAttention's); None where neither runs. Grouped keys are passed as they are."""
    if not q.is_cuda:
        return None
    gqa = keys.shape[1] != q.shape[1]
    params = SDPAParams(q, keys, values, None, 0.0, causal, gqa)
    if can_use_cudnn_attention(params):
        out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(
            q, keys, values, None, True, 0.0, causal, False, scale=scale)[:2]
    elif can_use_flash_attention(params):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, keys, values, 0.0, causal, False,
                                                                        scale=scale)[:2]
    else:
        return None
    return out, lse.reshape(q.shape[:3])


# (queries, keys, values, scale, causal) -> (attention, log-sum-exp) or None where it cannot run
Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float, bool], tuple[torch.Tensor, torch.Tensor] | None]


def chunk_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float, groups: int,
                    kernel: Kernel = with_lse) -> torch.Tensor:
    """Queries `[B, heads, s, d]` of the last s positions over `keys`/`values`
    `[B, kv_heads, n, d]` (n >= s, the chunk's own keys last): `[B, heads, s, d]`.
    `kernel` gives an attention and its log-sum-exp (`with_lse`, the default, on a GPU only)."""
    batch, n_heads, s, dim = q.shape
    earlier = keys.shape[2] - s
    own = kernel(q, keys[:, :, earlier:], values[:, :, earlier:], scale, True)
    if own is None:
        return single_call(q, keys, values, scale, groups)
    if earlier == 0:
        return own[0]
    # a KV head's query heads become its query rows: no mask, so the heads need not stay apart
    folded = q.reshape(batch, keys.shape[1], groups * s, dim)
    before = kernel(folded, keys[:, :, :earlier], values[:, :, :earlier], scale, False)
    if before is None:
        return single_call(q, keys, values, scale, groups)
    out_a, lse_a = (t.reshape(batch, n_heads, s, *t.shape[3:]) for t in before)
    return merged(out_a, lse_a, *own)
