"""Figures: matplotlib PNGs and self-contained plotly HTML (the plotly.js library is
inlined, so the file opens offline). One small function per figure and format.

Head-score heatmap: x = query head, y = layer (layer 0 at the top), unscored heads (-1,
TransformerLens' head_detector convention, or a False entry of `scored`) blank on grey.

Also generic figures for the analysis scripts, each as PNG + HTML with the same colours:
line panels with confidence bands over shared x labels (`save_ci_lines`), stacked bar
panels with marked bars (`save_bars`), and plain tables (`table_markdown`, `table_html`).
matplotlib and plotly are imported inside the functions: importing this module needs only
numpy.
"""

from __future__ import annotations

import math
import html as _html
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

UNSCORED_COLOR = "#d9d9d9"


def head_score_grid(scores, scored=None) -> np.ndarray:
    """[L, H] float array with NaN where a head was not scored.

    `scores` is a tensor/array/nested list; without `scored`, exactly -1 means unscored.
    """
    grid = np.array(scores.tolist() if hasattr(scores, "tolist") else scores, dtype=float)
    if grid.ndim != 2 or grid.size == 0:
        raise ValueError(f"head scores must be a non-empty [n_layers, n_heads] matrix, got shape {grid.shape}")
    mask = grid == -1.0 if scored is None else ~np.array(scored.tolist() if hasattr(scored, "tolist") else scored, dtype=bool)
    if mask.shape != grid.shape:
        raise ValueError(f"scored mask {mask.shape} does not match scores {grid.shape}")
    grid[mask] = np.nan
    return grid


def head_scores_title(model: str | None, method: str, n_examples: int | None = None) -> str:
    extra = f", {n_examples} examples" if n_examples else ""
    return f"{method} head scores: {model or 'model'}{extra}"


def _highlight(highlight: Iterable[Sequence[int]] | None) -> list[tuple[int, int]]:
    return [(int(h[0]), int(h[1])) for h in (highlight or [])]


def head_scores_png(
    scores,
    path: str | Path,
    *,
    title: str,
    scored=None,
    highlight: Iterable[Sequence[int]] | None = None,
    cmap: str = "viridis",
) -> Path:
    """Write the heatmap as a PNG; `highlight` heads (e.g. the top-k) get a red frame."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    grid = head_score_grid(scores, scored)
    n_layers, n_heads = grid.shape
    # Figure + Agg canvas: no pyplot global state, works without a display.
    fig = Figure(figsize=(max(4.0, 0.28 * n_heads + 2.5), max(3.0, 0.22 * n_layers + 1.5)))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_facecolor(UNSCORED_COLOR)
    colors = matplotlib.colormaps[cmap].with_extremes(bad=UNSCORED_COLOR)
    image = ax.imshow(np.ma.masked_invalid(grid), cmap=colors, aspect="auto", interpolation="nearest")
    fig.colorbar(image, ax=ax, label="score")
    for layer, head in _highlight(highlight):
        ax.add_patch(Rectangle((head - 0.5, layer - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=1.2))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(title, fontsize=10)
    step = max(1, math.ceil(n_heads / 16))
    ax.set_xticks(range(0, n_heads, step))
    ax.set_yticks(range(0, n_layers, max(1, math.ceil(n_layers / 24))))
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


def head_scores_html(
    scores,
    path: str | Path,
    *,
    title: str,
    scored=None,
    highlight: Iterable[Sequence[int]] | None = None,
) -> Path:
    """Write the heatmap as one self-contained HTML file (plotly.js inlined, no CDN)."""
    import plotly.graph_objects as go

    grid = head_score_grid(scores, scored)
    n_layers, n_heads = grid.shape
    # Plain lists (not numpy): plotly writes the numbers as JSON text, readable in the file.
    z = [[None if math.isnan(v) else float(v) for v in row] for row in grid]
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=list(range(n_heads)),
            y=list(range(n_layers)),
            colorscale="Viridis",
            colorbar={"title": {"text": "score"}},
            hovertemplate="L%{y}H%{x}: %{z:.4f}<extra></extra>",
            hoverongaps=False,
        )
    )
    marks = _highlight(highlight)
    if marks:
        fig.add_trace(
            go.Scatter(
                x=[h for _, h in marks],
                y=[layer for layer, _ in marks],
                mode="markers+text",
                text=[str(i + 1) for i in range(len(marks))],
                textfont={"color": "white", "size": 9},
                marker={"symbol": "square-open", "color": "red", "size": 14, "line": {"width": 2}},
                name="top heads (rank)",
                hovertemplate="rank %{text}: L%{y}H%{x}<extra></extra>",
            )
        )
    fig.update_layout(
        title=title,
        xaxis={"title": {"text": "head"}, "dtick": 1 if n_heads <= 32 else None},
        yaxis={"title": {"text": "layer"}, "autorange": "reversed"},
        plot_bgcolor=UNSCORED_COLOR,  # unscored cells are gaps, so they show this grey
        showlegend=bool(marks),
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(path, include_plotlyjs=True, full_html=True)
    return path


def heatmap_paths(out: str | Path) -> tuple[Path, Path]:
    """<stem>_heatmap.png and <stem>_heatmap.html next to `out`."""
    out = Path(out)
    return out.with_name(f"{out.stem}_heatmap.png"), out.with_name(f"{out.stem}_heatmap.html")


def save_head_heatmaps(
    scores,
    out: str | Path,
    *,
    model: str | None,
    method: str,
    scored=None,
    highlight: Iterable[Sequence[int]] | None = None,
    n_examples: int | None = None,
) -> tuple[Path, Path]:
    """Both formats next to `out` (see heatmap_paths); returns (png, html)."""
    title = head_scores_title(model, method, n_examples)
    png, html = heatmap_paths(out)
    marks = _highlight(highlight)
    return (
        head_scores_png(scores, png, title=title, scored=scored, highlight=marks),
        head_scores_html(scores, html, title=title, scored=scored, highlight=marks),
    )


# ---------------------------------------------------------------------------- shared palette

SERIES_COLORS = ("#1f77b4", "#d62728", "#7f7f7f", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf")
MARK_COLORS = ("#d62728", "#ff7f0e", "#2ca02c", "#9467bd")
PLAIN_BAR_COLOR = "#9ecae1"


def _save_path(path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _html_title(title: str) -> str:
    """Line breaks of a matplotlib title, as plotly writes them."""
    return "<br>".join(_html.escape(line) for line in title.split("\n"))


def _write_plotly(fig, path: str | Path) -> Path:
    path = _save_path(path)
    fig.write_html(path, include_plotlyjs=True, full_html=True)  # inlined: opens offline
    return path


def _agg_figure(width: float, height: float):
    # Figure + Agg canvas: no pyplot global state, works without a display.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def _num(v) -> float:
    return math.nan if v is None else float(v)


def _json_num(v):
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


# ---------------------------------------------------------------------------- lines with CI bands


@dataclass(frozen=True)
class CISeries:
    """One line over the figure's x labels, with an optional band; None marks a missing point."""

    name: str
    y: Sequence[float | None]
    lo: Sequence[float | None] | None = None
    hi: Sequence[float | None] | None = None
    color: str | None = None


