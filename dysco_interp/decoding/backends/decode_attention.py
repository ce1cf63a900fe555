"""Attention of one decoding query per row over fixed key/value buffers: pure tensor math.

Two exact implementations (`DECODE_ATTENTION`), both over the whole buffer with an additive mask
(0 for real keys, -inf for pads and empty slots, plus log(beta) on DySCO's selected keys):
- "sdpa" (the default): one fused SDPA call per layer over the grouped keys (`enable_gqa`: K and
  V are never repeated), the mask and bias in the model dtype, the way fused decoding kernels
  take them (in bf16, log 2 is 0.6914). The QRHeads' rows come from their own q.K, float32
  scores and a float32 softmax (`head_probabilities`);
- "float32": q.K per KV head with float32 scores, a float32 softmax over every head, then
  probabilities (in the model dtype) times V, split over key chunks so the long reduction runs
  in parallel; the QRHeads' rows are slices of those probabilities. It is the reference the
  parity tests and the benchmark compare with.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dysco_interp.decoding.choices import DECODE_ATTENTION
from dysco_interp.errors import ConfigError

GRANULE = 256  # buffer capacities are a multiple of this, so keys split into equal chunks


def check_decode_attention(kind: str) -> str:
    if kind not in DECODE_ATTENTION:
        raise ConfigError(f"decode_attention must be one of {', '.join(DECODE_ATTENTION)}, got {kind!r}")
    return kind


def bmm_float32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.is_cuda and a.dtype in (torch.bfloat16, torch.float16):
        return torch.bmm(a, b, out_dtype=torch.float32)
    return torch.bmm(a.float(), b.float())


def decode_probabilities(query, key, mask, scale: float, groups: int, window: int | None = None,
                         slot: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax attention of one query per head over the whole buffer, float32 `[B, heads, capacity]`.

    query `[B, heads, 1, d]`; key `[B, kv_heads, capacity, d]`; mask float32 `[B, 1, 1, capacity]`,
    or `[B, heads, 1, capacity]` where a bias applies to some heads only.
    """
    batch, n_heads, _, dim = query.shape
    n_kv, capacity = key.shape[1], key.shape[2]
    q = query.reshape(batch * n_kv, groups, dim)
    scores = bmm_float32(q, key.reshape(batch * n_kv, capacity, dim).transpose(1, 2))
    scores = scores.view(batch, n_heads, capacity) * scale + mask.reshape(batch, -1, capacity)
    if window is not None:  # keys at or before slot - window are out of a sliding layer's reach
        assert slot is not None
        old = torch.arange(capacity, device=key.device) <= slot.to(key.device) - window
        scores = scores.masked_fill(old, -torch.inf)
    return scores.softmax(dim=-1)


LONG_ROW = 16384  # keys from which a CUDA softmax row is split over many blocks


