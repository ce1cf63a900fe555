"""The one panel model that every line and bar figure is drawn from, in both formats.

A figure is a list of panels; a panel holds series. A `Series` either has its own x values
(`x`, a panel grid: `figures.save_panels`) or none, and then runs over the x labels that the
whole figure shares (`figures.save_ci_lines`). `lo`/`hi` give an interval per point, drawn as
a band or as error bars. None marks a missing point. `BarPanel` is the one exception: one bar
per shared label, some bars marked by category (`figures.save_bars`).

Figures are meant to be read on a projector: bar panels with many categories are drawn
`horizontal` (labels read left to right, one row per category), legends sit outside the
axes, a `ref` line marks a baseline (e.g. vanilla at 0 for paired deltas), and `annotation`
says in the panel what a flat line means (e.g. every run scores 0).

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
    horizontal: bool = False  # bars only: categories down the y axis, values along x
    ref: float | None = None  # a solid reference line on the value axis (y; x for horizontal bars)
    ref_label: str = ""
    annotation: str = ""  # text shown at the top of the panel, over its series

    def __post_init__(self):
        if self.kind not in ("line", "bar"):
            raise ValueError(f"panel kind must be 'line' or 'bar', got {self.kind!r}")
        if self.horizontal and self.kind != "bar":
            raise ValueError(f"panel {self.title!r}: only bar panels can be horizontal")


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


def categories(panel: Panel) -> list[str]:
    """A bar panel's categories, in the order the series first give them."""
    return list(dict.fromkeys(str(x) for s in panel.series for x in own_x(s)))


def legend_names(panel: Panel) -> list[str]:
    """What a panel's legend lists: its series, then its dashed mark and reference line."""
    names = [s.name for s in panel.series]
    if panel.series and panel.kind == "line" and panel.mark_x is not None:
        names.append(panel.mark_label)
    if panel.series and panel.ref is not None and panel.ref_label:
        names.append(panel.ref_label)
    return names


def same_as_next(panels: Sequence[Panel], i: int, ncols: int) -> bool:
    """True when the next panel of the same grid row would show the same legend, so the
    row's legend is drawn once, at its right."""
    j = i + 1
    return j < len(panels) and j % ncols != 0 and legend_names(panels[j]) == legend_names(panels[i])


def shares_categories_with_previous(panels: Sequence[Panel], i: int, ncols: int) -> bool:
    """A horizontal bar panel whose rows are those of its left neighbour: its labels would
    repeat them (and in the HTML overlap that neighbour), so it leaves them out."""
    p = panels[i]
    if i % ncols == 0 or not (p.kind == "bar" and p.horizontal and p.series):
        return False
    left = panels[i - 1]
    return left.kind == "bar" and left.horizontal and bool(left.series) and categories(left) == categories(p)


def log_ticks(panel: Panel) -> tuple[list[float], list[str]]:
    """Ticks of a log x axis at the values the series have, token counts written as 512, 1K, 2K...:
    readable from the back of a room, unlike 2^10 or plotly's 2 3 4 5 between powers of ten."""
    values = sorted({float(x) for s in panel.series for x in own_x(s)})

    def text(v: float) -> str:
        return f"{int(v) // 1024}K" if v >= 1024 and v % 1024 == 0 else f"{v:g}"

    return values, [text(v) for v in values]


PANEL_HEIGHT_IN = 3.4  # a line panel, or a bar panel with few categories
ROW_HEIGHT_IN = 0.3  # one category of a horizontal bar panel


def panel_height(panel: Panel) -> float:
    """Inches a panel needs: a horizontal bar panel grows with its categories, so every label
    keeps a readable size; crowded upright bars need room for their slanted labels."""
    if panel.kind == "bar" and panel.series:
        n = len(categories(panel))
        if panel.horizontal:
            return max(2.4, ROW_HEIGHT_IN * n * max(1.0, len(panel.series) / 2) + 1.3)
        if n > 12:
            return 5.6
    return PANEL_HEIGHT_IN


def row_heights(panels: Sequence[Panel], ncols: int) -> list[float]:
    """Inches per grid row: its tallest panel."""
    nrows, ncols = grid_shape(len(panels), ncols)
    return [max(panel_height(p) for p in panels[r * ncols:(r + 1) * ncols]) for r in range(nrows)]


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
