"""Detect a model's QRHeads and check them before they ship: held-out gold-document mass of the
QRHeads against random heads, split-half stability, overlap with copy-paste heads, and where the
heads sit. `analyses/ship_heads.py` writes the head file and this report."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import torch

from dysco_interp.detection.ablation import gold_mass_per_head, random_head_sets
from dysco_interp.detection.api import copy_paste_score, qrscore
from dysco_interp.detection.result import matrix_from_json
from dysco_interp.detection.stability import head_overlap, split_half
from dysco_interp.heads import HeadSet
from dysco_interp.hooks import Head

N_RANDOM_DRAWS = 5


def mean_mass(per_head: torch.Tensor, heads: Sequence[Head]) -> float:
    """Mean of a `[n_layers, n_heads]` tensor over the given heads."""
    idx = torch.tensor(list(heads), dtype=torch.long)
    return float(per_head[idx[:, 0], idx[:, 1]].double().mean())


def layer_placement(heads: Sequence[Head], n_layers: int) -> dict[str, Any]:
    """Histogram of the heads' layers and their relative depth (layer + 0.5) / n_layers."""
    layers = [layer for layer, _ in heads]
    depth = [(layer + 0.5) / n_layers for layer in layers]
    return {
        "histogram": {str(layer): layers.count(layer) for layer in sorted(set(layers))},
        "relative_depth_mean": round(sum(depth) / len(depth), 3),
        "relative_depth_range": [round(min(depth), 3), round(max(depth), 3)],
    }


def detect_and_check(model, data: Sequence[Any], heldout: Sequence[Any], *, top_k: int, seed: int,
                     store: str | os.PathLike, command: str, length: int | None = None
                     ) -> tuple[HeadSet, dict[str, Any]]:
    """QRScore heads of `data` and their report (without the model, file and command fields).

    Args:
        model: the loaded model.
        data: detection examples (needle QA).
        heldout: examples made with another seed, for the gold-mass check.
        top_k: heads to keep.
        seed: the detection seed (split halves and random draws follow it).
        store: a folder for the resumable per-example records.
        command: the command line the head file records.
        length: the examples' target length, for the report.

    Returns:
        (the QRHeads, the report).
    """
    t0 = time.perf_counter()
    qr = qrscore(model, data, store=store, seed=seed)
    heads = qr.headset(top_k, command=command)
    copy = copy_paste_score(model, data, store=store, seed=seed)
    copy_heads = copy.headset(top_k)
    halves = split_half(qr, top_k, seed=seed)
    detect_s = time.perf_counter() - t0

    per_head = gold_mass_per_head(model, heldout, progress=True)
    qr_mass = mean_mass(per_head, list(heads))
    draws = [mean_mass(per_head, list(rand))
             for rand in random_head_sets(model, len(heads), n_draws=N_RANDOM_DRAWS, seed=seed)]
    random_mass = sum(draws) / len(draws)
    spec = model.spec
    report = {
        "geometry": [spec.n_layers, spec.n_heads, spec.n_kv_heads],
        "detection": {"n": len(data), "length": length, "seed": seed, "seconds": round(detect_s, 1),
                      "tokens": [min(x.n_tokens for x in data), max(x.n_tokens for x in data)]},
        "heads": heads.labels(),
        "scores": [round(s, 5) for s in heads.scores or ()],
        "heldout": {
            "n": len(heldout), "seed": heldout[0].seed,
            "qrheads_gold_mass": round(qr_mass, 5),
            f"random_gold_mass_mean_of_{N_RANDOM_DRAWS}": round(random_mass, 5),
            "random_draws": [round(x, 5) for x in draws],
            "ratio": round(qr_mass / random_mass, 3) if random_mass > 0 else None,
            "best_single_head_gold_mass": round(float(per_head.max()), 5),
        },
        "split_half": halves.as_dict(),
        "copy_paste": {"heads": copy_heads.labels(), "overlap_with_qrscore": head_overlap(heads, copy_heads).count,
                       "n_heads_with_hits": int((copy.scores > 0).sum())},
        "layers": layer_placement(list(heads), spec.n_layers),
    }
    return heads, report


def score_matrix(heads: HeadSet) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores, scored) `[n_layers, n_heads]` from the score matrix a detected head set carries."""
    rows = heads.extra["score_matrix"]
    scored = torch.tensor([[v is not None for v in row] for row in rows])
    return matrix_from_json(rows).float().masked_fill(~scored, -1.0), scored


__all__ = ["detect_and_check", "layer_placement", "mean_mass", "score_matrix"]
