"""The head-ablation study's records summed up: drops against no ablation, with paired CIs.

Numpy only (no torch), so figures can be drawn where the model stack is absent;
`head_ablation` computes the records. A record is one (instance, head set) pass; head set
"none" is the unablated pass. For each metric, an instance's drop is its unablated value
minus its ablated value (positive: ablation hurts), so the interval is a paired one: a
percentile bootstrap over instances of the per-instance drops. Head sets named
"<group>#<k>" (the random draws "random#0" ...) are also pooled: per instance, the mean drop
over the group's members, then the bootstrap over instances; each member keeps its own row.
Contrasts give every other group's drop minus the random groups' (paired, per instance).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from dysco_interp.analysis.bootstrap import bootstrap_ci
from dysco_interp.analysis.margins import margin_of
from dysco_interp.analysis.multiplicity import fill_q
from dysco_interp.analysis.paired import paired_comparison
from dysco_interp.analysis.report import fmt_delta
from dysco_interp.atomic import atomic_open
from dysco_interp.errors import ConfigError
from dysco_interp.paths import safe_component
from dysco_interp.stores import store as runner
from dysco_interp.stores.archives import stored, stores_in
from dysco_interp.viz.ablation_figure import draw_ablation

BASELINE = "none"  # the head_set name of the unablated pass
RANDOM = "random"
KEY = ("model", "task", "length", "seed", "index", "head_set")
METRICS = {"path_traversal": ["accuracy"], "needle_qa": ["accuracy", "logprob"]}
ANALYSIS = "causal_ablation"


def random_name(seed: int) -> str:
    return f"{RANDOM}#{seed}"


def group_of(head_set: str) -> str:
    """'random#3' -> 'random'; a name without '#' is its own group."""
    return head_set.split("#", 1)[0]


def store_path(out_dir: str | Path, model: str) -> Path:
    return stored(Path(out_dir) / f"{Path(model).name}.jsonl")


def read_study(path: str | Path) -> tuple[dict, list[dict]]:
    """(settings, records) of one ablation store, read without modifying it."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"no results at {path}; run the computation first (without --figures-only)")
    contents = runner.read_store(path)
    settings = contents.settings if contents is not None else None
    if not settings or settings.get("analysis") != ANALYSIS:
        raise ConfigError(f"{path}: not a head-ablation store (no {ANALYSIS} settings header)")
    return settings, runner.ResultStore(path, KEY, settings, readonly=True).records()


def _ci(values: Iterable[float], n_boot: int, seed: int) -> dict:
    return bootstrap_ci(list(values), n_boot=n_boot, seed=seed).as_dict()


def _paired(differences: Iterable[float], n_boot: int, seed: int, metric: str) -> dict:
    """A per-instance difference's mean and interval, with the instances it moved, its exact p and,
    where the metric has a margin, its equivalence p."""
    return paired_comparison(list(differences), n_boot=n_boot, seed=seed, margin=margin_of(metric)).as_dict()


def summarise_group(records: list[dict], metric: str, n_boot: int = 2000, seed: int = 0) -> dict:
    """One (task, length): baseline, every head set, every pooled group and the contrasts."""
    by_set: dict[str, dict[tuple, float]] = {}
    for r in records:
        by_set.setdefault(r["head_set"], {})[(r["seed"], r["index"])] = float(r["metrics"][metric])
    base = by_set.pop(BASELINE, {})
    if not base:
        raise ConfigError("no unablated records (head_set 'none') to measure drops against")
    out: dict = {"baseline": _ci(base.values(), n_boot, seed), "sets": {}, "groups": {}, "contrasts": {}}
    for name, vals in sorted(by_set.items()):
        keys = sorted(set(vals) & set(base))
        out["sets"][name] = {"ablated": _ci((vals[k] for k in keys), n_boot, seed),
                             "drop": _paired((base[k] - vals[k] for k in keys), n_boot, seed, metric)}
    members: dict[str, list[str]] = {}
    for name in sorted(by_set):
        members.setdefault(group_of(name), []).append(name)
    drops: dict[str, dict[tuple, float]] = {}
    for group, names in members.items():
        keys = sorted(set(base).intersection(*(by_set[n] for n in names)))
        drops[group] = {k: float(np.mean([base[k] - by_set[n][k] for n in names])) for k in keys}
        out["groups"][group] = {"members": names, "drop": _paired(drops[group].values(), n_boot, seed, metric),
                                "ablated": _ci((base[k] - drops[group][k] for k in keys), n_boot, seed)}
    if RANDOM in drops:
        for group, d in drops.items():
            keys = sorted(set(d) & set(drops[RANDOM]))
            if group != RANDOM and keys:
                out["contrasts"][f"{group} - {RANDOM}"] = _paired((d[k] - drops[RANDOM][k] for k in keys), n_boot,
                                                                   seed, metric)
    return out


