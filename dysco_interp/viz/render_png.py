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
    categories,
    check_bars,
    check_shared_x,
    error_bars,
    grid_shape,
    log_ticks,
    mark_colors,
    own_x,
    row_heights,
    same_as_next,
    series_colors,
    shares_categories_with_previous,
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
    fig = agg_figure(4.2 * len(panels) + 0.6, 4.2)
    fig.set_layout_engine("constrained")
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
    # one legend for every panel (a series keeps its colour throughout), below them: it covers no band
    handles: dict[str, object] = {}
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    # at most three a row: one row of many names runs off the figure's edges
    fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncols=min(len(handles), 3),
               fontsize=9, frameon=False)
    fig.suptitle(title, fontsize=11)
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


def legend_outside(ax, handles=None, **kw) -> None:
    """The axes' legend to its right, outside, so it covers no point or error bar (the figure's
    constrained layout makes room for it)."""
    if handles is None:
        handles = ax.get_legend_handles_labels()[0]
    if handles:
        ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0,
                  frameon=False, **kw)


def draw_bar_series(ax, panel: Panel, colors: Mapping[str, str], show_labels: bool) -> None:
    """Grouped bars, upright over slanted labels or, for a horizontal panel, one row per category
    with its label read left to right (first category at the top)."""
    cats = categories(panel)
    width = 0.8 / len(panel.series)
    for j, s in enumerate(panel.series):
        pos = [cats.index(str(x)) - 0.4 + width * (j + 0.5) for x in own_x(s)]
        err = error_bars(s)
        err_arg = None if err is None else [err[0], err[1]]
        values = [as_float(y) for y in s.y]
        if panel.horizontal:
            ax.barh(pos, values, width, color=colors[s.name], label=s.name, xerr=err_arg, capsize=3)
        else:
            ax.bar(pos, values, width, color=colors[s.name], label=s.name, yerr=err_arg, capsize=3)
    if panel.horizontal:
        ax.set_yticks(range(len(cats)), cats if show_labels else [""] * len(cats), fontsize=8)
        ax.set_ylim(len(cats) - 0.5, -0.5)
        ax.grid(False, axis="y")
    else:
        ax.set_xticks(range(len(cats)), cats, rotation=30 if len(cats) <= 12 else 75, ha="right", fontsize=7)


def draw_line_series(ax, panel: Panel, colors: Mapping[str, str]) -> None:
    for s in panel.series:
        own = own_x(s)
        order = sorted(range(len(own)), key=lambda k: float(own[k]))
        xs = [float(own[k]) for k in order]
        ys = [as_float(s.y[k]) for k in order]
        err = error_bars(s)
        yerr = None if err is None else [[err[0][k] for k in order], [err[1][k] for k in order]]
        ax.errorbar(xs, ys, yerr=yerr, marker="o", markersize=4, capsize=3, color=colors[s.name], label=s.name)
    if panel.log_x:
        from matplotlib.ticker import NullLocator

        ax.set_xscale("log", base=2)
        ax.set_xticks(*log_ticks(panel))
        ax.xaxis.set_minor_locator(NullLocator())
    if panel.mark_x is not None:
        ax.axvline(panel.mark_x, color="black", linestyle="--", linewidth=0.8, label=panel.mark_label)


def panels_png(panels: Sequence[Panel], path: str | Path, *, title: str, ncols: int = 3) -> Path:
    """`panels_figure` as a PNG file."""
    return save_png(panels_figure(panels, title=title, ncols=ncols), path, dpi=110)


def panels_figure(panels: Sequence[Panel], *, title: str, ncols: int = 3):
    """A grid of panels, each with its own x axis: lines with error bars, or grouped bars
    (upright or horizontal). Legends sit right of their panel; a grid row whose panels list
    the same entries shows its legend once, right of its last panel."""
    nrows, ncols = grid_shape(len(panels), ncols)
    colors = series_colors(panels, GRID_COLORS)
    heights = row_heights(panels, ncols)
    # horizontal bar panels carry their row labels inside their column
    width = 6.0 if any(p.horizontal for p in panels) else 5.0
    fig = agg_figure(width * ncols + 1.6, sum(heights) + 0.7)
    fig.set_layout_engine("constrained")
    grid = fig.add_gridspec(nrows, ncols, height_ratios=heights)
    for i, panel in enumerate(panels):
        ax = fig.add_subplot(grid[i // ncols, i % ncols])
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel(panel.xlabel, fontsize=9)
        ax.set_ylabel(panel.ylabel, fontsize=9)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        if not panel.series:
            ax.text(0.5, 0.5, panel.note, ha="center", va="center", transform=ax.transAxes, fontsize=9, wrap=True)
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        if panel.kind == "bar":
            draw_bar_series(ax, panel, colors, not shares_categories_with_previous(panels, i, ncols))
        else:
            draw_line_series(ax, panel, colors)
        if panel.ref is not None:
            line = ax.axvline if panel.horizontal else ax.axhline
            # over bars (which would hide it), under lines and their error bars
            line(panel.ref, color="black", linewidth=1.2, label=panel.ref_label or None,
                 zorder=3 if panel.kind == "bar" else 1.5)
        if panel.log_y:
            from matplotlib.ticker import NullFormatter

            (ax.set_xscale if panel.horizontal else ax.set_yscale)("log")
            value_axis = ax.xaxis if panel.horizontal else ax.yaxis
            value_axis.set_minor_formatter(NullFormatter())  # "2x10^2 3x10^2 ..." would run into each other
        if panel.ylim is not None:
            (ax.set_xlim if panel.horizontal else ax.set_ylim)(*panel.ylim)
        if panel.annotation:
            ax.text(0.5, 0.96, panel.annotation, ha="center", va="top", transform=ax.transAxes, fontsize=8,
                    bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": "0.6"})
        if not same_as_next(panels, i, ncols):
            legend_outside(ax)
    fig.suptitle(title, fontsize=12)
    return fig
