"""The random-heads ablation: attention mass a head set puts on the gold document, against
random head sets of the same size."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from dysco_interp.detection.examples import check_examples
from dysco_interp.detection.passes import HooksArg, example_query_attention
from dysco_interp.detection.scores import mean_over_examples
from dysco_interp.detection.selection import HeadsArg, qrscore_heads, requested_heads
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet, random_heads
from dysco_interp.hooks import Head, head_label, sliding_layers


def _heads_list(heads: HeadsArg, spec) -> list[Head]:
    mask = requested_heads(spec, heads)
    bad = [head_label(*h) for h in map(tuple, torch.nonzero(mask).tolist()) if h[0] in set(sliding_layers(spec))]
    if bad:
        raise ConfigError(
            f"heads {', '.join(bad)} are in sliding-window layers: their query-chunk attention is not on "
            "absolute positions, so gold-document mass is not defined for them"
        )
    return [tuple(h) for h in torch.nonzero(mask).tolist()]


def gold_mass_per_head(
    model,
    examples: Iterable[Any],
    heads: HeadsArg = None,
    *,
    progress: bool = False,
    hooks: HooksArg = None,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """[L, H] mean (over examples) attention mass on the gold document from the query span,
    uncalibrated and unfiltered; -1 for heads not computed (sliding layers, outside heads=)."""
    from dysco_interp.progress import tqdm

    examples = check_examples(examples)
    mask = qrscore_heads(model.spec, heads)
    per = []
    for ex in tqdm(examples, desc="gold-document mass", unit="ex", disable=not progress):
        real, _ = example_query_attention(model, ex, mask, hooks, chunk_size, null=False)
        start, end = ex.gold_token_span
        per.append(real[..., start:end].sum(dim=-1).double().cpu())
    return mean_over_examples(per, mask)


def gold_attention_mass(model, examples: Iterable[Any], heads: HeadsArg, **kwargs: Any) -> float:
    """Mean attention mass the heads put on the gold document from the query span
    (uncalibrated; one context prefill per example), averaged over heads and examples."""
    if heads is None:
        raise ConfigError("gold_attention_mass needs a head set (heads=None would mean every head)")
    chosen = _heads_list(heads, model.spec)
    masses = gold_mass_per_head(model, examples, chosen, **kwargs)
    idx = torch.tensor(chosen, dtype=torch.long)
    return float(masses[idx[:, 0], idx[:, 1]].double().mean())


def random_head_sets(model, size: int, n_draws: int = 5, seed: int = 0) -> list[HeadSet]:
    """n_draws seeded random head sets of `size` (seeds seed .. seed+n_draws-1), avoiding
    sliding-window layers; on full-attention models these are `random_like`'s draws."""
    spec = model.spec
    if n_draws < 1:
        raise ConfigError(f"n_draws must be >= 1, got {n_draws}")
    banned = [(layer, h) for layer in sliding_layers(spec) for h in range(spec.n_heads)]
    return [
        HeadSet(
            random_heads(size, spec.n_layers, spec.n_heads, seed + i, exclude=banned or None),
            model=spec.name, n_layers=spec.n_layers, n_heads=spec.n_heads, n_kv_heads=spec.n_kv_heads,
            method="random", data=f"uniform draw of {size} heads", seed=seed + i,
        )
        for i in range(n_draws)
    ]


def random_baseline(
    model, examples: Iterable[Any], headset: HeadSet | Sequence[Head], n_draws: int = 5, seed: int = 0, **kwargs: Any
) -> float:
    """Mean gold-document mass of n_draws seeded random head sets of the same size as headset.

    All heads are measured in one pass per example, then averaged per draw.
    """
    size = len(list(headset))
    masses = gold_mass_per_head(model, examples, None, **kwargs)
    values = []
    for hs in random_head_sets(model, size, n_draws, seed):
        idx = hs.as_tensor()
        values.append(float(masses[idx[:, 0], idx[:, 1]].double().mean()))
    return math.fsum(values) / len(values)
