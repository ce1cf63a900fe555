"""Seeded random head sets: the random-heads ablation's control."""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

from dysco_interp.errors import ConfigError
from dysco_interp.heads.headset import HeadSet, geometry_of
from dysco_interp.heads.values import head_pair, nonneg_int, positive_int
from dysco_interp.hooks import Head


def random_heads(
    n: int, n_layers: int, n_heads: int, seed: int, exclude: Iterable[Head] | None = None
) -> list[Head]:
    """n distinct (layer, head) drawn uniformly with `seed` (same seed, same heads), minus `exclude`."""
    n = positive_int(n, "n")
    n_layers, n_heads = positive_int(n_layers, "n_layers"), positive_int(n_heads, "n_heads")
    seed = nonneg_int(seed, "seed")
    banned = {head_pair(h, "excluded head") for h in (exclude or ())}
    pool = [(layer, head) for layer in range(n_layers) for head in range(n_heads) if (layer, head) not in banned]
    if n > len(pool):
        raise ConfigError(f"cannot draw {n} distinct heads from {len(pool)} available ({n_layers} x {n_heads})")
    # random.Random(seed).sample is stable across Python versions for int seeds.
    return random.Random(seed).sample(pool, n)


def random_like(
    headset: HeadSet, spec_or_geometry: Any = None, seed: int = 0, exclude_original: bool = False
) -> HeadSet:
    """A seeded random head set of the same size (the random-heads ablation).

    Geometry comes from `spec_or_geometry` or, if omitted, from the head set itself.
    `exclude_original` draws only heads outside `headset`.
    """
    geo = geometry_of(spec_or_geometry if spec_or_geometry is not None else headset)
    heads = random_heads(
        len(headset), geo.n_layers, geo.n_heads, seed, exclude=headset.heads if exclude_original else None
    )
    return HeadSet(
        heads,
        model=geo.name if geo.name is not None else headset.model,
        n_layers=geo.n_layers,
        n_heads=geo.n_heads,
        n_kv_heads=geo.n_kv_heads,
        method="random",
        data=f"uniform draw of {len(headset)} heads, size of a {headset.method} set",
        seed=seed,
        extra={"like_method": headset.method, "exclude_original": exclude_original},
    )
