"""DySCO's relevance math on plain tensors: aggregate, momentum, selection, bias.

No model and no hooks here; every function takes and returns batched tensors
(`[B, ...]`, float32 for relevance) so it can be tested by hand.

Key positions are absolute: position j is the j-th token of the sequence (prompt
then generated tokens), and the current token's key is the last one, `n_keys - 1`.
An attention row read at one layer may cover fewer keys than that (a sliding-window
layer sees only its window at decode time); for the LAST query row the visible keys
are always the last ones of the sequence, so a row of width k covers absolute
positions `[n_keys - k, n_keys)` ("right-aligned") unless an explicit offset says
otherwise. Positions a row does not cover get attention 0 from that row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from dysco_interp.errors import ConfigError

# --------------------------------------------------------------------------- aggregate


def aggregate_heads(
    rows: Sequence[torch.Tensor], n_keys: int, offsets: Sequence[int] | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Mean attention row over heads, on absolute key positions: float32 `[B, n_keys]`.

    Args:
        rows: one tensor per layer, `[B, h_l, k_l]`: the last query row of the chosen
            heads of that layer (each row a softmax over the keys it sees, so it sums to 1).
            Layers of a model split over devices give rows on different devices.
        n_keys: absolute number of keys (cached + current token).
        offsets: absolute position of each row's first key; default `n_keys - k_l`
            (right-aligned, see the module docstring).
        device: where the mean goes (None: the first row's device).

    The mean is over all heads together (sum of every row / total number of heads),
    so a layer with two chosen heads weighs twice a layer with one, as in `mean_h a_h`.
    """
    if not rows:
        raise ValueError("aggregate_heads needs at least one layer of attention rows")
    if offsets is None:
        offsets = [n_keys - r.shape[-1] for r in rows]
    if len(offsets) != len(rows):
        raise ValueError(f"{len(offsets)} offsets for {len(rows)} layers of rows")
    batch = rows[0].shape[0]
    out = torch.zeros(batch, n_keys, dtype=torch.float32, device=rows[0].device if device is None else device)
    n_heads = 0
    for row, off in zip(rows, offsets):
        if row.ndim != 3 or row.shape[0] != batch:
            raise ValueError(f"expected rows of shape [{batch}, heads, keys], got {tuple(row.shape)}")
        width = row.shape[-1]
        if off < 0 or off + width > n_keys:
            raise ValueError(
                f"a row of {width} keys at offset {off} does not fit in {n_keys} absolute keys"
            )
        # float32 before summing: bf16 rows would lose the small weights DySCO ranks.
        out[:, off : off + width] += row.float().sum(dim=1).to(out.device)
        n_heads += row.shape[1]
    return out / n_heads


# --------------------------------------------------------------------------- momentum


def history_weight(decay: float) -> float:
    """gamma = d / (1 + d): the weight of the previous relevance in the update (0.75 -> 3/7)."""
    check_decay(decay)
    return decay / (1.0 + decay)


def check_decay(decay: float) -> float:
    if isinstance(decay, bool) or not (isinstance(decay, (int, float)) and math.isfinite(decay) and decay >= 0):
        raise ConfigError(f"decay must be a finite number >= 0, got {decay!r}")
    return float(decay)


def update_relevance(attention: torch.Tensor, previous: torch.Tensor | None, decay: float) -> torch.Tensor:
    """Momentum update `r = (a + d * r_prev) / (1 + d)`, float32 `[B, n_keys]`.

    `previous` covers the keys of the last update (`[B, m]`, m <= n_keys) and is padded
    with 0 for the new key(s). Equivalently r = (1 - gamma) a + gamma r_prev with
    gamma = d / (1 + d) (`history_weight`). If both inputs sum to 1 so does r.

    Warm-up initialisation: at the very first update there is no history
    (`previous is None`) and r = a, so r sums to 1 from the start (no decay toward a
    zero prior).
    """
    decay = check_decay(decay)
    a = attention.float()
    if previous is None:
        return a.clone()
    prev = previous.float()
    if prev.ndim != a.ndim or prev.shape[:-1] != a.shape[:-1] or prev.shape[-1] > a.shape[-1]:
        raise ValueError(
            f"previous relevance {tuple(prev.shape)} does not fit attention {tuple(a.shape)}: "
            "same batch, and no more keys than now"
        )
    prev = torch.nn.functional.pad(prev, (0, a.shape[-1] - prev.shape[-1]))
    return (a + decay * prev) / (1.0 + decay)


# --------------------------------------------------------------------------- selection


@dataclass(frozen=True)
class Selection:
    """Selected keys per batch row.

    mask: bool `[B, n_keys]`, True at selected (and not excluded) positions.
    count: long `[B]`, number of selected positions.
    mass: float32 `[B]`, relevance mass of the selected positions (after exclusion).
    """

    mask: torch.Tensor
    count: torch.Tensor
    mass: torch.Tensor


