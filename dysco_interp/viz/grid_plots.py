"""A grid of panels, each with its own x axis, as a PNG (matplotlib) and a self-contained
HTML file (plotly, library inlined, opens offline).

Each panel holds lines (numeric x, optional log scale, error bars from lo/hi, an optional
dashed mark such as a default value) or grouped bars (categorical x). A series keeps one
colour across panels and formats. Panels without data show their note instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")


@dataclass(frozen=True)
class Line:
    """One series of a panel; None marks a missing point."""

    name: str
    x: Sequence
    y: Sequence[float | None]
    lo: Sequence[float | None] | None = None
    hi: Sequence[float | None] | None = None

    def __post_init__(self):
        for label, vals in (("y", self.y), ("lo", self.lo), ("hi", self.hi)):
            if vals is not None and len(vals) != len(self.x):
                raise ValueError(f"series {self.name!r}: {label} has {len(vals)} values for {len(self.x)} x values")
        if (self.lo is None) != (self.hi is None):
            raise ValueError(f"series {self.name!r}: give both lo and hi, or neither")


@dataclass(frozen=True)
class Panel:
    title: str
    xlabel: str
    ylabel: str
    lines: Sequence[Line] = field(default_factory=tuple)
    kind: str = "line"  # "line" (numeric x) or "bar" (grouped bars over categorical x)
    log_x: bool = False
    log_y: bool = False
    mark_x: float | None = None  # dashed vertical line, e.g. the default value
    mark_label: str = "default"
    note: str = "no data"  # shown when the panel has no lines

    def __post_init__(self):
        if self.kind not in ("line", "bar"):
            raise ValueError(f"panel kind must be 'line' or 'bar', got {self.kind!r}")


def _num(v) -> float:
    return math.nan if v is None else float(v)


def _colors(panels: Sequence[Panel]) -> dict[str, str]:
    out: dict[str, str] = {}
    for p in panels:
        for line in p.lines:
            out.setdefault(line.name, COLORS[len(out) % len(COLORS)])
    return out


def _errors(line: Line) -> tuple[list[float], list[float]] | None:
    if line.lo is None:
        return None
    below = [max(0.0, _num(y) - _num(lo)) for y, lo in zip(line.y, line.lo)]
    above = [max(0.0, _num(hi) - _num(y)) for y, hi in zip(line.y, line.hi)]
    return below, above


def _y_extent(panel: Panel) -> tuple[float, float]:
    vals = [_num(v) for line in panel.lines for seq in (line.y, line.lo or (), line.hi or ()) for v in seq]
    vals = [v for v in vals if not math.isnan(v)] or [0.0, 1.0]
    lo, hi = min(vals), max(vals)
    pad = 0.05 * (hi - lo) if hi > lo else 0.05 * (abs(hi) or 1.0)
    return lo - pad, hi + pad


def _grid(n: int, ncols: int) -> tuple[int, int]:
    if n < 1:
        raise ValueError("a figure needs at least one panel")
    ncols = max(1, min(ncols, n))
    return math.ceil(n / ncols), ncols


def panels_png(panels: Sequence[Panel], path: str | Path, *, title: str, ncols: int = 3) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    nrows, ncols = _grid(len(panels), ncols)
    colors = _colors(panels)
    # Figure + Agg canvas: no pyplot global state, works without a display.
    crowded = any(p.kind == "bar" and len({str(x) for line in p.lines for x in line.x}) > 12 for p in panels)
    fig = Figure(figsize=(4.4 * ncols, (5.6 if crowded else 3.4) * nrows + 0.6))  # room for upright labels
    FigureCanvasAgg(fig)
    for i, panel in enumerate(panels):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        ax.set_title(panel.title, fontsize=9)
        ax.set_xlabel(panel.xlabel, fontsize=8)
        ax.set_ylabel(panel.ylabel, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if not panel.lines:
            ax.text(0.5, 0.5, panel.note, ha="center", va="center", transform=ax.transAxes, fontsize=8, wrap=True)
            continue
        if panel.kind == "bar":
            cats = list(dict.fromkeys(str(x) for line in panel.lines for x in line.x))
            width = 0.8 / len(panel.lines)
            for j, line in enumerate(panel.lines):
                pos = [cats.index(str(x)) - 0.4 + width * (j + 0.5) for x in line.x]
                err = _errors(line)
                ax.bar(pos, [_num(y) for y in line.y], width, color=colors[line.name], label=line.name,
                       yerr=None if err is None else [err[0], err[1]], capsize=3)
            ax.set_xticks(range(len(cats)), cats, rotation=30 if len(cats) <= 12 else 75, ha="right", fontsize=6)
        else:
            for line in panel.lines:
                order = sorted(range(len(line.x)), key=lambda k: float(line.x[k]))
                xs = [float(line.x[k]) for k in order]
                ys = [_num(line.y[k]) for k in order]
                err = _errors(line)
                yerr = None if err is None else [[err[0][k] for k in order], [err[1][k] for k in order]]
                ax.errorbar(xs, ys, yerr=yerr, marker="o", markersize=4, capsize=3, color=colors[line.name],
                            label=line.name)
            if panel.log_x:
                ax.set_xscale("log", base=2)
            if panel.mark_x is not None:
                ax.axvline(panel.mark_x, color="black", linestyle="--", linewidth=0.8, label=panel.mark_label)
        if panel.log_y:
            ax.set_yscale("log")
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def panels_html(panels: Sequence[Panel], path: str | Path, *, title: str, ncols: int = 3) -> Path:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    nrows, ncols = _grid(len(panels), ncols)
    colors = _colors(panels)
    fig = make_subplots(rows=nrows, cols=ncols, subplot_titles=[p.title for p in panels])
    shown: set[str] = set()
    for i, panel in enumerate(panels):
        row, col = i // ncols + 1, i % ncols + 1
        fig.update_xaxes(title_text=panel.xlabel, row=row, col=col)
        fig.update_yaxes(title_text=panel.ylabel, row=row, col=col)
        if not panel.lines:
            fig.add_annotation(text=panel.note.replace("\n", "<br>"), showarrow=False, xref="x domain",
                               yref="y domain", x=0.5, y=0.5,
                               row=row, col=col)
            continue
        for line in panel.lines:
            err = _errors(line)
            error_y = None if err is None else {"type": "data", "array": err[1], "arrayminus": err[0], "visible": True}
            style = {"name": line.name, "legendgroup": line.name, "showlegend": line.name not in shown,
                     "error_y": error_y}
            # plain floats and None: plotly writes readable JSON numbers into the file
            y = [None if v is None else float(v) for v in line.y]
            if panel.kind == "bar":
                trace = go.Bar(x=[str(x) for x in line.x], y=y, marker_color=colors[line.name], **style)
            else:
                order = sorted(range(len(line.x)), key=lambda k: float(line.x[k]))
                if error_y is not None:
                    error_y["array"] = [err[1][k] for k in order]
                    error_y["arrayminus"] = [err[0][k] for k in order]
                trace = go.Scatter(x=[float(line.x[k]) for k in order], y=[y[k] for k in order],
                                   mode="lines+markers", line={"color": colors[line.name]}, **style)
            fig.add_trace(trace, row=row, col=col)
            shown.add(line.name)
        if panel.kind == "line" and panel.log_x:
            fig.update_xaxes(type="log", row=row, col=col)
        if panel.log_y:
            fig.update_yaxes(type="log", row=row, col=col)
        if panel.kind == "line" and panel.mark_x is not None:
            # a trace, not a layout shape: traces take data values on log axes too
            lo, hi = _y_extent(panel)
            fig.add_trace(go.Scatter(x=[panel.mark_x, panel.mark_x], y=[lo, hi], mode="lines",
                                     line={"color": "black", "dash": "dash", "width": 1}, name=panel.mark_label,
                                     legendgroup="__mark", showlegend="__mark" not in shown, hoverinfo="name"),
                          row=row, col=col)
            shown.add("__mark")
    fig.update_layout(title=title, barmode="group", width=430 * ncols + 140, height=330 * nrows + 120)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(path, include_plotlyjs=True, full_html=True)
    return path


def save_panels(panels: Sequence[Panel], stem: str | Path, *, title: str, ncols: int = 3) -> tuple[Path, Path]:
    """<stem>.png and <stem>.html; returns (png, html)."""
    stem = Path(stem)
    return (
        panels_png(panels, stem.with_name(stem.name + ".png"), title=title, ncols=ncols),
        panels_html(panels, stem.with_name(stem.name + ".html"), title=title, ncols=ncols),
    )