@dataclass(frozen=True)
class CIPanel:
    title: str
    ylabel: str
    series: Sequence[CISeries]
    ylim: tuple[float, float] | None = None


def _check_ci(panels: Sequence[CIPanel], x_labels: Sequence[str]) -> None:
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
            if (s.lo is None) != (s.hi is None):
                raise ValueError(f"series {s.name!r}: give both lo and hi, or neither")


def _series_colors(panels: Sequence[CIPanel]) -> dict[str, str]:
    """One colour per series name, the same in every panel and format."""
    colors: dict[str, str] = {}
    for panel in panels:
        for s in panel.series:
            if s.name not in colors:
                colors[s.name] = s.color or SERIES_COLORS[len(colors) % len(SERIES_COLORS)]
    return colors


def ci_lines_png(
    panels: Sequence[CIPanel], x_labels: Sequence[str], path: str | Path, *, title: str, xlabel: str
) -> Path:
    """Panels side by side, each a line per series with its band shaded, as a PNG."""
    _check_ci(panels, x_labels)
    colors = _series_colors(panels)
    fig = _agg_figure(4.2 * len(panels) + 0.6, 3.8)
    x = np.arange(len(x_labels))
    for i, panel in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        for s in panel.series:
            y = np.array([_num(v) for v in s.y])
            ax.plot(x, y, marker="o", color=colors[s.name], label=s.name)
            if s.lo is not None:
                lo, hi = np.array([_num(v) for v in s.lo]), np.array([_num(v) for v in s.hi])
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
    path = _save_path(path)
    fig.savefig(path, dpi=120)
    return path


