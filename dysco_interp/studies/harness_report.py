"""The steering harness's leaderboard, from its test stores (records in, tables and figures out).

Every method at its dev choice against vanilla, per model, decoding mode (teacher forced, free),
task and length, on the task's primary metric: the paired difference with its interval, the
instances it made better and worse, the exact sign-flip p, the equivalence test at the metric's
margin, and a BH q over the whole leaderboard (one family: every row of every model and mode).
DySCO's variants also against exact DySCO, in a table and q family of their own.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from dysco_interp.analysis.margins import margin_of
from dysco_interp.analysis.method_key import MethodKey, method_key
from dysco_interp.analysis.multiplicity import FDR
from dysco_interp.analysis.paired import paired_comparison, with_q
from dysco_interp.analysis.records import read_records
from dysco_interp.analysis.report import DELTA_LEGEND, equivalent, fmt_delta, write_json, write_text
from dysco_interp.decoding.format_forced import FORMAT_FORCED
from dysco_interp.stores.archives import glob_stores
from dysco_interp.studies.budget_choice import primary_metrics
from dysco_interp.studies.harness_protocol import LONG_LENGTH, N_LONG, TEST_N, long_methods
from dysco_interp.viz.figures import save_ci_lines, save_panels
from dysco_interp.viz.panels import Panel, Series
from dysco_interp.viz.tables import table_markdown

MODES = {"tf": "teacher forced", "free": "free", "ff": "format forced"}
VANILLA = MethodKey("vanilla")
# DySCO's variants, set against exact DySCO in a table of their own (`variants`)
VARIANTS = ("dysco-lagged", "dysco-hard", "dysco-middle", "dysco-sparse")
# one colour per method in every harness figure, so a method reads the same across models, modes
# and figures: DySCO and its variants in blues and cyans, the baselines each their own hue
METHOD_COLORS = {"dysco": "#1f77b4", "dysco-lagged": "#6baed6", "dysco-middle": "#17becf", "dysco-hard": "#08306b",
                 "dysco-sparse": "#9edae5", "uniattns": "#7f7f7f", "logn": "#bcbd22", "instaboost": "#ff7f0e",
                 "pos-calibration": "#8c564b", "pasta": "#e377c2", "qr-pasta": "#9467bd"}
OTHER_COLORS = ("#2ca02c", "#d62728", "#98df8a", "#ff9896", "#c49c94", "#ffbb78")  # methods of one's own


def method_color(method: str, others: Sequence[str] = ()) -> str:
    """`method`'s colour: its own for a built-in one, else one of `OTHER_COLORS` by its place
    among `others` (the methods of one's own in the figure, sorted)."""
    if method in METHOD_COLORS:
        return METHOD_COLORS[method]
    place = list(others).index(method) if method in others else 0
    return OTHER_COLORS[place % len(OTHER_COLORS)]


def cells_of(folder: Path, split: str = "test") -> dict[tuple[str, str, int, str], list[Mapping]]:
    """(model, task, length, mode) -> the records of that cell under `folder/<split>/`, as each
    record names them (its store's settings say whether it was teacher forced or format forced),
    whatever the files are called."""
    cells: dict[tuple[str, str, int, str], list[Mapping]] = defaultdict(list)
    for path in glob_stores(folder / split / "*.jsonl"):
        for r in read_records(path):
            settings = r.get("settings") or {}
            mode = ("tf" if settings.get("teacher_forced") else
                    "ff" if settings.get("decoding") == FORMAT_FORCED else "free")
            cells[(str(r["model"]), str(r["task"]), int(r["length"]), mode)].append(r)
    return cells


def expected_in(folder: Path, model: str, length: int, found: int) -> tuple[dict[str, str], int]:
    """The methods a test cell of `model` should hold, by their chosen points' labels (those of
    its dev choice file, when there is one), and how many instances: the protocol's `TEST_N` at
    the protocol's lengths, else the `found` instances vanilla ran (a run of one's own, at its own
    lengths and counts)."""
    path = folder / f"chosen_{model}.json"
    choices = json.loads(path.read_text())["choices"] if path.is_file() else {}
    label = f"{length // 1024}k"
    if label == LONG_LENGTH and choices:  # only the best methods by the protocol's rule run there
        choices = {m: choices[m] for m in long_methods(choices, N_LONG)}
    return {m: str(c["label"]) for m, c in choices.items()}, TEST_N.get(label, found)


def paired_rows(folder: Path, reference: str = "vanilla", compared: Sequence[str] | None = None,
                split: str = "test") -> tuple[list[dict], list[dict]]:
    """Rows per (model, mode, task, length, method): the method's paired difference from the
    method `reference` (at the point its cell holds) on the task's primary metric (no q yet:
    `one_family`), for every method but the reference, or for those of `compared` only. A method
    not yet run on every instance of its cell (an interrupted run; `expected_in`) is no row: it
    is listed apart with how many it has. A cell without the reference's records has no rows.
    `split`: the stores' folder under `folder` (the variants part's runs are in `variants/`)."""
    rows: list[dict] = []
    incomplete: list[dict] = []
    for (model, task, length, mode), records in sorted(cells_of(folder, split).items()):
        metric = primary_metrics(forced=mode == "tf")[task]
        values: dict[MethodKey, dict[str, float]] = {}
        labels: dict[MethodKey, str] = {}  # the harness's store label: the method and its grid point
        for r in records:
            if r.get(metric) is not None:
                values.setdefault(method_key(r), {})[str(r["instance"])] = float(r[metric])
                labels.setdefault(method_key(r), str(r["method"]))
        ref = next((k for k in sorted(values) if k.method == reference), None)
        if ref is None and reference != VANILLA.method:
            continue
        base = values.get(ref, {}) if ref is not None else {}
        # no vanilla outside the test stores: as many instances as the protocol's, or as the reference ran
        methods, n_expected = expected_in(folder, model, length,
                                          len(values.get(VANILLA, {})) if split == "test" else len(base))
        if split != "test":  # the choice file names the test stores' methods only
            methods = {}
        if compared is not None:
            methods = {m: label for m, label in methods.items() if m in compared}
        cell = {"model": model, "mode": mode, "task": task, "length": length, "expected": n_expected}
        for method in sorted(methods.keys() - {k.method for k in values}):
            incomplete.append({**cell, "method": method, "label": methods[method], "n": 0})
        for key in sorted(k for k in values if k not in (VANILLA, ref)
                          and (compared is None or k.method in compared)):
            shared = sorted(values[key].keys() & base.keys())
            if len(shared) < n_expected or len(values[key]) != len(shared) or len(base) < n_expected:
                incomplete.append({**cell, "method": key.method, "label": labels[key], "n": len(shared)})
            elif shared:
                diff = [values[key][i] - base[i] for i in shared]
                rows.append({**{k: v for k, v in cell.items() if k != "expected"},
                             "method": key.method, "label": labels[key], "metric": metric, "n": len(shared),
                             "reference": labels[ref] if ref is not None else reference,
                             "reference_value": sum(base[i] for i in shared) / len(shared),
                             "delta": paired_comparison(diff, margin=margin_of(metric))})
    return rows, incomplete


def one_family(rows: list[dict]) -> list[dict]:
    """`paired_rows`' rows with q over all of them, their differences as dicts."""
    for row, filled in zip(rows, with_q([r["delta"] for r in rows])):
        row["delta"] = filled.as_dict()
    return rows


def outcome(delta: Mapping) -> str:
    """What a row counts as: "up" or "down" (its sign, where its q is below `FDR`), "same" (shown
    equivalent to no change within its metric's margin, and not up or down), or "" (neither)."""
    if delta["q"] < FDR:
        return "up" if delta["mean"] > 0 else "down"
    return "same" if equivalent(delta) else ""


def counted(rows: Sequence[Mapping], name: Callable[[Mapping], str]) -> dict[str, dict[str, dict[str, int]]]:
    """A table's rows counted per compared method (`name(row)`) and model-and-mode ("MODEL MODE"):
    how many are up, down and the same by `outcome`, of how many."""
    counts: dict[str, dict[str, dict[str, int]]] = defaultdict(dict)
    for row in rows:
        cell = counts[name(row)].setdefault(f"{row['model']} {row['mode']}", dict.fromkeys(("up", "down", "same",
                                                                                             "of"), 0))
        cell["of"] += 1
        counts_as = outcome(row["delta"])
        if counts_as:
            cell[counts_as] += 1
    return {k: counts[k] for k in sorted(counts)}


def counts_section(counts: Mapping[str, Mapping[str, Mapping[str, int]]], what: str) -> list[str]:
    """The lines of a table's counts: one row per compared method, one column per model and mode."""
    columns = sorted({c for cells in counts.values() for c in cells},
                     key=lambda c: (c.rsplit(" ", 1)[0], list(MODES).index(c.rsplit(" ", 1)[1])))
    body = [[name, *(("{up}↑ {down}↓ {same}≡ / {of}".format(**cells[c]) if c in cells else "") for c in columns)]
            for name, cells in counts.items()]
    return ["", "## Counted", "",
            f"Each cell: the task-and-length rows above and below zero with q < {FDR:g}, those shown equivalent to "
            f"no change (≡, and neither), of how many; one column per model and mode ({', '.join(MODES)}: "
            f"{', '.join(MODES.values())}).", "",
            table_markdown([what, *columns], body).rstrip("\n")]


def variant_name(row: Mapping) -> str:
    """A variants row's name in the counts: the variant at its own choice, or, at DySCO's point, the
    variant with the parameters it adds to DySCO's."""
    if row["at"] == "own choice":
        return row["method"]
    added = [p for p in row["label"].split()[1:] if p not in row["reference"].split()[1:]]
    return " ".join([row["method"], *added, "at DySCO's point"])


def leaderboard(folder: Path) -> dict:
    """Every method's row against vanilla (`paired_rows`), q over every row; the methods not yet
    run on every instance of their cell listed under "incomplete", outside the q family."""
    paired, incomplete = paired_rows(folder)
    paired = one_family(paired)
    named = ("model", "mode", "task", "length", "method", "label", "metric", "n")
    rows = [{**{k: r[k] for k in named}, "vanilla": r["reference_value"], "delta": r["delta"]} for r in paired]
    return {"rows": rows, "family": "every row of the leaderboard", "incomplete": incomplete,
            "counts": counted(rows, lambda r: r["method"])}


def variants(folder: Path, costs: Mapping[str, float] | None = None) -> dict:
    """DySCO's variants (`VARIANTS`) against exact DySCO on the cells where both ran on every
    instance: each at its own dev choice in the test stores, and each at DySCO's point in the
    variants part's stores (against the DySCO of the same run); the paired difference, the
    instances it made better and worse, exact p, and q over this table alone; with each
    variant's decode step time over DySCO's and over vanilla's from the cost benchmark where it
    was timed (`costs`: `step_costs(folder)`, read here when not given)."""
    rows, incomplete = paired_rows(folder, "dysco", VARIANTS)
    at_point, not_yet = paired_rows(folder, "dysco", VARIANTS, split="variants")
    for row in rows:
        row["at"] = "own choice"
    for row in at_point:
        row["at"] = "DySCO's point"
    rows, incomplete = one_family(rows + at_point), incomplete + not_yet
    costs = step_costs(folder) if costs is None else costs
    speed = {m: {"step_over_dysco": round(costs[m] / costs["dysco"], 4), "step_over_vanilla": round(costs[m], 4)}
             for m in VARIANTS if m in costs and "dysco" in costs}
    return {"rows": rows, "family": "every row of this table", "incomplete": incomplete, "speed": speed,
            "counts": counted(rows, variant_name)}


def incomplete_section(result: Mapping, heading: str, what: str) -> list[str]:
    """The lines listing a table's methods not yet run on every instance of their cell (none:
    no lines)."""
    missing = result.get("incomplete") or []
    if not missing:
        return []
    return ["", f"{heading} (no row, outside the q family)", "",
            table_markdown(["model", "mode", "task", "length", what, "instances run"],
                           [[r["model"], MODES[r["mode"]], r["task"], f"{r['length'] // 1024}K", r["label"],
                             f"{r['n']} of {r['expected']}"] for r in missing])]


def render_variants(result: Mapping) -> str:
    body = [[r["model"], MODES[r["mode"]], r["task"], f"{r['length'] // 1024}K", r["label"], r["reference"],
             r["at"], r["metric"], r["n"], f"{r['reference_value']:.3f}", fmt_delta(r["delta"])]
            for r in result["rows"]]
    speed = result.get("speed") or {}
    lines = [
        "# DySCO's variants against exact DySCO (test split)", "",
        "Each variant against DySCO on the cells where both ran every instance: at their own dev choices "
        "(the test stores), or the variant at DySCO's choice beside DySCO in one run (the test-variants part's "
        f"stores). Δ: the variant minus DySCO, paired per instance; q: BH over {result['family']}. "
        f"{DELTA_LEGEND}", "",
        table_markdown(["model", "mode", "task", "length", "variant", "DySCO", "at", "metric", "n", "DySCO's value",
                        "Δ"], body)]
    lines += counts_section(result["counts"], "variant")
    lines += incomplete_section(result, "## Not yet run on every instance", "variant")
    if speed:
        lines += ["", "## Decode step time (the harness's cost benchmark)", "",
                  table_markdown(["variant", "step / DySCO's", "step / vanilla's"],
                                 [[m, f"{v['step_over_dysco']:.2f}", f"{v['step_over_vanilla']:.2f}"]
                                  for m, v in sorted(speed.items())])]
    return "\n".join(lines) + "\n"


def render(result: Mapping) -> str:
    body = [[r["model"], MODES[r["mode"]], r["task"], f"{r['length'] // 1024}K", r["label"], r["metric"], r["n"],
             f"{r['vanilla']:.3f}", fmt_delta(r["delta"])] for r in result["rows"]]
    lines = [
        "# The steering leaderboard: each method at its dev choice against vanilla (test split)", "",
        f"Δ: the method minus vanilla on the task's primary metric, paired per instance; q: BH over "
        f"{result['family']}. {DELTA_LEGEND}", "",
        table_markdown(["model", "mode", "task", "length", "method", "metric", "n", "vanilla", "Δ"], body)]
    lines += counts_section(result["counts"], "method")
    lines += incomplete_section(result, "## Not yet run on every test instance", "method")
    return "\n".join(lines) + "\n"


def figure(result: Mapping, model: str, mode: str, stem: Path) -> tuple[Path, Path]:
    """Which method works where: one panel per task, each method's Δ over the lengths."""
    rows = [r for r in result["rows"] if r["model"] == model and r["mode"] == mode]
    lengths = sorted({r["length"] for r in rows})
    others = own_methods(rows)
    panels = []
    for task in sorted({r["task"] for r in rows}):
        mine = [r for r in rows if r["task"] == task]
        series = []
        for label, method in sorted({(r["label"], r["method"]) for r in mine}):
            at = {r["length"]: r["delta"] for r in mine if r["label"] == label}
            series.append(Series(label, [at[n]["mean"] if n in at else None for n in lengths],
                                 [at[n]["lo"] if n in at else None for n in lengths],
                                 [at[n]["hi"] if n in at else None for n in lengths],
                                 color=method_color(method, others)))
        metric = mine[0]["metric"]
        panels.append(Panel(task, f"Δ {metric}\n(method − vanilla)", series, note="no runs", ref=0.0,
                            ref_label="vanilla (Δ = 0)"))
    return save_ci_lines(panels, [f"{n // 1024}K" for n in lengths], stem,
                         title=f"Which method works where ({model}, {MODES[mode]})", xlabel="context length")


def own_methods(rows: Sequence[Mapping]) -> list[str]:
    """The methods of one's own among `rows` (no built-in colour), sorted."""
    return sorted({str(r["method"]) for r in rows} - METHOD_COLORS.keys())


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
    others = own_methods(rows)
    panels = []
    for task, length in sorted({(r["task"], r["length"]) for r in rows}):
        cell = sorted((r for r in rows if (r["task"], r["length"]) == (task, length)), key=lambda r: r["label"])
        series = [Series(r["label"], [r["delta"]["mean"]], [r["delta"]["lo"]], [r["delta"]["hi"]],
                         color=method_color(r["method"], others), x=[costs[r["method"]]]) for r in cell]
        panels.append(Panel(f"{task}, {length // 1024}K", f"Δ {cell[0]['metric']}", series,
                            xlabel="decode step time / vanilla's", ref=0.0, ref_label="vanilla (Δ = 0)"))
    return save_panels(panels, stem, title=f"Effect against cost ({model}, {MODES[mode]})")


def write_reports(out_dir: Path) -> list[str]:
    """`out_dir/harness/leaderboard.{md,json}`, `variants.{md,json}` (where DySCO and a variant ran)
    and, per model and mode, `where_<model>_<mode>.{png,html}` and, for the methods with a cost
    row (`cost_*.json`), `effect_cost_<model>_<mode>.{png,html}`."""
    folder = out_dir / "harness"
    result = leaderboard(folder)
    if not result["rows"]:
        return [f"no harness test stores under {folder / 'test'}: nothing written"]
    written = [write_json(folder / "leaderboard.json", result), write_text(folder / "leaderboard.md", render(result))]
    costs = step_costs(folder)
    against = variants(folder, costs)
    if against["rows"]:
        written += [write_json(folder / "variants.json", against), write_text(folder / "variants.md",
                                                                               render_variants(against))]
    for model, mode in sorted({(r["model"], r["mode"]) for r in result["rows"]}):
        written += list(figure(result, model, mode, folder / f"where_{model}_{mode}"))
        written += list(effect_cost_figure(result, costs, model, mode, folder / f"effect_cost_{model}_{mode}") or ())
    return [str(p) for p in written]


__all__ = ["METHOD_COLORS", "MODES", "VARIANTS", "cells_of", "counted", "counts_section", "effect_cost_figure",
           "expected_in", "figure", "leaderboard", "method_color", "outcome", "own_methods", "paired_rows", "render",
           "render_variants", "step_costs", "variant_name", "variants", "write_reports"]
