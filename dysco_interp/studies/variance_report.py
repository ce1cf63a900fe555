"""The variance study's table and figure (`studies.variance`): the small-budget effect under each
run, and how far each change moves it.

Every run's effect is the paired difference (chosen configuration − vanilla) per instance. Each
variant changes one thing against a baseline run on the same instances, so its shift is paired
too: the machine against the reference stores; fp32 decode attention and the second head set
against the same-machine bf16 run. A shift is tested for a difference (sign-flip p, BH q over
the shifts) and for equivalence within the metric's margin (`analysis.margins`; TOST, BH q).
"""

from __future__ import annotations

import textwrap
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from dysco_interp.analysis.margins import margin_of
from dysco_interp.analysis.method_key import MethodKey, method_key
from dysco_interp.analysis.paired import PairedComparison, paired_comparison, with_q
from dysco_interp.analysis.records import read_records
from dysco_interp.analysis.report import DELTA_LEGEND, fmt_delta, write_json, write_text
from dysco_interp.heads import HeadSet, available_shipped_heads, shipped_heads
from dysco_interp.studies.variance import LENGTHS, TASK, VarianceSettings, methods
from dysco_interp.tasks.lengths import parse_length
from dysco_interp.viz.figures import save_ci_lines
from dysco_interp.viz.panels import Panel, Series
from dysco_interp.viz.tables import table_markdown

METRICS = (("tf_step_accuracy", "step accuracy"), ("tf_city_logprob", "gold city log p"))
# run -> (what it changes, the run it is compared with); None: the reference has no baseline
RUNS = {"reference": ("the budget study's test stores", None),
        "machine": ("the machine", "reference"),
        "fp32": ("decode attention in float32", "machine"),
        "heads": ("a second head set", "machine")}
VANILLA = MethodKey("vanilla")

Values = dict[MethodKey, dict[str, float]]  # method -> instance -> metric value


def values_of(records: Sequence[Mapping], metric: str) -> Values:
    out: Values = {}
    for r in records:
        if r.get(metric) is not None:
            out.setdefault(method_key(r), {})[str(r["instance"])] = float(r[metric])
    return out


def effects(run: Values, vanilla: Values, chosen: MethodKey) -> dict[str, float]:
    """Per instance: `chosen` minus vanilla (`vanilla` supplies the vanilla values)."""
    base = vanilla.get(VANILLA, {})
    return {i: v - base[i] for i, v in run.get(chosen, {}).items() if i in base}


def machines(records: Sequence[Mapping], keys: Sequence[MethodKey]) -> str:
    """The machines that made the records of `keys` (the provenance each record keeps), most first."""
    counts = Counter(str((r.get("run") or {}).get("machine") or "not recorded") for r in records
                     if method_key(r) in keys)
    return ", ".join(name for name, _ in counts.most_common())


def compare(differences: Mapping[str, float], metric: str, margin: bool) -> PairedComparison | None:
    if not differences:
        return None
    ordered = [differences[i] for i in sorted(differences)]
    return paired_comparison(ordered, margin=margin_of(metric) if margin else None)


def variance_result(model: str, lengths: Sequence[str], chosen: MethodKey, reference: Callable[[str], Path],
                    store: Callable[[str, str], Path], heads: Mapping[str, HeadSet]) -> dict:
    """Rows per (length, metric, run): the effect and, for a variant, its shift and the vanilla drift."""
    rows: list[dict] = []
    notes: list[str] = []
    for length in lengths:
        paths = {"reference": reference(length), **{run: store(length, run) for run in RUNS if run != "reference"}}
        records = {run: list(read_records(p)) if p.exists() else [] for run, p in paths.items()}
        for run, recs in records.items():
            if not recs:
                notes.append(f"{length}: no {run} run ({paths[run].name})")
        for metric, label in METRICS:
            vals = {run: values_of(recs, metric) for run, recs in records.items()}
            effect = {run: effects(v, vals["machine"] if run == "heads" else v, chosen) for run, v in vals.items()}
            for run, (changes, base) in RUNS.items():
                if not effect[run]:
                    continue
                row = {"length": parse_length(length), "metric": metric, "label": label, "run": run,
                       "changes": changes, "machine": machines(records[run], (VANILLA, chosen)), "n": len(effect[run]),
                       "effect": compare(effect[run], metric, margin=False)}
                if base is not None and effect[base]:
                    shared = effect[run].keys() & effect[base].keys()
                    row["baseline"] = base
                    row["shift"] = compare({i: effect[run][i] - effect[base][i] for i in shared}, metric, margin=True)
                    if run != "heads":  # the heads run reuses the machine run's vanilla
                        va, vb = vals[run].get(VANILLA, {}), vals[base].get(VANILLA, {})
                        drift = [va[i] - vb[i] for i in va.keys() & vb.keys()]
                        row["vanilla_drift"] = {"n": len(drift), "changed": sum(1 for d in drift if d != 0),
                                                "max_abs": max((abs(d) for d in drift), default=0.0)}
                rows.append(row)
    for family in ("effect", "shift"):
        filled = with_q([r[family] for r in rows if r.get(family) is not None])
        for r, c in zip([r for r in rows if r.get(family) is not None], filled):
            r[family] = c.as_dict()
    overlap = None
    if {"shipped", "second"} <= heads.keys():
        shipped, second = heads["shipped"].labels(), heads["second"].labels()
        overlap = {"shipped": shipped, "second": second, "shared": [h for h in shipped if h in second],
                   "n": len(shipped)}
    return {"model": model, "chosen": chosen.label, "runs": {k: v[0] for k, v in RUNS.items()}, "rows": rows,
            "heads": overlap, "notes": notes}


