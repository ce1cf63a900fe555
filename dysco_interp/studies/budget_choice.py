"""Choosing DySCO's selection budget on the dev split (pure: records in, a choice out).

The rule, fixed before any run: each DySCO configuration (QRHeads; random heads are never
candidates) gets, in every dev cell (model, task, length), its paired teacher-forced gain over
vanilla on the task's primary metric (Path Traversal: step accuracy; MRCR: gold log-probability
per token); configurations are ranked per cell (best gain first, ties share their mean rank) and
the lowest mean rank over the cells wins; a tie goes to the smaller boost (beta), then to fewer
keys. Ranks, not raw gains, so that no one metric's scale decides. Free generation on the dev
split is reported beside the choice, not used for it: at these lengths its scores sit near the
floor and cannot separate configurations.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import TypeVar

from dysco_interp.analysis.method_key import MethodKey, method_key
from dysco_interp.errors import ConfigError
from dysco_interp.tasks.registry import TASKS

Candidate = TypeVar("Candidate", bound=Hashable)
SELECTION = ("beta", "top_p", "top_k", "top_k_fraction")

Cell = tuple[str, str, int]


def cell_of(record: Mapping) -> Cell:
    return str(record["model"]), str(record["task"]), int(record["length"])


def primary_metrics(forced: bool) -> dict[str, str]:
    """Each registered task's primary metric (its spec's `metrics`), teacher-forced or free."""
    return {name: spec.metrics.primary_forced if forced else spec.metrics.primary for name, spec in TASKS.items()}


def paired_gains(records: Iterable[Mapping], primary: Mapping[str, str]) -> dict[MethodKey, dict[Cell, float]]:
    """Per run key (any method but vanilla) and cell: the mean over instances of (run - vanilla) on the
    cell task's primary metric, paired by instance."""
    by_cell: dict[Cell, dict[MethodKey, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for r in records:
        metric = primary.get(str(r["task"]))
        if metric is not None and r.get(metric) is not None:
            by_cell[cell_of(r)][method_key(r)][str(r["instance"])] = float(r[metric])
    gains: dict[MethodKey, dict[Cell, float]] = defaultdict(dict)
    for cell, by_key in by_cell.items():
        vanilla = by_key.get(MethodKey("vanilla"), {})
        for key, values in by_key.items():
            pairs = [(v, vanilla[i]) for i, v in values.items() if i in vanilla]
            if key.method != "vanilla" and pairs:
                gains[key][cell] = sum(a - b for a, b in pairs) / len(pairs)
    return dict(gains)


def mean_ranks(values: Mapping[Candidate, float]) -> dict[Candidate, float]:
    """1 for the largest value; ties share their mean rank."""
    ordered = sorted(values, key=lambda k: -values[k])
    ranks: dict[Candidate, float] = {}
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and values[ordered[j + 1]] == values[ordered[i]]:
            j += 1
        for k in ordered[i : j + 1]:
            ranks[k] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def mean_ranks_over_cells(gains: Mapping[Candidate, Mapping[Cell, float]]) -> tuple[list[Cell], dict[Candidate, float]]:
    """The cells any candidate was run on, and each candidate run on all of them with its mean
    over those cells of its rank there (`mean_ranks`); candidates missing a cell are left out."""
    cells = sorted({c for g in gains.values() for c in g})
    complete = [k for k, g in gains.items() if all(c in g for c in cells)]
    per_cell = {c: mean_ranks({k: gains[k][c] for k in complete}) for c in cells}
    return cells, {k: sum(per_cell[c][k] for c in cells) / len(cells) for k in complete}


def selection_fields(key: MethodKey) -> dict:
    params = key.params_dict()
    fields = {name: params[name] for name in SELECTION}
    fields["top_k_fraction"] = fields["top_k_fraction"] or None  # the key spells "none" as 0
    return fields


def selection_size(key: MethodKey) -> tuple:
    fields = selection_fields(key)
    return fields["beta"], fields["top_k_fraction"] or 0.0, fields["top_k"], fields["top_p"]


def ranking(tf_records: Iterable[Mapping]) -> list[dict]:
    """Every DySCO (QRHeads) configuration with its mean rank over the dev cells, best first."""
    gains = {k: g for k, g in paired_gains(tf_records, primary_metrics(forced=True)).items() if k.method == "dysco"}
    cells, rank = mean_ranks_over_cells(gains)
    if not rank:
        raise ConfigError("no DySCO configuration was run with vanilla on every dev cell; run the dev sweep first")
    order = sorted(rank, key=lambda k: (rank[k], selection_size(k)))
    return [{"config": selection_fields(k), "label": k.label, "mean_rank": rank[k],
             "gains": {"/".join(map(str, c)): round(gains[k][c], 5) for c in cells}} for k in order]


def shortlist(tf_records: Iterable[Mapping], n: int) -> list[dict]:
    """The selection fields of the `n` best-ranked configurations."""
    return [row["config"] for row in ranking(tf_records)[:n]]


def choose_config(tf_records: Sequence[Mapping], free_records: Sequence[Mapping] = ()) -> dict:
    """The dev split's choice: {config, rule, ranking (top 10), best share-of-prompt and best
    fixed-K configurations, free-generation gains of the configurations run freely}."""
    rows = ranking(tf_records)
    fraction = next((r for r in rows if r["config"]["top_k_fraction"] is not None), None)
    fixed = next((r for r in rows if r["config"]["top_k_fraction"] is None), None)
    free = paired_gains(free_records, primary_metrics(forced=False))
    return {
        "config": rows[0]["config"],
        "rule": "lowest mean rank of the teacher-forced gain over vanilla across the dev cells "
                "(ties: smaller beta, then fewer keys)",
        "n_candidates": len(rows),
        "ranking": rows[:10],
        "best_fixed_k": fixed,
        "best_fraction": fraction,
        "free_gains": [{"label": k.label, "config": selection_fields(k) if k.method == "dysco" else None,
                        "gains": {"/".join(map(str, c)): round(g, 5) for c, g in sorted(cells.items())}}
                       for k, cells in sorted(free.items())],
    }
