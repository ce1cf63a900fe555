"""Tables and figures of the step account (`studies.step_account`), from its stores alone.

Writes into the study's folder (figures/step_account/):
- step_account.md / .json: the classes per model and length, the fix and break rates by each
  signal, the same controlled for the step's difficulty (`step_account_controls`: logistic
  models with instance-resampled odds ratios, and rates within bins of vanilla's gold log p),
  free against forced decoding, and the gate on the test split;
- signals.png / .html: P(fixed | vanilla wrong) and P(broken | vanilla right) by signal bin, one
  signal at a time (raw), then within bins of vanilla's gold log p;
- examples.md: a few route steps of each class, as the replay shows them.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dysco_interp.analysis.bootstrap import bootstrap_ci
from dysco_interp.analysis.margins import margin_of
from dysco_interp.analysis.multiplicity import fill_q
from dysco_interp.analysis.paired import paired_comparison
from dysco_interp.analysis.records import read_records
from dysco_interp.analysis.report import DELTA_LEGEND, fmt_delta
from dysco_interp.analysis.step_classes import CLASSES, class_rates
from dysco_interp.analysis.step_signals import SIGNALS, classified, rates_by_bin
from dysco_interp.atomic import atomic_open
from dysco_interp.errors import ConfigError
from dysco_interp.stores.archives import glob_stores
from dysco_interp.studies.step_account import step_records
from dysco_interp.studies.step_account_controls import controlled, controlled_panels, rate_series, render_controlled
from dysco_interp.tasks.lengths import length_label
from dysco_interp.viz.figures import save_panels
from dysco_interp.viz.panels import Panel
from dysco_interp.viz.tables import table_markdown

STEERED = ("dysco", "gated")
LABELS = {"vanilla": "vanilla", "dysco": "DySCO", "gated": "gated DySCO"}
EXAMPLES_PER_CLASS = 2


def _ci(est: Mapping | None, digits: int = 3) -> str:
    if est is None:
        return "-"
    return f"{est['mean']:.{digits}f} [{est['lo']:.{digits}f}, {est['hi']:.{digits}f}]"


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _cells(records: Sequence[Mapping]) -> list[tuple[str, int]]:
    return sorted({(r["model"], r["length"]) for r in records}, key=lambda c: (c[0], c[1]))


def per_instance(records: Sequence[Mapping], method: str) -> dict[str, dict[str, float]]:
    """instance -> its teacher-forced step accuracy, mean city log p, and its leading route steps:
    those before the line of the first gold token its argmax misses (what greedy free decoding
    keeps), as a count and as a share of the route, for `method`."""
    out = {}
    for r in records:
        steps = [s for s in r["steps"] if method in s["correct"]]
        if not steps:
            continue
        right = [bool(s["correct"][method]) for s in steps]
        miss = r["first_miss"].get(method)
        lead = r["n_hops"] if miss is None or miss["step"] is None else miss["step"]
        out[r["instance"]] = {"step_accuracy": sum(right) / len(right), "leading_steps": lead,
                              "leading": lead / r["n_hops"],
                              "city_logprob": sum(s["logprob"][method] for s in steps) / len(steps)}
    return out


def paired(a: Mapping[str, Mapping[str, float]], b: Mapping[str, Mapping[str, float]], field: str,
           metric: str) -> dict | None:
    """b - a on `field` over the instances both hold, tested as the table's `metric` (its margin)."""
    common = sorted(set(a) & set(b))
    if len(common) < 2:
        return None
    return paired_comparison([b[i][field] - a[i][field] for i in common], margin=margin_of(metric)).as_dict()


def free_by_instance(records: Sequence[Mapping], method: str) -> dict[str, dict[str, float]]:
    return {r["id"]: {"partial_accuracy": r["partial_accuracy"], "accuracy": r["accuracy"],
                            "n_correct_steps": r["n_correct_steps"]}
            for r in records if r["method"] == method}


# ---------------------------------------------------------------------------- the parts