def render(result: Mapping) -> str:
    body = []
    for r in result["rows"]:
        drift = r.get("vanilla_drift")
        body.append([f"{r['length'] // 1024}K", r["label"], r["run"], r["machine"], r["n"], fmt_delta(r["effect"]),
                     r.get("baseline", "-"), fmt_delta(r.get("shift")),
                     f"{drift['changed']} of {drift['n']} (max {drift['max_abs']:.3g})" if drift else "-"])
    parts = [f"# How far the small-budget effect moves ({result['model']}, Path Traversal, teacher forced)", "",
             "Effect: the budget study's chosen configuration minus vanilla, paired per instance. Shift: the run's "
             "effect minus its baseline run's on the same instances (one change at a time: "
             + "; ".join(f"{run}: {what}" for run, what in result["runs"].items()) + "). "
             f"q: BH over the effects, and over the shifts, of this table. {DELTA_LEGEND}", "",
             table_markdown(["length", "metric", "run", "machine", "n", "effect", "baseline", "shift",
                             "vanilla changed"], body)]
    heads = result.get("heads")
    if heads:
        parts += ["", f"Head sets: {len(heads['shared'])} of {heads['n']} heads shared "
                      f"({', '.join(heads['shared']) or 'none'}). Second set: {', '.join(heads['second'])}."]
    if result["notes"]:
        parts += ["", "Notes:", *[f"- {n}" for n in result["notes"]]]
    return "\n".join(parts) + "\n"


def figure(result: Mapping, stem: Path) -> tuple[Path, Path]:
    runs = [run for run in RUNS if any(r["run"] == run for r in result["rows"])]
    panels = []
    for metric, label in METRICS:
        series = []
        for length in sorted({r["length"] for r in result["rows"]}):
            by_run = {r["run"]: r["effect"] for r in result["rows"] if r["metric"] == metric and r["length"] == length}
            at = [by_run.get(k) for k in runs]
            series.append(Series(f"{length // 1024}K tokens", [e and e["mean"] for e in at],
                                 [e and e["lo"] for e in at], [e and e["hi"] for e in at]))
        panels.append(Panel(label, f"Δ {label}\n(chosen − vanilla)", series, note="no runs", ref=0.0,
                            ref_label="vanilla (Δ = 0)"))
    # wrapped, since four descriptions side by side overrun each other under a half-width panel
    ticks = [f"{run}\n" + textwrap.fill(f"({RUNS[run][0]})", 16) for run in runs]
    return save_ci_lines(panels, ticks, stem,
                         title=f"The small-budget effect under each run ({result['model']})", xlabel="run")


def write_reports(out_dir: Path, lengths: Sequence[str] = LENGTHS) -> list[str]:
    """Per model with a variance run under `out_dir/variance/`: <model>.md/.json and
    <model>_effect.png/.html, from its stores and the budget study's reference stores."""
    folder = out_dir / "variance"
    models = sorted({p.name.split(f"_{TASK}_")[0] for p in folder.glob(f"*_{TASK}_*.jsonl*")})
    if not models:
        return [f"no variance runs under {folder}: nothing written"]
    lines = []
    for model in models:
        s = VarianceSettings(model, Path("."), out_dir, lengths=lengths)
        heads = {"shipped": shipped_heads(model)} if model in available_shipped_heads() else {}
        if s.heads_path.is_file():
            heads["second"] = HeadSet.from_json(s.heads_path)
        [chosen] = [method_key({"config": c.record_fields()}) for c in methods(s).values() if c.method != "vanilla"]
        result = variance_result(model, lengths, chosen, s.reference, s.store, heads)
        written = [write_json(folder / f"{model}.json", result), write_text(folder / f"{model}.md", render(result))]
        if result["rows"]:
            written += list(figure(result, folder / f"{model}_effect"))
        lines += [str(p) for p in written]
    return lines


__all__ = ["METRICS", "RUNS", "effects", "render", "variance_result", "write_reports"]
