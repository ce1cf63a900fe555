"""The steering harness's leaderboard, from its test stores (records in, tables and figures out).

Every method at its dev choice against vanilla, per model, decoding mode (teacher forced, free),
task and length, on the task's primary metric: the paired difference with its interval, the
instances it made better and worse, the exact sign-flip p, the equivalence test at the metric's
margin, and a BH q over the whole leaderboard (one family: every row of every model and mode).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

from dysco_interp.analysis.margins import margin_of
from dysco_interp.analysis.method_key import MethodKey, method_key
from dysco_interp.analysis.paired import paired_comparison, with_q
from dysco_interp.analysis.records import read_records
from dysco_interp.analysis.report import DELTA_LEGEND, fmt_delta, write_json, write_text
from dysco_interp.stores.archives import glob_stores
from dysco_interp.studies.budget_choice import primary_metrics
from dysco_interp.viz.figures import save_ci_lines, save_panels
from dysco_interp.viz.panels import Panel, Series
from dysco_interp.viz.tables import table_markdown

MODES = {"tf": "teacher forced", "free": "free"}
VANILLA = MethodKey("vanilla")


def cells_of(folder: Path) -> dict[tuple[str, str, int, str], list[Mapping]]:
    """(model, task, length, mode) -> the records of that cell under `folder/test/`, as each record
    names them (its store's settings say whether it was teacher forced), whatever the files are called."""
    cells: dict[tuple[str, str, int, str], list[Mapping]] = defaultdict(list)
    for path in glob_stores(folder / "test" / "*.jsonl"):
        for r in read_records(path):
            mode = "tf" if (r.get("settings") or {}).get("teacher_forced") else "free"
            cells[(str(r["model"]), str(r["task"]), int(r["length"]), mode)].append(r)
    return cells


def leaderboard(folder: Path) -> dict:
    """Rows per (model, mode, task, length, method): the method's paired difference from vanilla
    on the task's primary metric, q over every row."""
    rows: list[dict] = []
    for (model, task, length, mode), records in sorted(cells_of(folder).items()):
        metric = primary_metrics(forced=mode == "tf")[task]
        values: dict[MethodKey, dict[str, float]] = {}
        labels: dict[MethodKey, str] = {}  # the harness's store label: the method and its grid point
        for r in records:
            if r.get(metric) is not None:
                values.setdefault(method_key(r), {})[str(r["instance"])] = float(r[metric])
                labels.setdefault(method_key(r), str(r["method"]))
        base = values.get(VANILLA, {})
        for key in sorted(k for k in values if k != VANILLA):
            shared = sorted(values[key].keys() & base.keys())
            if shared:
                diff = [values[key][i] - base[i] for i in shared]
                rows.append({"model": model, "mode": mode, "task": task, "length": length,
                             "method": key.method, "label": labels[key], "metric": metric, "n": len(shared),
                             "vanilla": sum(base[i] for i in shared) / len(shared),
                             "delta": paired_comparison(diff, margin=margin_of(metric))})
    for row, filled in zip(rows, with_q([r["delta"] for r in rows])):
        row["delta"] = filled.as_dict()
    return {"rows": rows, "family": "every row of the leaderboard"}


def render(result: Mapping) -> str:
    body = [[r["model"], MODES[r["mode"]], r["task"], f"{r['length'] // 1024}K", r["label"], r["metric"], r["n"],
             f"{r['vanilla']:.3f}", fmt_delta(r["delta"])] for r in result["rows"]]
    return "\n".join([
        "# The steering leaderboard: each method at its dev choice against vanilla (test split)", "",
        f"Δ: the method minus vanilla on the task's primary metric, paired per instance; q: BH over "
        f"{result['family']}. {DELTA_LEGEND}", "",
        table_markdown(["model", "mode", "task", "length", "method", "metric", "n", "vanilla", "Δ"], body)]) + "\n"


def figure(result: Mapping, model: str, mode: str, stem: Path) -> tuple[Path, Path]:
    """Which method works where: one panel per task, each method's Δ over the lengths."""
    rows = [r for r in result["rows"] if r["model"] == model and r["mode"] == mode]
    lengths = sorted({r["length"] for r in rows})
    panels = []
    for task in sorted({r["task"] for r in rows}):
        mine = [r for r in rows if r["task"] == task]
        series = []
        for label in sorted({r["label"] for r in mine}):
            at = {r["length"]: r["delta"] for r in mine if r["label"] == label}
            series.append(Series(label, [at[n]["mean"] if n in at else None for n in lengths],
                                 [at[n]["lo"] if n in at else None for n in lengths],
                                 [at[n]["hi"] if n in at else None for n in lengths]))
        metric = mine[0]["metric"]
        panels.append(Panel(task, f"Δ {metric}\n(method − vanilla)", series, note="no runs", ref=0.0,
                            ref_label="vanilla (Δ = 0)"))
    return save_ci_lines(panels, [f"{n // 1024}K" for n in lengths], stem,
                         title=f"Which method works where ({model}, {MODES[mode]})", xlabel="context length")


def step_costs(folder: Path) -> dict[str, float]:
    """Each method's decode step time over vanilla's in the same run, from the harness's cost
    benchmarks (`cost_*.json`, as `analyses/bench_decode.py` writes them; the longest context of
    each, a later file's value for a method timed twice)."""
    costs: dict[str, float] = {}
    for path in sorted(folder.glob("cost_*.json")):
        row = max(json.loads(path.read_text())["rows"], key=lambda r: r["context"])
        for key, ms in row.items():
            if key.endswith("_step_ms") and key != "vanilla_step_ms" and isinstance(ms, (int, float)):
                costs[key.removesuffix("_step_ms")] = ms / row["vanilla_step_ms"]
    return costs


def effect_cost_figure(result: Mapping, costs: Mapping[str, float], model: str, mode: str,
                       stem: Path) -> tuple[Path, Path] | None:
    """Effect against cost: a panel per task and length, each method at its dev choice a point
    at its step time over vanilla's (x) and its paired Δ with its interval (y); None when no
    method of the rows has a cost."""
    rows = [r for r in result["rows"] if r["model"] == model and r["mode"] == mode and r["method"] in costs]
    if not rows:
        return None
    panels = []
    for task, length in sorted({(r["task"], r["length"]) for r in rows}):
        cell = [r for r in rows if (r["task"], r["length"]) == (task, length)]
        series = [Series(r["label"], [r["delta"]["mean"]], [r["delta"]["lo"]], [r["delta"]["hi"]],
                         x=[costs[r["method"]]]) for r in cell]
        panels.append(Panel(f"{task}, {length // 1024}K", f"Δ {cell[0]['metric']}", series,
                            xlabel="decode step time / vanilla's", ref=0.0, ref_label="vanilla (Δ = 0)"))
    return save_panels(panels, stem, title=f"Effect against cost ({model}, {MODES[mode]})")


def write_reports(out_dir: Path) -> list[str]:
    """`out_dir/harness/leaderboard.{md,json}` and, per model and mode, `where_<model>_<mode>.{png,html}`
    and, for the methods with a cost row (`cost_*.json`), `effect_cost_<model>_<mode>.{png,html}`."""
    folder = out_dir / "harness"
    result = leaderboard(folder)
    if not result["rows"]:
        return [f"no harness test stores under {folder / 'test'}: nothing written"]
    written = [write_json(folder / "leaderboard.json", result), write_text(folder / "leaderboard.md", render(result))]
    costs = step_costs(folder)
    for model, mode in sorted({(r["model"], r["mode"]) for r in result["rows"]}):
        written += list(figure(result, model, mode, folder / f"where_{model}_{mode}"))
        written += list(effect_cost_figure(result, costs, model, mode, folder / f"effect_cost_{model}_{mode}") or ())
    return [str(p) for p in written]


__all__ = ["MODES", "cells_of", "effect_cost_figure", "figure", "leaderboard", "render", "step_costs", "write_reports"]