def signal_table(rows: Sequence[Mapping]) -> dict[str, list[dict]]:
    return {s.key: rates_by_bin(rows, s) for s in SIGNALS}


def free_vs_forced(steps: Sequence[Mapping], free: Sequence[Mapping]) -> list[dict]:
    """Per model and length, per method: teacher-forced step accuracy and leading run, free
    partial accuracy, each steered method's paired gains over vanilla, and how often the free
    route's right steps equal the forced leading run (greedy decoding's identity)."""
    out = []
    for model, length in _cells(steps):
        mine = [r for r in steps if (r["model"], r["length"]) == (model, length)]
        theirs = [r for r in free if (r["model"], r["length"]) == (model, length)]
        forced = {m: per_instance(mine, m) for m in ("vanilla", *STEERED)}
        freed = {m: free_by_instance(theirs, m) for m in ("vanilla", *STEERED)}
        row: dict = {"model": model, "length": length, "instances": len(mine), "methods": {}}
        for m in forced:
            if not forced[m]:
                continue
            f, g = forced[m], freed[m]
            both = sorted(set(f) & set(g))
            same = sum(f[i]["leading_steps"] == g[i]["n_correct_steps"] for i in both)
            row["methods"][m] = {
                "tf_step_accuracy": bootstrap_ci([v["step_accuracy"] for v in f.values()]).as_dict(),
                "tf_leading": bootstrap_ci([v["leading"] for v in f.values()]).as_dict(),
                "free_partial": bootstrap_ci([v["partial_accuracy"] for v in g.values()]).as_dict() if g else None,
                "free_agrees_with_forced": None if not both else round(same / len(both), 4),
            }
            if m != "vanilla":
                row["methods"][m]["gain"] = {
                    "tf_step_accuracy": paired(forced["vanilla"], f, "step_accuracy", "tf_step_accuracy"),
                    "tf_city_logprob": paired(forced["vanilla"], f, "city_logprob", "tf_city_logprob"),
                    "tf_leading": paired(forced["vanilla"], f, "leading", "tf_leading"),
                    "free_partial": paired(freed["vanilla"], g, "partial_accuracy", "partial_accuracy")
                    if g else None,
                    "free_exact": paired(freed["vanilla"], g, "accuracy", "accuracy") if g else None}
        out.append(row)
    # the table's family: every steered method's gain at every model and length
    fill_q(g for row in out for m in row["methods"].values() for g in (m.get("gain") or {}).values())
    return out


def departures(steps: Sequence[Mapping]) -> list[dict]:
    """Per model and method: at the route step where its forced argmax first misses a city (where
    its free route leaves the gold one), what the QRHeads and the selection said, against the
    same signals over every other step."""
    out = []
    for model in sorted({r["model"] for r in steps}):
        for m in ("vanilla", *STEERED):
            at: list[Mapping] = []
            rest: list[Mapping] = []
            for r in (r for r in steps if r["model"] == model):
                miss = r["first_miss"].get(m)
                k = miss["step"] if miss and miss["city"] else None
                for s in r["steps"]:
                    (at if s["step"] == k else rest).append(s)
            if not at:
                continue

            out.append({"model": model, "method": m, "at_departure": signal_means(at, m),
                        "elsewhere": signal_means(rest, m)})
    return out


def first_miss_table(steps: Sequence[Mapping]) -> list[dict]:
    """Per model, length and method: where the forced argmax first misses a gold token (where free
    decoding leaves the gold answer): none, at a city's first token, in the first route line, and
    the tokens missed most often."""
    out = []
    for model, length in _cells(steps):
        mine = [r for r in steps if (r["model"], r["length"]) == (model, length)]
        for m in ("vanilla", *STEERED):
            misses = [r["first_miss"].get(m) for r in mine if m in r["first_miss"]]
            if not misses:
                continue
            hit = [x for x in misses if x is not None]
            texts: dict[str, int] = defaultdict(int)
            for x in hit:
                texts[x.get("text", "?")] += 1
            out.append({"model": model, "length": length, "method": m, "instances": len(misses),
                        "none": len(misses) - len(hit), "at_city": sum(x["city"] for x in hit),
                        "first_line": sum(x["step"] == 0 for x in hit),
                        "tokens": dict(sorted(texts.items(), key=lambda kv: (-kv[1], kv[0]))[:4])})
    return out


