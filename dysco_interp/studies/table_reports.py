"""The JSON document and Markdown page of each results table and figure drawn from the
evaluation stores: Path Traversal (UniAttnS tau chosen on MRCR), ablations and robustness.

The numbers come from `result_tables`; here they are gathered with the stores they came
from and the notes on anything missing, and rendered.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from dysco_interp.analysis import result_tables as T
from dysco_interp.analysis.method_key import ROBUSTNESS_PARAMS, MethodKey, default_value
from dysco_interp.analysis.records import display_path, load_deduplicated, load_pooled
from dysco_interp.analysis.report import DELTA_LEGEND, fmt_ci, fmt_delta, with_footer
from dysco_interp.analysis.result_tables import delta_metrics
from dysco_interp.cli import args as cli_args
from dysco_interp.cli import user_methods
from dysco_interp.decoding.methods import PAPER_TAUS
from dysco_interp.errors import DyscoError
from dysco_interp.tasks.path_traversal.spec import PATH_TRAVERSAL
from dysco_interp.tasks.registry import TASKS
from dysco_interp.viz.panels import Panel, Series
from dysco_interp.viz.tables import table_markdown


def reported_tasks() -> dict[str, str]:
    """The tasks the tables report (those with table metrics), in the registry's order, by title."""
    return {name: spec.title for name, spec in TASKS.items() if spec.metrics.tables}


def metric_label(task: str, metric: str) -> str:
    """A metric's column title in the task's tables (its name where the task's spec has none)."""
    spec = TASKS.get(task)
    return next((m.label for m in spec.metrics.tables if m.field == metric), metric) if spec else metric


def figure_metrics() -> list[tuple[str, str, str]]:
    """(task, metric, axis label) per robustness figure row: each task's compared metrics."""
    return [(name, m.field, f"{spec.title} {m.axis}") for name, spec in TASKS.items()
            for m in spec.metrics.tables if m.compared]


PARAM_LABELS = {"top_p": "nucleus mass p", "top_k": "cap K (tokens)", "beta": "strength beta"}
POOLING_HELP = ("Stores are pooled only when comparable: records of one model, task, length and token budget "
                "computed with other settings (dtype, device, backend, weights, teacher forcing, head set, ...) "
                "are refused in one line naming both files; a record stored twice counts once, and a note says "
                "when the two differ in results. A store named NAME.jsonl, or matched by a *.jsonl pattern, is read "
                "from its compressed archive NAME.jsonl.xz (or .gz) where only that exists, as the committed stores "
                "are kept.")


# ---------------------------------------------------------------------------- Path Traversal


