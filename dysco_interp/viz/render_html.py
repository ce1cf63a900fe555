"""The panel model (`panels.py`) drawn by plotly, as self-contained HTML files.

plotly.js is inlined, so a file opens offline; the numbers travel in it as plain JSON
(lists of floats and nulls, never numpy arrays), readable in the file. plotly is imported
inside the functions.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from dysco_interp.viz.panels import (
    CI_COLORS,
    GRID_COLORS,
    PLAIN_BAR_COLOR,
    BarPanel,
    Panel,
    as_json_number,
    check_bars,
    check_shared_x,
    error_bars,
    grid_shape,
    html_title,
    mark_colors,
    own_x,
    rgba,
    series_colors,
    y_extent,
)


def plot_div_id(path: str | Path) -> str:
    """The plot's HTML id, from the file's name: plotly's default is a random uuid, which would
    make every redraw of the same figure differ."""
    return "plot-" + re.sub(r"[^A-Za-z0-9_-]", "-", Path(path).stem)


def write_plotly(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # inlined plotly.js: opens offline
    fig.write_html(path, include_plotlyjs=True, full_html=True, div_id=plot_div_id(path))
    return path


def ci_lines_html(
    panels: Sequence[Panel], x_labels: Sequence[str], path: str | Path, *, title: str, xlabel: str
) -> Path:
    """The shared-x line panels; hovering a point shows its interval."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    check_shared_x(panels, x_labels)
    colors = series_colors(panels, CI_COLORS)
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[html_title(p.title) for p in panels])
    shown: set[str] = set()
    for i, panel in enumerate(panels):
        for s in panel.series:
            color = colors[s.name]
            y = [as_json_number(v) for v in s.y]
            if s.lo is not None and s.hi is not None:
                lo, hi = [as_json_number(v) for v in s.lo], [as_json_number(v) for v in s.hi]
                # the band: upper edge, then lower edge filled up to it
                fig.add_trace(go.Scatter(x=list(x_labels), y=hi, mode="lines", line={"width": 0}, showlegend=False,
                                         hoverinfo="skip", legendgroup=s.name), row=1, col=i + 1)
                fig.add_trace(go.Scatter(x=list(x_labels), y=lo, mode="lines", line={"width": 0}, fill="tonexty",
                                         fillcolor=rgba(color, 0.2), showlegend=False, hoverinfo="skip",
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
    fig.update_layout(title=html_title(title), width=430 * len(panels) + 120, height=460 + 20 * title.count("\n"),
                      margin={"t": 90 + 20 * title.count("\n")})
    return write_plotly(fig, path)


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
    """The stacked bar panels; hovering a bar shows its label and value."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    marks = dict(marks or {})
    check_bars(panels, labels, marks)
    names = mark_colors(marks)
    groups = [(m, c, [i for i in range(len(labels)) if marks.get(i) == m]) for m, c in names.items()]
    groups.append((other_label, PLAIN_BAR_COLOR, [i for i in range(len(labels)) if i not in marks]))
    fig = make_subplots(rows=len(panels), cols=1, shared_xaxes=True,
                        subplot_titles=[html_title(p.title) for p in panels],
                        vertical_spacing=0.12 if len(panels) > 1 else 0.0)
    for row, panel in enumerate(panels, start=1):
        for name, color, idx in groups:
            if not idx:
                continue
            fig.add_trace(go.Bar(x=idx, y=[float(panel.values[i]) for i in idx], name=name, marker_color=color,
                                 text=[labels[i] for i in idx], legendgroup=name, showlegend=row == 1,
                                 textposition="none",
                                 hovertemplate="%{text}: %{y:.4g}<extra>" + html.escape(name) + "</extra>"),
                          row=row, col=1)
        if panel.threshold is not None:
            fig.add_hline(y=float(panel.threshold), line_dash="dash", line_width=1, row=row, col=1,
                          annotation_text=panel.threshold_label or None, annotation_position="top left")
        fig.update_yaxes(title_text=panel.ylabel, row=row, col=1)
    shown = list(range(len(labels))) if len(labels) <= 80 else sorted(marks)
    fig.update_xaxes(tickmode="array", tickvals=shown, ticktext=[labels[i] for i in shown], tickangle=-90,
                     tickfont={"size": 8}, row=len(panels), col=1, title_text=xlabel or None)
    fig.update_layout(title=html_title(title), barmode="overlay", bargap=0.1, height=300 * len(panels) + 260,
                      margin={"t": 90 + 20 * title.count("\n")},
                      width=max(900, min(2400, 14 * len(labels) + 300)))
    return write_plotly(fig, path)


def panels_html(panels: Sequence[Panel], path: str | Path, *, title: str, ncols: int = 3) -> Path:
    """The panel grid; the dashed mark is a trace, so it takes data values on log axes too."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    nrows, ncols = grid_shape(len(panels), ncols)
    colors = series_colors(panels, GRID_COLORS)
    fig = make_subplots(rows=nrows, cols=ncols, subplot_titles=[html_title(p.title) for p in panels])
    shown: set[str] = set()
    for i, panel in enumerate(panels):
        row, col = i // ncols + 1, i % ncols + 1
        fig.update_xaxes(title_text=panel.xlabel, row=row, col=col)
        fig.update_yaxes(title_text=panel.ylabel, row=row, col=col)
        if not panel.series:
            fig.add_annotation(text=panel.note.replace("\n", "<br>"), showarrow=False, xref="x domain",
                               yref="y domain", x=0.5, y=0.5,
                               row=row, col=col)
            continue
        for s in panel.series:
            xs = own_x(s)
            # a line is drawn left to right; bars keep the series' order
            order = range(len(xs)) if panel.kind == "bar" else sorted(range(len(xs)), key=lambda k: float(xs[k]))
            err = error_bars(s)
            error_y = None if err is None else {
                "type": "data", "array": [err[1][k] for k in order], "arrayminus": [err[0][k] for k in order],
                "visible": True,
            }
            style = {"name": s.name, "legendgroup": s.name, "showlegend": s.name not in shown, "error_y": error_y}
            y = [None if v is None else float(v) for v in s.y]
            if panel.kind == "bar":
                trace = go.Bar(x=[str(x) for x in xs], y=y, marker_color=colors[s.name], **style)
            else:
                trace = go.Scatter(x=[float(xs[k]) for k in order], y=[y[k] for k in order],
                                   mode="lines+markers", line={"color": colors[s.name]}, **style)
            fig.add_trace(trace, row=row, col=col)
            shown.add(s.name)
        if panel.kind == "line" and panel.log_x:
            fig.update_xaxes(type="log", row=row, col=col)
        if panel.log_y:
            fig.update_yaxes(type="log", row=row, col=col)
        if panel.kind == "line" and panel.mark_x is not None:
            lo, hi = y_extent(panel)
            fig.add_trace(go.Scatter(x=[panel.mark_x, panel.mark_x], y=[lo, hi], mode="lines",
                                     line={"color": "black", "dash": "dash", "width": 1}, name=panel.mark_label,
                                     legendgroup="__mark", showlegend="__mark" not in shown, hoverinfo="name"),
                          row=row, col=col)
            shown.add("__mark")
    # two-line panel titles need room above each row, a two-line figure title above the grid
    lines = max(p.title.count("\n") for p in panels) + 1
    fig.update_layout(title=html_title(title), barmode="group", width=430 * ncols + 140,
                      height=(330 + 18 * lines) * nrows + 140 + 20 * title.count("\n"),
                      margin={"t": 100 + 20 * title.count("\n") + 18 * (lines - 1)})
    return write_plotly(fig, path)
