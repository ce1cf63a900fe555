"""Split-half stability: the top-k heads of two disjoint halves of the examples, and their overlap."""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from dysco_interp.detection.api import detect
from dysco_interp.detection.methods import DEFAULT_TOP_K
from dysco_interp.detection.result import DetectionResult
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet
from dysco_interp.hooks import Head


@dataclass(frozen=True)
class HeadOverlap:
    count: int
    jaccard: float
    shared: tuple[Head, ...]  # in the first set's order
    size_a: int
    size_b: int


def head_overlap(a: HeadSet | Iterable[Head], b: HeadSet | Iterable[Head]) -> HeadOverlap:
    """Shared heads of two sets: count and Jaccard |A and B| / |A or B|."""
    la = [(layer, head) for layer, head in a]
    lb = [(layer, head) for layer, head in b]
    sb = set(lb)
    shared = tuple(h for h in la if h in sb)
    union = len(set(la) | sb)
    return HeadOverlap(len(shared), len(shared) / union if union else 0.0, shared, len(la), len(lb))


@dataclass(frozen=True)
class SplitHalf:
    first: HeadSet
    second: HeadSet
    overlap: HeadOverlap
    halves: tuple[tuple[str, ...], tuple[str, ...]]  # example ids of each half

    def as_dict(self) -> dict[str, Any]:
        return {
            "top_k": len(self.first),
            "overlap": self.overlap.count,
            "jaccard": round(self.overlap.jaccard, 6),
            "n_first": len(self.halves[0]),
            "n_second": len(self.halves[1]),
        }


def split_half(result: DetectionResult, top_k: int = DEFAULT_TOP_K, seed: int = 0) -> SplitHalf:
    """Top-k on two disjoint, seeded halves of the examples (no recomputation) and their overlap."""
    n = len(result.per_example)
    if n < 2:
        raise ConfigError(f"split-half stability needs at least 2 examples, got {n}")
    order = list(range(n))
    random.Random(seed).shuffle(order)
    a, b = sorted(order[: n // 2]), sorted(order[n // 2 :])
    ra, rb = result.subset(a), result.subset(b)
    ha, hb = ra.headset(top_k), rb.headset(top_k)
    return SplitHalf(ha, hb, head_overlap(ha, hb), (tuple(ra.example_ids), tuple(rb.example_ids)))


def split_half_stability(
    model, examples: Iterable[Any], *, top_k: int = DEFAULT_TOP_K, seed: int = 0, **kwargs: Any
) -> SplitHalf:
    """Run `detect` on all examples, then compare the top-k of two disjoint halves."""
    return split_half(detect(model, examples, seed=seed, **kwargs), top_k, seed)