def ci_lines_html(
    panels: Sequence[CIPanel], x_labels: Sequence[str], path: str | Path, *, title: str, xlabel: str
) -> Path:
    """The same panels as one self-contained HTML file; hovering a point shows its interval."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    _check_ci(panels, x_labels)
    colors = _series_colors(panels)
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[p.title for p in panels])
    shown: set[str] = set()
    for i, panel in enumerate(panels):
        for s in panel.series:
            color = colors[s.name]
            y = [_json_num(v) for v in s.y]
            if s.lo is not None:
                lo, hi = [_json_num(v) for v in s.lo], [_json_num(v) for v in s.hi]
                # the band: upper edge, then lower edge filled up to it
                fig.add_trace(go.Scatter(x=list(x_labels), y=hi, mode="lines", line={"width": 0}, showlegend=False,
                                         hoverinfo="skip", legendgroup=s.name), row=1, col=i + 1)
                fig.add_trace(go.Scatter(x=list(x_labels), y=lo, mode="lines", line={"width": 0}, fill="tonexty",
                                         fillcolor=_rgba(color, 0.2), showlegend=False, hoverinfo="skip",
                                         legendgroup=s.name), row=1, col=i + 1)
                custom = [[a, b] for a, b in zip(lo, hi)]
                hover = f"{s.name}: %{{y:.4g}} [%{{customdata[0]:.4g}}, %{{customdata[1]:.4g}}]<extra></extra>"
            else:
                custom, hover = None, f"{s.name}: %{{y:.4g}}<extra></extra>"
            fig.add_trace(go.Scatter(x=list(x_labels), y=y, mode="lines+markers", name=s.name, customdata=custom,
                                     line={"color": color}, hovertemplate=hover, legendgroup=s.name,
                                     showlegend=s.name not in shown), row=1, col=i + 1)
            shown.add(s.name)
        fig.update_xaxes(title_text=xlabel, type="category", row=1, col=i + 1)
        fig.update_yaxes(title_text=panel.ylabel, range=list(panel.ylim) if panel.ylim else None, row=1, col=i + 1)
    fig.update_layout(title=_html_title(title), width=430 * len(panels) + 120, height=460 + 20 * title.count("\n"),
                      margin={"t": 90 + 20 * title.count("\n")})
    return _write_plotly(fig, path)


def _rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i : i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


def save_ci_lines(
    panels: Sequence[CIPanel], x_labels: Sequence[str], stem: str | Path, *, title: str, xlabel: str
) -> tuple[Path, Path]:
    """<stem>.png and <stem>.html; returns (png, html)."""
    stem = Path(stem)
    return (
        ci_lines_png(panels, x_labels, stem.with_name(stem.name + ".png"), title=title, xlabel=xlabel),
        ci_lines_html(panels, x_labels, stem.with_name(stem.name + ".html"), title=title, xlabel=xlabel),
    )


# ---------------------------------------------------------------------------- bars with marked bars


@dataclass(frozen=True)
class BarPanel:
    """One bar per label; `threshold` draws a dashed line (e.g. a top-5% cut-off)."""

    title: str
    ylabel: str
    values: Sequence[float]
    threshold: float | None = None
    threshold_label: str = ""


def _check_bars(panels: Sequence[BarPanel], labels: Sequence[str], marks: Mapping[int, str]) -> None:
    if not panels or not labels:
        raise ValueError("a bar figure needs at least one panel and one bar")
    for panel in panels:
        if len(panel.values) != len(labels):
            raise ValueError(f"panel {panel.title!r} has {len(panel.values)} values for {len(labels)} bars")
    bad = [i for i in marks if not 0 <= i < len(labels)]
    if bad:
        raise ValueError(f"marked bars {bad} are outside the {len(labels)} bars")


def _mark_colors(marks: Mapping[int, str]) -> dict[str, str]:
    names: dict[str, str] = {}
    for name in marks.values():
        if name not in names:
            names[name] = MARK_COLORS[len(names) % len(MARK_COLORS)]
    return names


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
    _check_bars(panels, labels, marks)
    names = _mark_colors(marks)
    colors = [names[marks[i]] if i in marks else PLAIN_BAR_COLOR for i in range(len(labels))]
    n = len(labels)
    fig = _agg_figure(min(24.0, max(7.0, 0.14 * n + 2.5)), 2.6 * len(panels) + 1.6)
    x = np.arange(n)
    axes = []
    for i, panel in enumerate(panels):
        ax = fig.add_subplot(len(panels), 1, i + 1, sharex=axes[0] if axes else None)
        axes.append(ax)
        ax.bar(x, [float(v) for v in panel.values], color=colors, width=0.85)
        if panel.threshold is not None:
            ax.axhline(panel.threshold, color="black", linestyle="--", linewidth=0.8, label=panel.threshold_label)
        ax.set_ylabel(panel.ylabel, fontsize=9)
        ax.set_title(panel.title, fontsize=10)
        ax.margins(x=0.005)
        handles = [Patch(color=c, label=m) for m, c in names.items()] + [Patch(color=PLAIN_BAR_COLOR, label=other_label)]
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
    path = _save_path(path)
    fig.savefig(path, dpi=120)
    return path


def bars_html(
    panels: Sequence[BarPanel],
    labels: Sequence[str],
    path: str | Path,
    *,
    title: str,
    xlabel: str = "",
    marks: Mapping[int, str] | None = None,
    other_label: str = "other",
) -> Path:
    """The same bars as one self-contained HTML file; hovering a bar shows its label and value."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    marks = dict(marks or {})
    _check_bars(panels, labels, marks)
    names = _mark_colors(marks)
    groups = [(m, c, [i for i in range(len(labels)) if marks.get(i) == m]) for m, c in names.items()]
    groups.append((other_label, PLAIN_BAR_COLOR, [i for i in range(len(labels)) if i not in marks]))
    fig = make_subplots(rows=len(panels), cols=1, shared_xaxes=True, subplot_titles=[p.title for p in panels],
                        vertical_spacing=0.12 if len(panels) > 1 else 0.0)
    for row, panel in enumerate(panels, start=1):
        for name, color, idx in groups:
            if not idx:
                continue
            fig.add_trace(go.Bar(x=idx, y=[float(panel.values[i]) for i in idx], name=name, marker_color=color,
                                 text=[labels[i] for i in idx], legendgroup=name, showlegend=row == 1,
                                 textposition="none", hovertemplate="%{text}: %{y:.4g}<extra>" + _html.escape(name) + "</extra>"),
                          row=row, col=1)
        if panel.threshold is not None:
            fig.add_hline(y=float(panel.threshold), line_dash="dash", line_width=1, row=row, col=1,
                          annotation_text=panel.threshold_label or None, annotation_position="top left")
        fig.update_yaxes(title_text=panel.ylabel, row=row, col=1)
    shown = list(range(len(labels))) if len(labels) <= 80 else sorted(marks)
    fig.update_xaxes(tickmode="array", tickvals=shown, ticktext=[labels[i] for i in shown], tickangle=-90,
                     tickfont={"size": 8}, row=len(panels), col=1, title_text=xlabel or None)
    fig.update_layout(title=_html_title(title), barmode="overlay", bargap=0.1, height=300 * len(panels) + 260,
                      margin={"t": 90 + 20 * title.count("\n")},
                      width=max(900, min(2400, 14 * len(labels) + 300)))
    return _write_plotly(fig, path)


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
    stem = Path(stem)
    kw = dict(title=title, xlabel=xlabel, marks=marks, other_label=other_label)
    return (
        bars_png(panels, labels, stem.with_name(stem.name + ".png"), **kw),
        bars_html(panels, labels, stem.with_name(stem.name + ".html"), **kw),
    )


