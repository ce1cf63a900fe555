"""The selection-budget figure: DySCO's teacher-forced gain over vanilla against the selection size.

Drawn from `studies.budget_report.budget_curves` rows. One row of panels per model, one panel
per (task, length); x is the cap K on a log2 axis (a second figure, <stem>-fraction, puts the
cap as a share of the prompt on x); y is the paired gain over vanilla with its 95% bootstrap
interval as error bars; one line per beta for QRHeads (settings run at one budget only are
left to the curves table), the random-head lines in greys and
oranges at the betas where they ran; a black line marks zero (no change from vanilla).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from dysco_interp.errors import ConfigError
from dysco_interp.tasks.registry import TASKS
from dysco_interp.viz.figures import save_panels
from dysco_interp.viz.panels import Panel, Series

# QRHeads in saturated colours, random heads in greys and oranges: told apart at a glance
QR_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#17becf", "#8c564b", "#e377c2")
RANDOM_COLORS = ("#7f7f7f", "#ff7f0e", "#bcbd22", "#525252", "#fdae6b")
ZERO = "no change (vanilla)"
X_LABELS = {"K": "cap K on boosted keys (log scale)", "fraction": "cap as a share of the prompt K/n (log scale)"}


def line_key(row: Mapping) -> tuple:
    """What one line of a panel holds fixed while the budget moves."""
    return (row["heads"] != "qrheads", row["beta"], row["top_p"], tuple(sorted(row["other"].items())),
            row.get("head_seed") or 0)


def line_names(rows: Sequence[Mapping]) -> dict[tuple, str]:
    """A legend name per line, naming p, other parameters and seeds only where the figure varies them."""
    keys = sorted({line_key(r) for r in rows})
    many_p = len({k[2] for k in keys}) > 1
    many_seeds = len({k[4] for k in keys if k[0]}) > 1
    names = {}
    for random, beta, p, other, seed in keys:
        name = f"{'random heads' if random else 'QRHeads'} β={beta:g}"
        name += f", p={p:g}" if many_p else ""
        name += "".join(f", {k}={v}" for k, v in other)
        name += f", seed {seed}" if random and many_seeds else ""
        names[(random, beta, p, other, seed)] = name
    return names


def line_colors(names: Mapping[tuple, str]) -> dict[str, str]:
    colors: dict[str, str] = {}
    for random in (False, True):
        palette = RANDOM_COLORS if random else QR_COLORS
        for i, key in enumerate(k for k in sorted(names) if k[0] == random):
            colors[names[key]] = palette[i % len(palette)]
    return colors


def columns(rows: Sequence[Mapping]) -> list[tuple[str, int]]:
    """(task, length) of every panel column, tasks in the registry's order, then by length."""
    order = {t: i for i, t in enumerate(TASKS)}
    return sorted({(r["task"], r["length"]) for r in rows}, key=lambda c: (order.get(c[0], len(order)), c[0], c[1]))


def budget_panels(rows: Sequence[Mapping], budget: str = "K") -> tuple[list[Panel], int]:
    """(panels, columns) of one budget kind ("K" or "fraction"), model by model in grid order;
    a (model, task, length) without runs is an empty panel saying so."""
    rows = [r for r in rows if r["budget"][0] == budget]
    # a setting run at one budget only (the p sweep sits at K 4096) is a point, not a curve:
    # it stays in the curves table and off the figure, which it would only crowd
    budgets: dict[tuple, set] = {}
    for r in rows:
        budgets.setdefault(line_key(r), set()).add(r["budget"][1])
    rows = [r for r in rows if len(budgets[line_key(r)]) > 1] or rows  # only points: draw them
    names = line_names(rows)
    colors = line_colors(names)
    cols = columns(rows)
    panels = []
    for model in sorted({r["model"] for r in rows}):
        for task, length in cols:
            cell = [r for r in rows if (r["model"], r["task"], r["length"]) == (model, task, length)]
            title = f"{model}: {TASKS[task].title if task in TASKS else task} {length}"
            metric = cell[0]["metric"] if cell else ""
            vanilla = cell[0]["vanilla"].get(metric) if cell else None
            title += f"\nvanilla {metric} {vanilla['mean']:.3f}" if vanilla else ""
            series = []
            for key, name in names.items():
                points = sorted((r for r in cell if line_key(r) == key and r["gain"]), key=lambda r: r["budget"][1])
                if points:
                    series.append(Series(name, [r["gain"]["mean"] for r in points], [r["gain"]["lo"] for r in points],
                                         [r["gain"]["hi"] for r in points], colors[name],
                                         x=[r["budget"][1] for r in points]))
            if series:
                xs = [x for s in series for x in s.x or ()]
                series.append(Series(ZERO, [0.0, 0.0], color="#000000", x=[min(xs), max(xs)]))
            note = "not run" if not cell else "no vanilla on the same instances"
            panels.append(Panel(title, f"Δ {metric} vs vanilla" if metric else "", series, xlabel=X_LABELS[budget],
                                log_x=True, note=note))
    return panels, max(1, len(cols))


def budget_figure(rows: Sequence[Mapping], stem: str | Path) -> dict[str, tuple[Path, Path]]:
    """<stem>.png/.html (x = K) and, when fraction-capped runs exist, <stem>-fraction.png/.html.
    Returns {budget kind: (png, html)}."""
    if not rows:
        raise ConfigError("no budget rows to draw (no DySCO teacher-forced records?)")
    stem = Path(stem)
    n = sorted({r["n"] for r in rows})
    span = f"{n[0]}" if len(n) == 1 else f"{n[0]}-{n[-1]}"
    out = {}
    for budget in ("K", "fraction"):
        if not any(r["budget"][0] == budget for r in rows):
            continue
        panels, ncols = budget_panels(rows, budget)
        title = (f"Selection budget, dev split, teacher forced: gain over vanilla against the cap "
                 f"{'K' if budget == 'K' else 'K/n'}\n95% paired bootstrap CI over {span} instances")
        path = stem if budget == "K" else stem.with_name(stem.name + "-fraction")
        out[budget] = save_panels(panels, path, title=title, ncols=ncols)
    return out
