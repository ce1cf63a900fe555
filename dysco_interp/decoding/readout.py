"""What a pass's reads give back (`plan.ReadOut`): pure tensor math over the per-layer rows a backend collected."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dysco_interp.decoding import relevance
from dysco_interp.decoding.plan import PassPlan, ReadOut

__all__ = ["ReadOut", "read_outs", "span_sums"]  # ReadOut is defined beside the Read it answers


def span_sums(rows: torch.Tensor, spans: Sequence[tuple[int, int]]) -> torch.Tensor:
    """Sum of `rows[..., start:end]` for every half-open span: `[..., n_spans]`, float32."""
    if not spans:
        raise ValueError("no spans to sum over")
    bounds = torch.tensor(spans, dtype=torch.long, device=rows.device)
    if bounds.min() < 0 or bounds[:, 1].max() > rows.shape[-1] or (bounds[:, 1] <= bounds[:, 0]).any():
        raise ValueError(f"spans must be non-empty and inside the {rows.shape[-1]} keys")
    cum = torch.nn.functional.pad(rows.float().cumsum(-1), (1, 0))
    return cum[..., bounds[:, 1]] - cum[..., bounds[:, 0]]


def _placed(row: torch.Tensor, n_keys: int, left: bool) -> torch.Tensor:
    """`[B, h, k]` rows on absolute positions `[B, h, n_keys]`: a buffer's rows start at key 0
    (`left`) and are cut; a cache's rows end at the last key (sliding layers see only the tail)."""
    if left:
        return row[..., :n_keys]
    return torch.nn.functional.pad(row, (n_keys - row.shape[-1], 0))


def read_outs(plan: PassPlan, rows: dict[int, torch.Tensor], n_keys: int, device: torch.device,
              left: bool = False, first_only: bool = False) -> tuple[ReadOut, ...]:
    """Each read of `plan` (or its first only) from `rows`: layer -> float32 `[B, h_l, k_l]`, the
    rows of `plan.read_heads()[layer]` in that order. `left`: rows start at key 0 (fixed buffers);
    otherwise they end at key `n_keys - 1`."""
    union = plan.read_heads()
    out = []
    for read in plan.reads[:1] if first_only else plan.reads:
        per_layer = []
        for layer, heads in read.by_layer().items():
            index = [union[layer].index(h) for h in heads]
            per_layer.append(rows[layer][:, index] if index != list(range(len(union[layer]))) else rows[layer])
        offsets = [0] * len(per_layer) if left else None
        attention = relevance.aggregate_heads(per_layer, n_keys if not left else max(r.shape[-1] for r in per_layer),
                                              offsets=offsets, device=device)[:, :n_keys]
        result = ReadOut(read, attention)
        if read.returns != "mean":
            every = torch.cat([_placed(r.to(device), n_keys, left) for r in per_layer], dim=1)
            if read.returns == "rows":
                result.rows = every
            else:  # a span past the keys seen so far holds nothing yet
                reach = max(n_keys, max(e for _, e in read.spans))
                result.span_mass = span_sums(torch.nn.functional.pad(every, (0, reach - n_keys)), read.spans)
        out.append(result)
    return tuple(out)
