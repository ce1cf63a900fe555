"""One selection rule from 2K to 128K, chosen on the dev split (pure: records in, a choice out).

The rule, fixed before any test run: the budget study's (`budget_choice.ranking`) over every dev
cell at hand, short and long alike: each DySCO configuration (QRHeads) gets its paired
teacher-forced gain over vanilla in every (model, task, length) cell, is ranked per cell, and the
lowest mean rank over the cells wins (ties: smaller beta, then fewer keys). Only configurations
run in every cell compete. Beside it, for the report and never for the choice of the test
configuration: the best configuration of the other kind (a share of the prompt against a fixed
K), and the winner at each length among everything run there (the paper's long-context setting
and the quick check were run only at the long cells).

UniAttnS's temperature: the tau with the largest mean paired gain on the MRCR-style dev cells
(ties: the tau nearest 1, the gentler change).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from dysco_interp.errors import ConfigError
from dysco_interp.studies.budget_choice import (
    cell_of,
    mean_ranks,
    paired_gains,
    primary_metrics,
    ranking,
    selection_fields,
    selection_size,
)


def winners_by_length(tf_records: Sequence[Mapping]) -> dict[int, dict]:
    """Per length: the DySCO configuration with the lowest mean rank over that length's cells,
    among every one run in all of them, with its mean gain per cell."""
    gains = {k: g for k, g in paired_gains(tf_records, primary_metrics(forced=True)).items() if k.method == "dysco"}
    out: dict[int, dict] = {}
    for length in sorted({c[2] for g in gains.values() for c in g}):
        cells = sorted({c for g in gains.values() for c in g if c[2] == length})
        complete = {k: g for k, g in gains.items() if all(c in g for c in cells)}
        if not complete:
            continue
        per_cell = {c: mean_ranks({k: g[c] for k, g in complete.items()}) for c in cells}
        mean_rank = {k: sum(per_cell[c][k] for c in cells) / len(cells) for k in complete}
        best = min(complete, key=lambda k: (mean_rank[k], selection_size(k)))
        out[length] = {"config": selection_fields(best), "label": best.label, "mean_rank": mean_rank[best],
                       "n_candidates": len(complete),
                       "gains": {"/".join(map(str, c)): round(complete[best][c], 5) for c in cells}}
    return out


def choose_rule(tf_records: Sequence[Mapping]) -> dict:
    """{config (the choice), rule, cells, ranking (top 10), other_kind (the best of the other kind),
    by_length (each length's winner)}."""
    rows = ranking(tf_records)
    chosen = rows[0]
    kind = chosen["config"]["top_k_fraction"] is None
    other = next((r for r in rows if (r["config"]["top_k_fraction"] is None) != kind), None)
    cells = sorted({cell_of(r) for r in tf_records})
    return {
        "config": chosen["config"],
        "rule": "lowest mean rank of the teacher-forced gain over vanilla across every dev cell, 2K-128K "
                "(ties: smaller beta, then fewer keys)",
        "cells": ["/".join(map(str, c)) for c in cells],
        "n_candidates": len(rows),
        "ranking": rows[:10],
        "other_kind": other["config"] if other else None,
        "by_length": {str(k): v for k, v in winners_by_length(tf_records).items()},
    }


def best_tau(records: Sequence[Mapping]) -> float:
    """UniAttnS's tau with the largest mean paired gain over vanilla on the MRCR-style cells."""
    gains = paired_gains([r for r in records if r.get("task") == "mrcr"], primary_metrics(forced=True))
    by_tau: dict[float, list[float]] = defaultdict(list)
    for key, cells in gains.items():
        if key.method == "uniattns":
            by_tau[float(key.value("tau"))].extend(cells.values())
    if not by_tau:
        raise ConfigError("no UniAttnS run with vanilla on the MRCR-style dev split; run the tau part first")
    return max(by_tau, key=lambda t: (sum(by_tau[t]) / len(by_tau[t]), -abs(1 - t)))