def signal_means(group: Sequence[Mapping], method: str) -> dict:
    """Mean signals over some route steps (the share whose gold edge the QRHeads rank first)."""
    def mean(values):
        values = [float(v) for v in values if v is not None]
        return round(sum(values) / len(values), 4) if values else None

    return {"steps": len(group), "gold_rank_1": mean(s["qr_rank"] == 1 for s in group),
            "qr_mass": mean(s["qr_mass"] for s in group),
            "selected_mass": mean(s.get("selected_mass") for s in group),
            "gold_selected_share": mean(s.get("gold_selected_share") for s in group),
            "margin": mean(s.get("margin", {}).get(method) for s in group)}


def gate_table(steps: Sequence[Mapping], free: Sequence[Mapping], gates: Mapping[str, dict]) -> list[dict]:
    """Per model: the dev choice and, on the test split, the gate against plain DySCO (paired)."""
    out = []
    for model, gate in sorted(gates.items()):
        mine = [r for r in steps if r["model"] == model]
        f_dysco, f_gated = per_instance(mine, "dysco"), per_instance(mine, "gated")
        ours = [r for r in free if r["model"] == model]
        g_dysco, g_gated = free_by_instance(ours, "dysco"), free_by_instance(ours, "gated")
        same = sum(s["correct"]["gated"] == s["correct"]["dysco"] for r in mine for s in r["steps"]
                   if "gated" in s["correct"])
        n = sum("gated" in s["correct"] for r in mine for s in r["steps"])
        out.append({"model": model, "min_mass": gate["min_mass"], "helps_on_dev": gate["helps_on_dev"],
                    "rule": gate["rule"], "dev_scores": gate["scores"],
                    "steps_same_as_dysco": None if not n else round(same / n, 4),
                    "gated_minus_dysco": {
                        "tf_step_accuracy": paired(f_dysco, f_gated, "step_accuracy", "tf_step_accuracy"),
                        "tf_city_logprob": paired(f_dysco, f_gated, "city_logprob", "tf_city_logprob"),
                        "free_partial": paired(g_dysco, g_gated, "partial_accuracy", "partial_accuracy"),
                        "free_exact": paired(g_dysco, g_gated, "accuracy", "accuracy")}})
    return out


def examples(rows: Sequence[Mapping]) -> dict[str, list[Mapping]]:
    """Up to EXAMPLES_PER_CLASS steps of each class, the longest contexts first."""
    out: dict[str, list[Mapping]] = defaultdict(list)
    for r in sorted(rows, key=lambda r: (-r["length"], r["model"], r["instance"], r["step_index"])):
        if len(out[r["class"]]) < EXAMPLES_PER_CLASS:
            out[r["class"]].append(r)
    return dict(out)


# ---------------------------------------------------------------------------- writing


def signals_figure(table: Mapping[str, list[dict]], control: Mapping, stem: Path) -> tuple[Path, Path]:
    panels = []
    for s in SIGNALS:
        bins = table[s.key]
        series = []
        for kind, name in (("fix", "P(fixed | vanilla wrong)"), ("break", "P(broken | vanilla right)")):
            est = [b[kind] for b in bins]
            series.append(rate_series(name, est, [f"{b['bin']} (n={b['steps']})" for b in bins]))
        panels.append(Panel(s.label, "share of steps", series, kind="bar", ylim=(0, 1)))
    panels += controlled_panels(control)
    return save_panels(panels, stem, title="Fix and break rates of DySCO (small-budget) against vanilla, teacher "
                                           "forced, test split: by one signal at a time (raw, not controlled for the "
                                           "step's difficulty), then within bins of vanilla's gold log p", ncols=4)