def table_arguments(description: str, *, stores: Sequence[str], stores_help: str, out: str,
                    out_help: str) -> argparse.ArgumentParser:
    """The flags every table script takes: --stores, --out, the bootstrap's --n-boot and --seed, and
    --methods-from (for stores of methods of one's own)."""
    p = cli_args.ArgumentParser(description=description, epilog=POOLING_HELP)
    p.add_argument("--stores", nargs="+", default=list(stores), help=stores_help)
    p.add_argument("--out", type=cli_args.output_stem, default=out, help=out_help)
    p.add_argument("--n-boot", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    user_methods.add_methods_from_flag(p)
    return p


def ci_options(args: argparse.Namespace) -> T.CIOptions:
    return T.CIOptions(args.n_boot, args.seed)


def pt_table_result(stores: Sequence[str], tau_stores: Sequence[str], ci: T.CIOptions, command: str,
                    root: Path) -> dict:
    """The Path Traversal table from its stores and the MRCR tau-sweep stores (glob patterns)."""
    pooled, files, unmatched = load_pooled(stores)
    tau_pooled, tau_files, tau_unmatched = load_pooled(tau_stores)
    if not any(r["task"] == PATH_TRAVERSAL.name for r in pooled.records):
        raise DyscoError(f"no Path Traversal records in {' '.join(stores)}")
    sweep = T.tau_sweep(tau_pooled.records, ci=ci, grid=PAPER_TAUS)
    rows, notes = T.pt_table(pooled.records, {m: s["chosen_tau"] for m, s in sweep.items()}, ci)
    T.with_table_q(rows)
    notes = pooled.notes(unmatched + tau_unmatched) + notes
    notes += [f"{m}: every tau in the MRCR sweep has the same mean score, so the data cannot choose; "
              f"the rule falls back to the tau closest to 1 ({s['chosen_tau']:g})"
              for m, s in sweep.items() if s["all_tied"]]
    return {
        "table": PATH_TRAVERSAL.name,
        "command": command,
        "ci": ci.description,
        "tau_rule": "Per model, the UniAttnS tau with the best mean MRCR score over the sweep stores "
                    f"(all lengths pooled) among the paper's grid ({', '.join(f'{t:g}' for t in PAPER_TAUS)}); "
                    "ties go to the tau closest to 1. Temperatures of an earlier, harsher grid stay in the "
                    "sweep table, marked off the grid, and are never chosen.",
        "stores": [display_path(f, root) for f in files],
        "tau_stores": [display_path(f, root) for f in tau_files],
        "tau_selection": sweep,
        "rows": rows,
        "notes": notes,
    }


def render_pt_table(result: dict) -> str:
    body = []
    for r in result["rows"]:
        m, d = r["metrics"], r.get("delta") or {}
        body.append([r["model"], r["length"], r["setting"].get("max_new_tokens"), r["method"], r["n"],
                     fmt_ci(m.get("accuracy")), fmt_ci(m.get("step_accuracy")), fmt_ci(m.get("partial_accuracy")),
                     fmt_delta(d.get("accuracy")), fmt_delta(d.get("step_accuracy"))])
    parts = ["# Path Traversal: vanilla / UniAttnS / DySCO", "",
             f"Mean over instances; {result['ci']}. Δ: paired difference to vanilla on the same instances. "
             f"{DELTA_LEGEND}", "",
             table_markdown(["model", "length", "new tokens", "method", "n", "accuracy (exact)", "step accuracy",
                             "partial accuracy", "Δ accuracy", "Δ step accuracy"], body), "",
             "## UniAttnS temperature, chosen on MRCR-style data", "", result["tau_rule"], ""]
    sweep = []
    for model, s in result["tau_selection"].items():
        for row in s["rows"]:
            chosen = "**chosen**" + (" (tie)" if s["tied"] else "") if row["tau"] == s["chosen_tau"] else ""
            if row.get("on_grid") is False:
                chosen = "off the grid"
            sweep.append([model, f"{row['tau']:g}", row["n"], ",".join(map(str, row["lengths"])),
                          fmt_ci(row["score"]), chosen])
    parts.append(table_markdown(["model", "tau", "n", "lengths", "MRCR score", ""], sweep) if sweep
                 else "No MRCR tau-sweep records.")
    return with_footer(parts, result)


# ---------------------------------------------------------------------------- ablations


def ablation_result(stores: Sequence[str], ci: T.CIOptions, command: str, root: Path) -> dict:
    """The ablation table (DySCO vs its variants at equal parameters) from its stores (glob patterns)."""
    pooled, files, unmatched = load_deduplicated(stores)
    rows, notes = T.ablation_table(pooled.records, ci)
    T.with_table_q(rows)
    return {
        "table": "ablations",
        "command": command,
        "ci": ci.description,
        "stores": [display_path(f, root) for f in files],
        "rows": rows,
        "notes": pooled.notes(unmatched) + notes,
    }


def render_ablation_table(result: dict) -> str:
    parts = ["# Ablations: DySCO vs random heads vs static selection vs one-pass reuse", "",
             f"Mean over instances; {result['ci']}. Δ: paired difference to DySCO on the same instances. "
             f"{DELTA_LEGEND}"]
    tasks = {r["task"] for r in result["rows"]}
    titles = reported_tasks()
    for task in [t for t in titles if t in tasks] + sorted(tasks - set(titles)):
        rows = [r for r in result["rows"] if r["task"] == task]
        metrics = list(rows[0]["metrics"])
        deltas = list(delta_metrics(task))
        body = [[r["model"], r["length"], r["setting"].get("max_new_tokens"), r["method"], r["n"],
                 *(fmt_ci(r["metrics"].get(m)) for m in metrics),
                 *(fmt_delta((r.get("delta") or {}).get(m)) for m in deltas)] for r in rows]
        parts += ["", f"## {titles.get(task, task)}", "",
                  table_markdown(["model", "length", "new tokens", "method", "n",
                                  *(metric_label(task, m) for m in metrics),
                                  *(f"Δ {metric_label(task, m)}" for m in deltas)], body)]
    if not result["rows"]:
        parts += ["", "No ablation records."]
    return with_footer(parts, result)


# ---------------------------------------------------------------------------- robustness


def robustness_result(stores: Sequence[str], ci: T.CIOptions, command: str, root: Path) -> dict:
    """The robustness points (one parameter moved at a time) from the stores (glob patterns),
    each with its paired difference to vanilla on the same instances (`delta`; None where the
    cell has no vanilla run)."""
    pooled, files, unmatched = load_deduplicated(stores)
    points, notes = T.robustness_points(pooled.records, ci)
    if not points:
        raise DyscoError(f"no DySCO runs in {' '.join(stores)}")
    drawn = sorted({task for task, _, _ in figure_metrics()})
    if not any(p["task"] in drawn for p in points):
        raise DyscoError(f"no DySCO runs of {' or '.join(drawn)} in {' '.join(stores)}: the figure draws only those")
    notes += add_vanilla_deltas(points, pooled.records, ci)
    T.with_table_q(points)
    return {
        "figure": "robustness",
        "command": command,
        "ci": ci.description,
        "stores": [display_path(f, root) for f in files],
        "points": points,
        "notes": pooled.notes(unmatched) + notes,
    }


def add_vanilla_deltas(points: list[dict], records: Sequence, ci: T.CIOptions) -> list[str]:
    """Sets each point's `delta`: DySCO at that value minus vanilla, paired by instance."""
    vanilla_key = MethodKey("vanilla")
    groups = T.group(records)
    notes = []
    for p in points:
        cell = T.Cell(p["model"], p["task"], p["length"], tuple(p["setting"].items()))
        by_key = groups.get(cell, {})
        vanilla = by_key.get(vanilla_key, [])
        runs = next((recs for k, recs in by_key.items() if k.method == "dysco" and k.params_dict() == p["params"]),
                    [])
        p["delta"] = T.paired_deltas(runs, vanilla, delta_metrics(p["task"]), ci) if vanilla else None
        if not vanilla:
            notes.append(f"{p['model']} {p['task']} {p['length']}: no vanilla run; no difference to vanilla")
    return sorted(set(notes))


def _series_name(point: dict, many_models: bool, many_settings: bool) -> str:
    name = f"{point['length']} tokens"
    if many_models:
        name = f"{point['model']}, {name}"
    if many_settings:
        name += f", {point['setting'].get('max_new_tokens')} new"
    return name


def delta_range(points: list[dict]) -> tuple[float, float]:
    """One y range for every panel, symmetric about 0: rows compare at a glance, and a row whose
    differences are all 0 sits flat on a scale that the other rows give meaning to."""
    ends = [abs(e[k]) for p in points for e in (p.get("delta") or {}).values() if e for k in ("mean", "lo", "hi")]
    top = max(ends, default=0.0) or 0.1
    return -1.1 * top, 1.1 * top


def zero_note(series: dict[str, list[dict]], metric: str) -> str:
    """What a panel says when DySCO scores 0 at every value shown: its line is then vanilla's
    score with the sign flipped (or the line at 0 itself), which the plot alone does not tell."""
    pts = [p for pts in series.values() for p in pts]
    if not pts or any(p["metrics"][metric]["hi"] != 0 for p in pts):
        return ""
    if all(p["delta"][metric]["lo"] == p["delta"][metric]["hi"] == 0 for p in pts):
        return "every run scores 0,\nDySCO and vanilla alike"
    zero_models = sorted({p["model"] for p in pts if p["delta"][metric]["lo"] == p["delta"][metric]["hi"] == 0})
    both = f"\nso does vanilla for {', '.join(zero_models)}" if zero_models else ""
    return f"DySCO scores 0 at every value{';' if both else ''}{both}"


def robustness_panels(points: list[dict]) -> list[Panel]:
    """Per (metric, parameter): DySCO minus vanilla (paired, 95% CI) against the parameter's
    value, the default dashed, vanilla as the line at 0."""
    many_models = len({p["model"] for p in points}) > 1
    many_settings = len({(p["model"], p["task"], p["length"], tuple(p["setting"].items())) for p in points}) > len(
        {(p["model"], p["task"], p["length"]) for p in points})
    rows = [(t, m, label) for t, m, label in figure_metrics() if any(p["task"] == t for p in points)]
    ylim = delta_range(points)
    out = []
    for task, metric, label in rows:
        for param in ROBUSTNESS_PARAMS:
            series: dict[str, list[dict]] = {}
            for p in points:
                if p["task"] == task and p["param"] == param and (p.get("delta") or {}).get(metric):
                    series.setdefault(_series_name(p, many_models, many_settings), []).append(p)
            lines = [Series(name, [p["delta"][metric]["mean"] for p in pts],
                            [p["delta"][metric]["lo"] for p in pts],
                            [p["delta"][metric]["hi"] for p in pts], x=[p["value"] for p in pts])
                     for name, pts in series.items()]
            out.append(Panel(f"{label} vs {PARAM_LABELS[param]}", f"Δ {label}\n(DySCO − vanilla)", lines,
                             xlabel=PARAM_LABELS[param], log_x=param == "top_k", mark_x=default_value(param),
                             mark_label="paper default", note="no runs", ylim=ylim, ref=0.0,
                             ref_label="vanilla (Δ = 0)", annotation=zero_note(series, metric)))
    return out


def render_robustness(result: dict) -> str:
    parts = ["# DySCO hyper-parameter robustness (one parameter at a time)", "",
             f"Mean over instances; {result['ci']}. Defaults: p=0.975, K=4096, beta=2. "
             "Δ vs vanilla: paired difference to vanilla decoding on the same instances (what the figure shows). "
             f"{DELTA_LEGEND}"]
    for param in ROBUSTNESS_PARAMS:
        pts = [p for p in result["points"] if p["param"] == param]
        body = [[p["model"], p["task"], p["length"], p["setting"].get("max_new_tokens"),
                 f"{p['value']:g}" + (" (default)" if p["is_default"] else ""), p["n"],
                 "; ".join(f"{m} {fmt_ci(e)}" for m, e in p["metrics"].items()),
                 "; ".join(f"{m} {fmt_delta(e)}" for m, e in (p.get("delta") or {}).items()) or "-"] for p in pts]
        parts += ["", f"## {PARAM_LABELS[param]}", "",
                  table_markdown(["model", "task", "length", "new tokens", "value", "n", "metrics", "Δ vs vanilla"],
                                 body)
                  if body else "No runs."]
    return with_footer(parts, result)
