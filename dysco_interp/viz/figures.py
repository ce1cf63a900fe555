"""Each figure of the panel model in both formats at once: <stem>.png and <stem>.html.

`save_ci_lines`: line panels over shared x labels with confidence bands; `save_bars`: stacked
bar panels over shared labels with marked bars; `save_panels`: a grid of panels, each with its
own x axis. The same series keeps the same colour in the PNG and the HTML.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from dysco_interp.viz.panels import BarPanel, Panel
from dysco_interp.viz.render_html import bars_html, ci_lines_html, panels_html
from dysco_interp.viz.render_png import bars_png, ci_lines_png, panels_png


def stem_paths(stem: str | Path) -> tuple[Path, Path]:
    """<stem>.png and <stem>.html (a dot inside the stem's name stays part of it)."""
    stem = Path(stem)
    return stem.with_name(stem.name + ".png"), stem.with_name(stem.name + ".html")


def save_ci_lines(
    panels: Sequence[Panel], x_labels: Sequence[str], stem: str | Path, *, title: str, xlabel: str
) -> tuple[Path, Path]:
    """<stem>.png and <stem>.html; returns (png, html)."""
    png, html = stem_paths(stem)
    return (
        ci_lines_png(panels, x_labels, png, title=title, xlabel=xlabel),
        ci_lines_html(panels, x_labels, html, title=title, xlabel=xlabel),
    )


def save_bars(
    panels: Sequence[BarPanel],
    labels: Sequence[str],
    stem: str | Path,
    *,
    title: str,
    xlabel: str = "",
    marks: Mapping[int, str] | None = None,
    other_label: str = "other",
) -> tuple[Path, Path]:
    """<stem>.png and <stem>.html; returns (png, html)."""
    png, html = stem_paths(stem)
    return (
        bars_png(panels, labels, png, title=title, xlabel=xlabel, marks=marks, other_label=other_label),
        bars_html(panels, labels, html, title=title, xlabel=xlabel, marks=marks, other_label=other_label),
    )


def save_panels(panels: Sequence[Panel], stem: str | Path, *, title: str, ncols: int = 3) -> tuple[Path, Path]:
    """<stem>.png and <stem>.html; returns (png, html)."""
    png, html = stem_paths(stem)
    return (
        panels_png(panels, png, title=title, ncols=ncols),
        panels_html(panels, html, title=title, ncols=ncols),
    )
