"""The panel model (`panels.py`) drawn by matplotlib, as PNG files.

Every figure is a `Figure` on an Agg canvas: no pyplot global state, works without a display.
matplotlib is imported inside the functions, so importing this module needs only numpy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from dysco_interp.viz.panels import (
    CI_COLORS,
    GRID_COLORS,
    PLAIN_BAR_COLOR,
    BarPanel,
    Panel,
    as_float,
    check_bars,
    check_shared_x,
    error_bars,
    grid_shape,
    mark_colors,
    own_x,
    series_colors,
)


def agg_figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def save_png(fig, path: str | Path, dpi: int) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return path


def ci_lines_png(
    panels: Sequence[Panel], x_labels: Sequence[str], path: str | Path, *, title: str, xlabel: str
) -> Path:
    """Panels side by side over the shared x labels, each a line per series with its band shaded."""
    check_shared_x(panels, x_labels)
    colors = series_colors(panels, CI_COLORS)
    fig = agg_figure(4.2 * len(panels) + 0.6, 3.8)
    x = np.arange(len(x_labels))
    for i, panel in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        for s in panel.series:
            y = np.array([as_float(v) for v in s.y])
            ax.plot(x, y, marker="o", color=colors[s.name], label=s.name)
            if s.lo is not None and s.hi is not None:
                lo, hi = np.array([as_float(v) for v in s.lo]), np.array([as_float(v) for v in s.hi])
                ax.fill_between(x, lo, hi, color=colors[s.name], alpha=0.2, linewidth=0)
        ax.set_xticks(x, list(x_labels))
        ax.set_xlabel(xlabel)
        ax.set_ylabel(panel.ylabel)
        ax.set_title(panel.title, fontsize=10)
        if panel.ylim is not None:
            ax.set_ylim(*panel.ylim)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return save_png(fig, path, dpi=120)


def bars_png(
    panels: Sequence[BarPanel],
    labels: Sequence[str],
    path: str | Path,
    *,
    title: str,
    xlabel: str = "",
    marks: Mapping[int, str] | None = None,
    other_label: str = "other",
) -> Path:
    """Panels stacked over shared bars; `marks` (bar index -> category) colours and names bars."""
    from matplotlib.patches import Patch

    marks = dict(marks or {})
    check_bars(panels, labels, marks)
    names = mark_colors(marks)
    colors = [names[marks[i]] if i in marks else PLAIN_BAR_COLOR for i in range(len(labels))]
    n = len(labels)
    fig = agg_figure(min(24.0, max(7.0, 0.14 * n + 2.5)), 2.6 * len(panels) + 1.6)
    x = np.arange(n)
    axes: list = []
    for i, panel in enumerate(panels):
        ax = fig.add_subplot(len(panels), 1, i + 1, sharex=axes[0] if axes else None)
        axes.append(ax)
        ax.bar(x, [float(v) for v in panel.values], color=colors, width=0.85)
        if panel.threshold is not None:
            ax.axhline(panel.threshold, color="black", linestyle="--", linewidth=0.8, label=panel.threshold_label)
        ax.set_ylabel(panel.ylabel, fontsize=9)
        ax.set_title(panel.title, fontsize=10)
        ax.margins(x=0.005)
        handles = [Patch(color=c, label=m) for m, c in names.items()]
        handles += [Patch(color=PLAIN_BAR_COLOR, label=other_label)]
        if panel.threshold is not None and panel.threshold_label:
            handles += ax.get_legend_handles_labels()[0]
        # outside the axes, so no bar is hidden behind it
        ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.005, 1.0), borderaxespad=0)
    ax = axes[-1]
    # Every label while they fit; past that only the marked bars are named.
    shown = range(n) if n <= 80 else sorted(marks)
    ax.set_xticks(list(shown), [labels[i] for i in shown], rotation=90, fontsize=6 if n > 40 else 8)
    for i in range(len(axes) - 1):
        axes[i].tick_params(labelbottom=False)
    if xlabel:
        ax.set_xlabel(xlabel)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return save_png(fig, path, dpi=120)


def panels_png(panels: Sequence[Panel], path: str | Path, *, title: str, ncols: int = 3) -> Path:
    """A grid of panels, each with its own x axis: lines with error bars, or grouped bars."""
    nrows, ncols = grid_shape(len(panels), ncols)
    colors = series_colors(panels, GRID_COLORS)
    crowded = any(p.kind == "bar" and len({str(x) for s in p.series for x in own_x(s)}) > 12 for p in panels)
    fig = agg_figure(4.4 * ncols, (5.6 if crowded else 3.4) * nrows + 0.6)  # room for upright labels
    for i, panel in enumerate(panels):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        ax.set_title(panel.title, fontsize=9)
        ax.set_xlabel(panel.xlabel, fontsize=8)
        ax.set_ylabel(panel.ylabel, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if not panel.series:
            ax.text(0.5, 0.5, panel.note, ha="center", va="center", transform=ax.transAxes, fontsize=8, wrap=True)
            continue
        if panel.kind == "bar":
            cats = list(dict.fromkeys(str(x) for s in panel.series for x in own_x(s)))
            width = 0.8 / len(panel.series)
            for j, s in enumerate(panel.series):
                pos = [cats.index(str(x)) - 0.4 + width * (j + 0.5) for x in own_x(s)]
                err = error_bars(s)
                ax.bar(pos, [as_float(y) for y in s.y], width, color=colors[s.name], label=s.name,
                       yerr=None if err is None else [err[0], err[1]], capsize=3)
            ax.set_xticks(range(len(cats)), cats, rotation=30 if len(cats) <= 12 else 75, ha="right", fontsize=6)
        else:
            for s in panel.series:
                own = own_x(s)
                order = sorted(range(len(own)), key=lambda k: float(own[k]))
                xs = [float(own[k]) for k in order]
                ys = [as_float(s.y[k]) for k in order]
                err = error_bars(s)
                yerr = None if err is None else [[err[0][k] for k in order], [err[1][k] for k in order]]
                ax.errorbar(xs, ys, yerr=yerr, marker="o", markersize=4, capsize=3, color=colors[s.name],
                            label=s.name)
            if panel.log_x:
                ax.set_xscale("log", base=2)
            if panel.mark_x is not None:
                ax.axvline(panel.mark_x, color="black", linestyle="--", linewidth=0.8, label=panel.mark_label)
        if panel.log_y:
            ax.set_yscale("log")
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_png(fig, path, dpi=110)