# ---------------------------------------------------------------------------- tables


def table_markdown(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub markdown table; `|` inside cells is escaped."""
    if any(len(r) != len(headers) for r in rows):
        raise ValueError(f"every row needs {len(headers)} cells")

    def cell(v: object) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def table_html(
    headers: Sequence[str],
    rows: Sequence[Sequence[object]],
    path: str | Path,
    *,
    title: str,
    classes: Sequence[Sequence[str | None]] | None = None,
    notes: Sequence[str] = (),
) -> Path:
    """One self-contained HTML page with a table; `classes` ("good", "bad", "muted") colour cells."""
    if any(len(r) != len(headers) for r in rows):
        raise ValueError(f"every row needs {len(headers)} cells")
    if classes is not None and (len(classes) != len(rows) or any(len(c) != len(headers) for c in classes)):
        raise ValueError("classes must have the table's shape")
    esc = _html.escape
    body = []
    for r, row in enumerate(rows):
        cells = []
        for c, value in enumerate(row):
            cls = classes[r][c] if classes is not None else None
            cells.append(f"<td{f' class={chr(34)}{esc(cls)}{chr(34)}' if cls else ''}>{esc(str(value))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    page = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{esc(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; }}
table {{ border-collapse: collapse; }}
td, th {{ border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; font-size: 13px; }}
th {{ background: #f0f0f0; }}
td.good {{ background: #e5f5e0; }}
td.bad {{ background: #fde0dd; }}
td.muted {{ color: #888; }}
</style></head><body>
<h2>{esc(title)}</h2>
{''.join(f'<p>{esc(n)}</p>' for n in notes)}
<table><thead><tr>{''.join(f'<th>{esc(str(h))}</th>' for h in headers)}</tr></thead>
<tbody>
{chr(10).join(body)}
</tbody></table>
</body></html>
"""
    path = _save_path(path)
    path.write_text(page, encoding="utf-8")
    return path


__all__ = [
    "BarPanel",
    "CIPanel",
    "CISeries",
    "bars_html",
    "bars_png",
    "ci_lines_html",
    "ci_lines_png",
    "save_bars",
    "save_ci_lines",
    "table_html",
    "table_markdown",
    "head_score_grid",
    "head_scores_html",
    "head_scores_png",
    "head_scores_title",
    "heatmap_paths",
    "save_head_heatmaps",
]