def reduced_softmax(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension, its max and sum reduced in two levels: over blocks of
    `key_chunk` keys (one thread block each), then over the blocks."""
    n = scores.shape[-1]
    chunk = key_chunk(n)
    blocks = scores.reshape(*scores.shape[:-1], n // chunk, chunk)
    peak = blocks.amax(dim=-1, keepdim=True).amax(dim=-2, keepdim=True)
    shifted = (blocks - peak).exp_()
    total = shifted.sum(dim=-1, keepdim=True).sum(dim=-2, keepdim=True)
    return shifted.div_(total).reshape(scores.shape)


def row_softmax(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension. On a GPU, PyTorch's softmax and its reductions over a
    whole row each give one row a thread block or a few (12 us for four rows of 100K keys on an
    H200, the QRHeads' rows at one query), leaving most of the card idle; the rows are cut into
    blocks first."""
    if scores.is_cuda and scores.shape[-1] >= LONG_ROW:
        return reduced_softmax(scores)
    return scores.softmax(dim=-1)


def key_chunk(capacity: int) -> int:
    for chunk in (2048, 1024, 512, GRANULE):
        if capacity % chunk == 0:
            return chunk
    return capacity


def probabilities_times_values(probs: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """`[B, heads, capacity]` weights times V `[B, kv_heads, capacity, d]` -> `[B, 1, heads, d]` (HF's layout)."""
    batch, n_heads, capacity = probs.shape
    n_kv, dim = value.shape[1], value.shape[3]
    groups, chunk = n_heads // n_kv, key_chunk(capacity)
    n_chunks = capacity // chunk
    p = probs.to(value.dtype).view(batch * n_kv, groups, n_chunks, chunk).transpose(1, 2)
    p = p.reshape(batch * n_kv * n_chunks, groups, chunk)
    parts = bmm_float32(p, value.reshape(batch * n_kv * n_chunks, chunk, dim))
    out = parts.view(batch, n_kv, n_chunks, groups, dim).sum(dim=2)
    return out.reshape(batch, 1, n_heads, dim).to(value.dtype)


def fused_decode(query, key, value, mask, scale: float, groups: int) -> torch.Tensor:
    """One query per head through SDPA over the whole buffer, the mask in the model dtype:
    `[B, 1, heads, d]` (HF's layout). Grouped-query attention stays grouped (`enable_gqa`): keys
    and values are never repeated per query head. Packing a KV head's query heads as the query
    rows instead takes ten times longer on an H100 (too few blocks for one query row each)."""
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask.to(query.dtype),
                                                           scale=scale, enable_gqa=groups > 1)
    return out.transpose(1, 2)


def head_probabilities(query, key, mask, scale: float, groups: int, heads: Sequence[int]) -> torch.Tensor:
    """The float32 softmax rows of the chosen query heads only, `[B, len(heads), capacity]`:
    one float32 q.K per KV head they belong to (a view of the buffer, never a copy)."""
    batch, _, _, dim = query.shape
    capacity = key.shape[2]
    by_group: dict[int, torch.Tensor] = {}
    rows = []
    for head in heads:
        kv = head // groups
        if kv not in by_group:
            q = query[:, kv * groups:(kv + 1) * groups, 0, :]  # [B, groups, d]
            group_mask = mask.reshape(batch, -1, capacity)
            if group_mask.shape[1] > 1:  # a bias on some heads only: each head its own mask row
                group_mask = group_mask[:, kv * groups:(kv + 1) * groups]
            scores = bmm_float32(q, key[:, kv].transpose(1, 2)) * scale + group_mask
            by_group[kv] = row_softmax(scores)
        rows.append(by_group[kv][:, head - kv * groups])
    return torch.stack(rows, dim=1)


def every_key_rows(query, key, mask, scale: float, groups: int, heads: Sequence[int], window: int | None = None,
                   slot: torch.Tensor | None = None) -> torch.Tensor:
    """The float32 rows of the query heads `heads` over the whole buffer, `[B, len(heads), capacity]`:
    a read in a layer that attends to kept keys only still covers every key (`plan.Keep`)."""
    if window is None:
        return head_probabilities(query, key, mask, scale, groups, heads)
    probs = decode_probabilities(query, key, mask, scale, groups, window, slot)
    return torch.stack([probs[:, head] for head in heads], dim=1)


def attend_one_query(query, key, value, mask, scale: float, groups: int, kind: str,
                     heads: Sequence[int] | None = None, window: int | None = None,
                     slot: torch.Tensor | None = None,
                     model_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One query per row over the whole buffers with the decoding attention `kind`: the output
    `[B, 1, heads, d]` and the float32 rows of the query heads `heads` (None: none read).

    `mask` is float32; `model_mask`, the same in the query's dtype, saves the fused path a cast.
    A sliding-window layer (`window`, with the token's `slot`) always takes the float32 path.
    """
    if kind == "sdpa" and window is None:
        rows = None if heads is None else head_probabilities(query, key, mask, scale, groups, heads)
        return fused_decode(query, key, value, mask if model_mask is None else model_mask, scale, groups), rows
    probs = decode_probabilities(query, key, mask, scale, groups, window, slot)
    # views, not an index tensor: a CUDA-graph capture cannot copy one to the device
    rows = None if heads is None else torch.stack([probs[:, head] for head in heads], dim=1)
    return probabilities_times_values(probs, value), rows


def gather_kept(key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Only the kept keys of a layer (`plan.Keep`): keys and values `[B, kv_heads, capacity, d]` at
    `positions` (long `[B, C]`, inside the buffers) -> `[B, kv_heads, C, d]`, and the float32 mask
    `[B, 1 or heads, 1, capacity]` at those positions plus `hidden` (float32 `[B, 1, 1, C]`: -inf at
    the slots that name no key, 0 elsewhere). Fixed shapes, no host sync: the attention over them
    is the attention over the whole buffers with -inf on every key not kept, up to the order of
    the float sums."""
    batch, n_kv, _, dim = key.shape
    width = positions.shape[-1]
    # an index per value: whole rows with index_select over the buffers' rows were no faster in
    # the 100K benchmark on an H200 (the static backend runs this compiled there)
    index = positions[:, None, :, None].expand(batch, n_kv, width, dim)
    kept_mask = mask.expand(batch, *mask.shape[1:]).gather(
        -1, positions[:, None, None, :].expand(batch, mask.shape[1], 1, width)) + hidden
    return key.gather(2, index), value.gather(2, index), kept_mask