def check_selection_params(top_p: float, top_k: int, names: tuple[str, str] = ("top_p", "top_k")) -> None:
    """`names`: how the caller's errors name the two (a method's Params say select_p, select_k)."""
    if isinstance(top_p, bool) or not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
        raise ConfigError(f"{names[0]} must be in (0, 1], got {top_p!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ConfigError(f"{names[1]} must be an integer >= 1, got {top_k!r}")


def check_top_k_fraction(fraction: float | None, name: str = "top_k_fraction") -> None:
    if fraction is None:
        return
    if isinstance(fraction, bool) or not (isinstance(fraction, (int, float)) and 0 < fraction <= 1):
        raise ConfigError(f"{name} must be in (0, 1] or None, got {fraction!r}")


def row_caps(n_context: Sequence[int], top_k: int, fraction: float) -> torch.Tensor:
    """Each row's key cap when it scales with the prompt: min(top_k, ceil(fraction * n)), at least 1.

    A fixed K chosen at 128K tokens is ~3% of that context but never binds at 1K-8K; a
    fraction keeps the selection's share of the context the same at every length.
    """
    check_top_k_fraction(fraction)
    caps = [min(top_k, max(1, math.ceil(round(fraction * n, 9)))) for n in n_context]  # 0.1 * 30 is 3.0000000000000004
    return torch.tensor(caps, dtype=torch.long)


def select_keys(
    relevance: torch.Tensor, top_p: float, top_k: int | torch.Tensor, exclude: torch.Tensor | None = None
) -> Selection:
    """DySCO's nucleus selection of keys by relevance, per batch row, vectorised.

    1. Sort r descending. Ties keep position order (stable sort): among equal
       relevances the earlier position ranks first, so results are deterministic.
    2. Keep the prefix whose cumulative mass is <= top_p (in float32), and always the
       first (most relevant) key. top_p = 1 keeps every key (no round-off cut).
    3. If that prefix holds more than top_k keys, keep the first top_k (`top_k` an int, or
       a long tensor `[B]` with each row's own cap, as `top_k_fraction` gives).
    4. Drop excluded positions (`exclude`, bool `[B, n_keys]` or `[n_keys]`, True =
       chat-template token). Exclusion comes last, so template tokens still use up
       mass and the top_k budget, as in the spec; a row may end with 0 keys.
    """
    if isinstance(top_k, torch.Tensor):
        check_selection_params(top_p, 1)
        if top_k.shape != relevance.shape[:1] or bool((top_k < 1).any()):
            raise ValueError(f"per-row top_k must be [batch] integers >= 1, got {top_k.tolist()}")
    else:
        check_selection_params(top_p, top_k)
    if relevance.ndim != 2:
        raise ValueError(f"relevance must be [batch, n_keys], got {tuple(relevance.shape)}")
    r = relevance.float()
    n_keys = r.shape[-1]
    ordered, order = torch.sort(r, dim=-1, descending=True, stable=True)
    if top_p >= 1:
        keep = torch.ones_like(ordered, dtype=torch.bool)
    else:
        # Values are >= 0, so the cumulative sum is non-decreasing and this is a prefix.
        keep = ordered.cumsum(dim=-1) <= torch.tensor(top_p, dtype=torch.float32)
        keep[:, 0] = True
    if isinstance(top_k, torch.Tensor):
        keep &= torch.arange(n_keys, device=keep.device)[None, :] < top_k.to(keep.device)[:, None]
    elif top_k < n_keys:
        keep[:, top_k:] = False
    mask = torch.zeros_like(keep).scatter(-1, order, keep)
    if exclude is not None:
        exclude = exclude.to(device=mask.device, dtype=torch.bool)
        if exclude.shape[-1] != n_keys:
            raise ValueError(f"exclude covers {exclude.shape[-1]} positions, relevance {n_keys}")
        mask &= ~exclude
    return Selection(mask, mask.sum(dim=-1), (r * mask).sum(dim=-1))


# --------------------------------------------------------------------------- bias


def check_beta(beta: float) -> float:
    if isinstance(beta, bool) or not (isinstance(beta, (int, float)) and math.isfinite(beta) and beta > 0):
        raise ConfigError(f"strength beta must be a finite number > 0, got {beta!r}")
    return float(beta)


def scaling_bias(selected: torch.Tensor, beta: float, boost_current: bool = True) -> torch.Tensor:
    """The additive pre-softmax bias: log(beta) on selected keys, 0 elsewhere.

    Args:
        selected: bool `[B, n_keys]` on absolute positions; the last position is the
            current token's own key, boosted too when `boost_current` (DySCO always does).
        beta: the strength (> 0).
        boost_current: whether the current token's own key gets log(beta) too.

    Returns float32 `[B, 1, 1, n_keys]`, broadcastable over heads and query rows of
    attention scores `[B, heads, q, n_keys]`. Adding it multiplies the selected keys'
    unnormalised weights by beta: softmax(a + bias).
    """
    beta = check_beta(beta)
    if selected.ndim != 2:
        raise ValueError(f"selected must be a bool [batch, n_keys] mask, got {tuple(selected.shape)}")
    boosted = selected.to(torch.bool).clone()
    if boost_current:
        boosted[:, -1] = True
    bias = boosted.to(torch.float32) * math.log(beta)
    return bias[:, None, None, :]


def window_slice(bias: torch.Tensor, n_visible: int) -> torch.Tensor:
    """The part of an absolute-position bias that a layer seeing its last n_visible keys needs."""
    n_keys = bias.shape[-1]
    if n_visible > n_keys:
        raise ValueError(f"a layer sees {n_visible} keys but the bias covers only {n_keys}")
    return bias[..., n_keys - n_visible :]