def summarise(records: list[dict], model: str, n_boot: int = 2000, seed: int = 0) -> dict:
    """Per (task, length) and metric: means and paired 95% bootstrap CIs over instances."""
    mine = [r for r in records if r["model"] == model]
    if not mine:
        raise ConfigError(f"no records of model {model!r}")
    rows = []
    order = list(METRICS)
    groups = {(r["task"], r["length"]) for r in mine}
    for task, length in sorted(groups, key=lambda g: (order.index(g[0]) if g[0] in order else len(order), g)):
        recs = [r for r in mine if r["task"] == task and r["length"] == length]
        metrics = METRICS.get(task) or sorted(recs[0]["metrics"])
        rows.append({"task": task, "length": length, "n": sum(r["head_set"] == BASELINE for r in recs),
                     "dtype": sorted({r["dtype"] for r in recs}),
                     "n_tokens": [min(r["n_tokens"] for r in recs), max(r["n_tokens"] for r in recs)],
                     "metrics": {m: summarise_group(recs, m, n_boot, seed) for m in metrics}})
    # one family: every drop and contrast this model's summary reports
    fill_q(e for row in rows for m in row["metrics"].values()
           for e in (*(s["drop"] for s in m["sets"].values()), *(g["drop"] for g in m["groups"].values()),
                     *m["contrasts"].values()))
    return {"model": model, "drop": "unablated minus ablated (positive: the ablation hurts)",
            "ci": "95% percentile bootstrap over instances of the per-instance (paired) differences; each "
                  "difference also carries the instances it moved, the exact sign-flip p and the "
                  "Benjamini-Hochberg q over this summary's differences, and where its metric has a margin "
                  "(analysis/margins.py) the TOST p and q of equivalence within it",
            "n_boot": n_boot, "bootstrap_seed": seed, "rows": rows}


def write_outputs(out_dir: str | Path, models: list[str] | None, n_boot: int, command: str,
                  figures: bool = True) -> list[Path]:
    """For each model's store in out_dir (or the given models): <model>_summary.json and, unless
    `figures` is off, <model>.png and <model>.html."""
    out_dir = Path(out_dir)
    paths = [store_path(out_dir, m) for m in models] if models else stores_in(out_dir)
    if not paths:
        raise ConfigError(f"no ablation stores (*.jsonl, *.jsonl.xz) in {out_dir}")
    written = []
    for path in paths:
        settings, records = read_study(path)
        for model in sorted({r["model"] for r in records}):
            summary = summarise(records, model, n_boot=n_boot)
            summary.update({"settings": settings, "source": path.name, "command": command})
            stem = out_dir / safe_component(model)
            target = stem.with_name(stem.name + "_summary.json")
            with atomic_open(target) as f:
                f.write(json.dumps(summary, indent=1) + "\n")
            written.append(target)
            if figures:
                try:
                    written += draw_ablation(summary, stem)
                except ImportError as e:  # a compute-only machine: the numbers are written, the drawing waits
                    print(f"not drawing ({e.name} is not installed); draw later with --figures-only", file=sys.stderr)
    return written


def summary_lines(summary: dict) -> list[str]:
    """One line per (task, length, metric): baseline and each group's drop with its CI."""
    lines = [summary["model"]]
    for row in summary["rows"]:
        for metric, m in row["metrics"].items():
            parts = [f"{name} {fmt_delta(g['drop'])}" for name, g in m["groups"].items()]
            lines.append(f"  {row['task']} {row['length']} {metric} (n={row['n']}): baseline "
                         f"{m['baseline']['mean']:.3f}; drop " + "; ".join(parts))
    return lines
