"""The head-ablation figure: how much each head set's mean-ablation costs, per task and length.

One panel per (task, metric); in each, grouped bars over the context lengths, one bar per
head-set group (QRHeads, random heads pooled over their draws, copy-paste heads), its height
the mean drop against no ablation and its error bar the paired 95% bootstrap interval. Drawn
from a summary (`studies.ablation_summary.summarise`), as <stem>.png and <stem>.html.
"""

from __future__ import annotations

from pathlib import Path

from dysco_interp.tasks.registry import TASKS
from dysco_interp.viz.figures import save_panels
from dysco_interp.viz.panels import Panel, Series

METRIC_TITLES = {("path_traversal", "accuracy"): "step accuracy", ("needle_qa", "accuracy"): "answer accuracy",
                 ("needle_qa", "logprob"): "answer log-prob (mean per token)"}
# each group keeps its colour in every panel, model and format
COLORS = {"qrheads": "#d62728", "random": "#7f7f7f", "copy_paste": "#1f77b4"}
ORDER = ("qrheads", "random", "copy_paste")


def length_tick(tokens: int) -> str:
    return f"{tokens // 1024}K" if tokens % 1024 == 0 else str(tokens)


def group_title(group: str, members: list[str]) -> str:
    if group == "random":
        return f"random heads (mean of {len(members)})"
    return {"qrheads": "QRHeads", "copy_paste": "copy-paste heads"}.get(group, group)


def ablation_panels(summary: dict) -> list[Panel]:
    """One bar panel per (task, metric) of a summary, bars over lengths, one series per group."""
    panels = []
    keys = list(dict.fromkeys((row["task"], metric) for row in summary["rows"] for metric in row["metrics"]))
    for task, metric in keys:
        rows = sorted((r for r in summary["rows"] if r["task"] == task and metric in r["metrics"]),
                      key=lambda r: r["length"])
        groups = {g: m["members"] for r in rows for g, m in r["metrics"][metric]["groups"].items()}
        names = [g for g in ORDER if g in groups] + sorted(g for g in groups if g not in ORDER)
        series = []
        for group in names:
            cells = [(length_tick(r["length"]), r["metrics"][metric]["groups"][group]["drop"]) for r in rows
                     if group in r["metrics"][metric]["groups"]]
            series.append(Series(group_title(group, groups[group]), [c["mean"] for _, c in cells],
                                 [c["lo"] for _, c in cells], [c["hi"] for _, c in cells], COLORS.get(group),
                                 x=[x for x, _ in cells]))
        base = ", ".join(f"{r['metrics'][metric]['baseline']['mean']:.2f} at {length_tick(r['length'])}" for r in rows)
        task_title = TASKS[task].title if task in TASKS else task
        title = f"{task_title}: {METRIC_TITLES.get((task, metric), metric)}\nunablated {base}"
        panels.append(Panel(title, "drop vs no ablation", series, xlabel="context length (tokens)", kind="bar"))
    return panels


def draw_ablation(summary: dict, stem: str | Path) -> tuple[Path, Path]:
    """<stem>.png and <stem>.html of one model's summary."""
    n = sorted({r["n"] for r in summary["rows"]})
    title = (f"{summary['model']}: mean-ablation of head outputs (hook_z), teacher forced; drop = unablated - "
             f"ablated, 95% paired bootstrap CI over {n[0] if len(n) == 1 else f'{n[0]}-{n[-1]}'} instances")
    return save_panels(ablation_panels(summary), stem, title=title, ncols=3)
