"""A plan's `Scale` as the SDPA-style backends apply it: pure tensor math.

Scores are `scale * q.k`. A temperature on whole layers divides the softmax scale itself, so it
is as exact as the model's own 1/sqrt(d) (and UniAttnS keeps the tokens it had when the backends
took a `tau`). Anything finer, a temperature on some heads or log-n growth that differs per row
and per query position, multiplies the query instead: `(f q).k = f (q.k)`.
"""

from __future__ import annotations

import torch

from dysco_interp.decoding.plan import Scale, logn_factor


def query_scaling(scale: Scale, chosen: torch.Tensor | None,
                  logn: torch.Tensor | None) -> tuple[float, torch.Tensor | None]:
    """For a layer `scale` applies to: (the divisor of the softmax scale, a float32 factor on the
    query, broadcastable to `[B, heads, s, d]`, or None). `chosen`: bool `[1, heads, 1, 1]` of the
    heads it touches (`backends.base.head_masks`; None: all); `logn`: the log-n factor of each
    row's queries, `[B, 1, s, 1]` (None without log-n)."""
    if chosen is None:
        return scale.temperature, logn
    per_head = torch.where(chosen, 1.0 / scale.temperature, 1.0)
    return 1.0, per_head if logn is None else per_head * torch.where(chosen, logn, 1.0)


def logn_of(scale: Scale | None, key_counts: torch.Tensor) -> torch.Tensor | None:
    """The log-n factor `[B, 1, s, 1]` of queries that see `key_counts` `[B, s]` keys (None: no
    log-n in `scale`)."""
    if scale is None or scale.log_n is None:
        return None
    return logn_factor(key_counts, scale.log_n)[:, None, :, None]


def scaled(query: torch.Tensor, softmax_scale: float, scale: Scale | None, layer: int,
           chosen: torch.Tensor | None, logn: torch.Tensor | None) -> tuple[torch.Tensor, float]:
    """The query and softmax scale of `layer` under `scale` (unchanged where it does not apply)."""
    if scale is None or layer not in scale.layers:
        return query, softmax_scale
    divisor, factor = query_scaling(scale, chosen, logn)
    if factor is not None:
        query = query * factor.to(device=query.device, dtype=query.dtype)
    return query, softmax_scale / divisor