def render(result: Mapping) -> str:
    lines = ["# What DySCO fixes and what it breaks", "",
             "Written by `python analyses/step_account.py --figures-only` from the stores beside it.", "",
             "## Classes of the route steps (vanilla → DySCO), teacher forced, test split", ""]
    rows = [[c["model"], length_label(c["length"]), c["instances"], c["steps"],
             *[f"{c['counts'][k]} ({c['rates'][k]['mean']:.3f})" for k in CLASSES], _ci(c["net"])]
            for c in result["classes"]]
    lines += [table_markdown(["model", "length", "instances", "steps", *CLASSES, "net (fixed − broken)"], rows), ""]
    lines += render_controlled(result["controlled"])
    lines += ["## Fix and break rates by signal (both models, every length pooled; not controlled)", "",
              "P(fixed | vanilla wrong) and P(broken | vanilla right), with 95% intervals from resampling "
              "instances; `signals.png` draws them. Each signal alone: the section above controls for difficulty.",
              ""]
    for s in SIGNALS:
        lines += [f"**{s.label}**", ""]
        lines += [table_markdown(["bin", "steps", "P(fixed | vanilla wrong)", "fixed/eligible",
                                  "P(broken | vanilla right)", "broken/eligible"],
                                 [[b["bin"], b["steps"], _ci(b["fix"]),
                                   "-" if b["fix"] is None else f"{b['fix']['events']}/{b['fix']['eligible']}",
                                   _ci(b["break"]),
                                   "-" if b["break"] is None else f"{b['break']['events']}/{b['break']['eligible']}"]
                                  for b in result["signals"][s.key]]), ""]
    lines += ["## Free against forced", "",
              "`tf leading`: the route steps before the line of the first gold token the forced argmax misses, as a "
              "share of the route: what greedy free decoding keeps of the teacher-forced steps. `free partial`: "
              "LongProc's partial accuracy of the free route. `agrees`: share of instances whose free route has "
              "exactly that many right steps before its first error. Δ: paired difference to vanilla on the same "
              f"instances; {DELTA_LEGEND}", ""]
    rows = []
    for c in result["free_vs_forced"]:
        for m, v in c["methods"].items():
            g = v.get("gain", {})
            rows.append([c["model"], length_label(c["length"]), LABELS[m], _ci(v["tf_step_accuracy"]),
                         _ci(v["tf_leading"]), _ci(v["free_partial"]), v["free_agrees_with_forced"],
                         fmt_delta(g.get("tf_step_accuracy")), fmt_delta(g.get("tf_leading")),
                         fmt_delta(g.get("free_partial"))])
    lines += [table_markdown(["model", "length", "method", "tf step acc", "tf leading", "free partial", "agrees",
                              "Δ tf step acc", "Δ tf leading", "Δ free partial"], rows), ""]
    lines += ["## The first gold token each method misses (where its free route leaves the gold one)", ""]
    rows = [[f["model"], length_label(f["length"]), LABELS[f["method"]], f["instances"], f["none"], f["at_city"],
             f["first_line"], ", ".join(f"{json.dumps(t)} ×{n}" for t, n in f["tokens"].items())]
            for f in result["first_miss"]]
    lines += [table_markdown(["model", "length", "method", "instances", "no miss", "at a city", "in the first line",
                              "missed most often"], rows), ""]
    lines += ["## Where each method leaves the gold route at a city (its first forced miss is a city)", ""]
    rows = [[d["model"], LABELS[d["method"]], d["at_departure"]["steps"], *[
        f"{d['at_departure'][k]} / {d['elsewhere'][k]}"
        for k in ("gold_rank_1", "qr_mass", "selected_mass", "gold_selected_share", "margin")]]
        for d in result["departures"]]
    lines += [table_markdown(["model", "method", "departures", "gold edge ranked 1st", "QRHead mass on gold",
                              "selected mass", "gold share of selected", "own margin"], rows),
              "", "Each cell: at the departure step / over every other step.", ""]
    lines += ["## The gate (chosen on the dev split, reported on the test split)", ""]
    for g in result["gate"]:
        d = g["gated_minus_dysco"]
        lines += [f"- **{g['model']}**: min_mass {g['min_mass']} (helps on dev: {g['helps_on_dev']}); "
                  f"test steps where the gate and DySCO agree: {g['steps_same_as_dysco']}; gated − DySCO: "
                  f"tf step acc {fmt_delta(d['tf_step_accuracy'])}, tf city log p {fmt_delta(d['tf_city_logprob'])}, "
                  f"free partial {fmt_delta(d['free_partial'])}, free exact {fmt_delta(d['free_exact'])}"]
    if result["gate"]:
        lines += ["", f"The rule: {result['gate'][0]['rule']}.", ""]
    return "\n".join(lines).rstrip() + "\n"


