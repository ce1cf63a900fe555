"""Which heads a detection scores: the `heads=` argument as a bool `[n_layers, n_heads]` mask.

QRScore skips sliding-window layers (Gemma-3): when a query *chunk* runs on a cache, their
key axis is the window, not the absolute context, and they cannot see most documents of
a long prompt anyway. The copy-paste score reads one query row per step, whose window is
right-aligned to the absolute length, so it scores every layer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet
from dysco_interp.hooks import Head, head_label, head_out_of_range, sliding_layers

HeadsArg = Sequence[Head] | Mapping[int, Sequence[int]] | HeadSet | None


def requested_heads(spec, heads: HeadsArg) -> torch.Tensor:
    """Bool [L, H] of the heads to score; `heads` as in TL's detect_head: None (all),
    [(layer, head), ...], {layer: [heads]}, or a HeadSet."""
    mask = torch.zeros(spec.n_layers, spec.n_heads, dtype=torch.bool)
    pairs: list[tuple[int, ...]]  # checked to be pairs below
    if heads is None:
        return mask.fill_(True)
    if isinstance(heads, HeadSet):
        heads.validate_for(spec)
        pairs = list(heads.heads)
    elif isinstance(heads, Mapping):
        pairs = [(layer, h) for layer, hs in heads.items() for h in hs]
    else:
        pairs = [tuple(p) for p in heads]
    if not pairs:
        raise ConfigError("heads= is empty: pass None to score every head")
    for pair in pairs:
        if len(pair) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair):
            raise ConfigError(f"a head must be a (layer, head) pair of ints, got {pair!r}")
        layer, head = pair
        if head_out_of_range((layer, head), spec.n_layers, spec.n_heads):
            raise ConfigError(
                f"head {head_label(layer, head)} is outside the model ({spec.n_layers} layers x {spec.n_heads} heads)"
            )
        mask[layer, head] = True
    return mask


def qrscore_heads(spec, heads: HeadsArg) -> torch.Tensor:
    """Requested heads minus those of sliding-window layers (see the module docstring)."""
    mask = requested_heads(spec, heads)
    mask[sliding_layers(spec)] = False
    if not mask.any():
        raise ConfigError("no head left to score: every requested head is in a sliding-window layer")
    return mask
