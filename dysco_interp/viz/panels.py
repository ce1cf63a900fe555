"""The one panel model that every line and bar figure is drawn from, in both formats.

A figure is a list of panels; a panel holds series. A `Series` either has its own x values
(`x`, a panel grid: `figures.save_panels`) or none, and then runs over the x labels that the
whole figure shares (`figures.save_ci_lines`). `lo`/`hi` give an interval per point, drawn as
a band or as error bars. None marks a missing point. `BarPanel` is the one exception: one bar
per shared label, some bars marked by category (`figures.save_bars`).

A series keeps one colour across panels and formats (`series_colors`). This module needs no
plotting library: the renderers (`render_png`, `render_html`) import theirs.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

# The CI-line palette puts grey third: the figures it draws compare two methods and a baseline.
CI_COLORS = ("#1f77b4", "#d62728", "#7f7f7f", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf")
GRID_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")
MARK_COLORS = ("#d62728", "#ff7f0e", "#2ca02c", "#9467bd")
PLAIN_BAR_COLOR = "#9ecae1"


@dataclass(frozen=True)
class Series:
    """One named line (or bar group) of a panel; None marks a missing point.

    `x`: the series' own x values, or None to run over the figure's shared x labels.
    """

    name: str
    y: Sequence[float | None]
    lo: Sequence[float | None] | None = None
    hi: Sequence[float | None] | None = None
    color: str | None = None
    x: Sequence | None = None

    def __post_init__(self):
        if self.x is not None:
            for label, vals in (("y", self.y), ("lo", self.lo), ("hi", self.hi)):
                if vals is not None and len(vals) != len(self.x):
                    raise ValueError(f"series {self.name!r}: {label} has {len(vals)} values for {len(self.x)} x values")
        if (self.lo is None) != (self.hi is None):
            raise ValueError(f"series {self.name!r}: give both lo and hi, or neither")


@dataclass(frozen=True)
class Panel:
    """One subplot: its series, its axes and what to show when it has no series."""

    title: str
    ylabel: str
    series: Sequence[Series] = field(default_factory=tuple)
    xlabel: str = ""
    kind: Literal["line", "bar"] = "line"  # "bar": grouped bars over categorical x
    log_x: bool = False
    log_y: bool = False
    ylim: tuple[float, float] | None = None
    mark_x: float | None = None  # dashed vertical line, e.g. the default value
    mark_label: str = "default"
    note: str = "no data"  # shown when the panel has no series

    def __post_init__(self):
        if self.kind not in ("line", "bar"):
            raise ValueError(f"panel kind must be 'line' or 'bar', got {self.kind!r}")


@dataclass(frozen=True)
class BarPanel:
    """One bar per shared label; `threshold` draws a dashed line (e.g. a top-5% cut-off)."""

    title: str
    ylabel: str
    values: Sequence[float]
    threshold: float | None = None
    threshold_label: str = ""


def check_shared_x(panels: Sequence[Panel], x_labels: Sequence[str]) -> None:
    """Every series of every panel has one value per shared x label."""
    if not panels or not x_labels:
        raise ValueError("a line figure needs at least one panel and one x label")
    for panel in panels:
        if not panel.series:
            raise ValueError(f"panel {panel.title!r} has no series")
        for s in panel.series:
            for name, vals in (("y", s.y), ("lo", s.lo), ("hi", s.hi)):
                if vals is not None and len(vals) != len(x_labels):
                    raise ValueError(
                        f"series {s.name!r} in panel {panel.title!r}: {name} has {len(vals)} values "
                        f"for {len(x_labels)} x labels"
                    )


def check_bars(panels: Sequence[BarPanel], labels: Sequence[str], marks: Mapping[int, str]) -> None:
    if not panels or not labels:
        raise ValueError("a bar figure needs at least one panel and one bar")
    for panel in panels:
        if len(panel.values) != len(labels):
            raise ValueError(f"panel {panel.title!r} has {len(panel.values)} values for {len(labels)} bars")
    bad = [i for i in marks if not 0 <= i < len(labels)]
    if bad:
        raise ValueError(f"marked bars {bad} are outside the {len(labels)} bars")


def grid_shape(n: int, ncols: int) -> tuple[int, int]:
    """(rows, columns) of a grid of n panels, at most `ncols` wide."""
    if n < 1:
        raise ValueError("a figure needs at least one panel")
    ncols = max(1, min(ncols, n))
    return math.ceil(n / ncols), ncols


def series_colors(panels: Sequence[Panel], palette: Sequence[str]) -> dict[str, str]:
    """One colour per series name, the same in every panel and format."""
    colors: dict[str, str] = {}
    for panel in panels:
        for s in panel.series:
            if s.name not in colors:
                colors[s.name] = s.color or palette[len(colors) % len(palette)]
    return colors


def own_x(series: Series) -> Sequence:
    """The series' own x values, which a panel grid needs."""
    if series.x is None:
        raise ValueError(f"series {series.name!r} has no x values; a panel grid needs them")
    return series.x


def mark_colors(marks: Mapping[int, str]) -> dict[str, str]:
    """One colour per mark category, in the order the categories first appear."""
    names: dict[str, str] = {}
    for name in marks.values():
        if name not in names:
            names[name] = MARK_COLORS[len(names) % len(MARK_COLORS)]
    return names


def error_bars(series: Series) -> tuple[list[float], list[float]] | None:
    """(below, above) distances from each point to its interval's ends; None without one."""
    if series.lo is None or series.hi is None:
        return None
    below = [max(0.0, as_float(y) - as_float(lo)) for y, lo in zip(series.y, series.lo)]
    above = [max(0.0, as_float(hi) - as_float(y)) for y, hi in zip(series.y, series.hi)]
    return below, above


def y_extent(panel: Panel) -> tuple[float, float]:
    """The panel's y range over values and intervals, padded by 5%."""
    vals = [as_float(v) for s in panel.series for seq in (s.y, s.lo or (), s.hi or ()) for v in seq]
    vals = [v for v in vals if not math.isnan(v)] or [0.0, 1.0]
    lo, hi = min(vals), max(vals)
    pad = 0.05 * (hi - lo) if hi > lo else 0.05 * (abs(hi) or 1.0)
    return lo - pad, hi + pad


def as_float(v) -> float:
    """A point for matplotlib: None becomes NaN, a gap in the line."""
    return math.nan if v is None else float(v)


def as_json_number(v):
    """A point for plotly: NaN and None become null, a gap in the line."""
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def html_title(title: str) -> str:
    """Line breaks of a matplotlib title, as plotly writes them."""
    return "<br>".join(html.escape(line) for line in title.split("\n"))


def rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i : i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"