def render_examples(chosen: Mapping[str, list[Mapping]]) -> str:
    lines = ["# Route steps of each class, as the replay shows them", "",
             "Teacher forced on the gold route; the QRHeads' attention from the replay of the gold answer, the "
             "selection from DySCO's own trace.", ""]
    for cls in CLASSES:
        for r in chosen.get(cls, []):
            s = r["step"]
            lines += [f"## {cls}: {r['model']}, {length_label(r['length'])}, instance {r['instance']}, "
                      f"step {s['step'] + 1} ({s['edge']})", ""]
            rows = [[LABELS.get(m, m), "yes" if s["correct"][m] else "no", s["picks"].get(m) or "(unresolved)",
                     s["pick_ranks"].get(m) or "-", f"{s['logprob'][m]:+.2f}", _num(s["margin"].get(m))]
                    for m in s["correct"]]
            lines += [table_markdown(["method", "right", "picked edge", "its QRHead rank", "log p(city)", "margin"],
                                     rows), "",
                      f"QRHeads on the gold edge: mass {s['qr_mass']:.3f}, rank {s['qr_rank']}; all heads: "
                      f"{s['all_mass']:.4f}, rank {s['all_rank']}; top edge's share {_num(s.get('qr_top_share'))}, "
                      f"entropy {_num(s.get('qr_entropy'))}. DySCO selected {s.get('n_selected')} keys holding "
                      f"{_num(s.get('selected_mass'))} of the relevance; the gold edge holds "
                      f"{_num(s.get('gold_selected_share'))} of them.", ""]
    return "\n".join(lines).rstrip() + "\n"


def write_reports(folder: Path) -> list[str]:
    """Every table and figure of the study from the stores under `folder`."""
    test = [r for p in glob_stores(folder / "test" / "*_steps.jsonl") for r in step_records(p)]
    if not test:
        raise ConfigError(f"no test stores under {folder / 'test'}: run the study first")
    free = [r for p in glob_stores(folder / "test" / "*_free.jsonl") for r in read_records(p)]
    gates = {g["model"]: g for g in (json.loads(p.read_text()) for p in sorted(folder.glob("gate_*.json")))}
    rows = classified(test)
    result: dict[str, Any] = {
        "classes": class_rates(rows), "signals": signal_table(rows), "controlled": controlled(rows),
        "free_vs_forced": free_vs_forced(test, free),
        "departures": departures(test), "first_miss": first_miss_table(test), "gate": gate_table(test, free, gates),
        "instances": len(test),
        "machines": sorted({r["run"]["machine"] for r in test + free if r.get("run")})}
    written: list[Path] = []
    for name, text in (("step_account.json", json.dumps(result, indent=1, ensure_ascii=False) + "\n"),
                       ("step_account.md", render(result)), ("examples.md", render_examples(examples(rows)))):
        with atomic_open(folder / name) as f:
            f.write(text)
        written.append(folder / name)
    written += list(signals_figure(result["signals"], result["controlled"], folder / "signals"))
    return [str(p) for p in written]


__all__ = ["departures", "free_vs_forced", "gate_table", "per_instance", "write_reports"]
