"""Where a gold item ranks among scored items, with one tie convention for the whole package.

Ties count against the gold item: its rank is the number of items scoring at least as much
as it does (itself included). A head that attends to every document or edge equally thus
ranks the gold one last, not first, and a degenerate reader earns nothing. QRScore's NDCG,
the motivation study's "gold edge in the top 5%" and the first-error analysis all use it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def gold_rank(scores: torch.Tensor, gold_index: int | torch.Tensor) -> torch.Tensor:
    """1-based rank of the gold item by descending score along the last axis, ties against it.

    `scores` `[..., n_items]`; `gold_index` one index for every row, or a long tensor of the
    leading shape (one per row). Returns a long tensor of the leading shape.
    """
    if isinstance(gold_index, torch.Tensor):
        gold = scores.gather(-1, gold_index.to(scores.device).long().unsqueeze(-1))
    else:
        gold = scores[..., gold_index : gold_index + 1]
    return (scores >= gold).sum(dim=-1)


def gold_rank_of(values: Sequence[float], gold_index: int) -> int:
    """`gold_rank` of a plain sequence of numbers."""
    return int(gold_rank(torch.as_tensor(list(values), dtype=torch.float64), gold_index))


def top_fraction_size(n_items: int, fraction: float) -> int:
    """How many items the top `fraction` holds: at least one, rounded up."""
    return max(1, math.ceil(fraction * n_items))


def in_top_fraction(scores: torch.Tensor, gold_index: int | torch.Tensor, fraction: float) -> torch.Tensor:
    """Whether the gold item's rank (ties against it) is within the top `fraction` of items."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    return gold_rank(scores, gold_index) <= top_fraction_size(scores.shape[-1], fraction)
