"""The panel model (`panels.py`) drawn by plotly, as HTML files that open offline.

Every HTML file the package writes loads plotly.js from a `plotly.min.js` by a relative path
(`shared_plotlyjs`), never from a CDN and never inlined: an output folder holds one copy instead
of one per file, and a tree that says so (figures/) one copy for all its folders. That copy is
plotly.js's cartesian partial bundle (1.5 MB; `plotlyjs_bundle`), or the full one (4.8 MB) under
a plotly release that bundles another plotly.js. The numbers travel in each file as plain JSON
(lists of floats and nulls, never numpy arrays), readable in the file. plotly is imported inside
the functions.
"""

from __future__ import annotations

import functools
import html
import lzma
import os
import re
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path

from dysco_interp.atomic import atomic_open, atomic_write_bytes
from dysco_interp.outputs import output_target
from dysco_interp.viz.panels import (
    CI_COLORS,
    GRID_COLORS,
    PLAIN_BAR_COLOR,
    BarPanel,
    Panel,
    as_json_number,
    categories,
    check_bars,
    check_shared_x,
    error_bars,
    grid_shape,
    html_title,
    legend_names,
    log_ticks,
    mark_colors,
    own_x,
    rgba,
    row_heights,
    series_colors,
    shares_categories_with_previous,
    y_extent,
)


def plot_div_id(path: str | Path) -> str:
    """The plot's HTML id, from the file's name: plotly's default is a random uuid, which would
    make every redraw of the same figure differ."""
    return "plot-" + re.sub(r"[^A-Za-z0-9_-]", "-", Path(path).stem)


PLOTLYJS_NAME = "plotly.min.js"
# A folder holding this file beside its plotly.min.js lends that copy to the folders directly
# below it (figures/ does, for figures/<kind>/). Elsewhere a copy one folder up is not used: an
# output folder must open offline when it is moved or sent alone.
SHARED_MARKER = ".plotlyjs-shared"


# plotly.js's official cartesian partial bundle (npm plotly.js-cartesian-dist-min), shipped
# xz-compressed beside its licence: every trace the package draws (scatter, bar, heatmap, with
# frames and buttons) is in it, at a third of the full bundle's size in every output folder.
CARTESIAN_PLOTLYJS = ("plotlyjs", "plotly-cartesian.min.js.xz")
CARTESIAN_PLOTLYJS_VERSION = "4.1.1"


@functools.cache
def cartesian_plotlyjs() -> bytes:
    """The shipped cartesian bundle, decompressed (once per process: every page asks for it)."""
    archive = resources.files("dysco_interp.viz").joinpath(*CARTESIAN_PLOTLYJS)
    return lzma.decompress(archive.read_bytes())


def plotlyjs_bundle() -> bytes:
    """The plotly.js that every page loads: the shipped cartesian bundle where it is the
    plotly.js version that the installed plotly writes its figure JSON for, else that plotly's
    own full bundle (a plotly.js of another version may read the JSON differently)."""
    from plotly.offline import get_plotlyjs, get_plotlyjs_version

    if get_plotlyjs_version() == CARTESIAN_PLOTLYJS_VERSION:
        return cartesian_plotlyjs()
    return get_plotlyjs().encode("utf-8")


def shared_plotlyjs(html_path: str | Path) -> str:
    """The relative `<script src>` by which the HTML file `html_path` loads plotly.js, after
    making that copy the plotly.js the figure is drawn for (`plotlyjs_bundle`).

    The copy is the one beside the file, written there if missing: each output folder opens
    offline on its own. Only where the folder above holds `SHARED_MARKER` and its own copy (so
    figures/plotly.min.js serves every figures/<kind>/*.html) is that one used instead, so a
    committed tree keeps one copy. Never further up, and never an unmarked folder's. The copy
    is written atomically, and only when missing or different (a plotly upgrade), so figures
    written side by side neither rewrite it nor ever read half of one.
    """
    output_target(html_path)  # a page that may not be written gets no copy either
    # beside the path as named, a symlink's own folder: a browser resolves the src from there
    folder = Path(html_path).absolute().parent
    copy, src = folder / PLOTLYJS_NAME, PLOTLYJS_NAME
    if (not copy.exists() and (folder.parent / SHARED_MARKER).is_file()
            and (folder.parent / PLOTLYJS_NAME).is_file()):
        copy, src = folder.parent / PLOTLYJS_NAME, f"../{PLOTLYJS_NAME}"
    js = plotlyjs_bundle()
    if not copy.is_file() or copy.read_bytes() != js:
        atomic_write_bytes(copy, js)
    return src


def loaded_plotlyjs(html_path: str | Path) -> Path | None:
    """The plotly.min.js file that the HTML page `html_path` loads by a relative `<script src>`
    (whether or not it is there), None where it loads none."""
    text = Path(html_path).read_text(encoding="utf-8")
    match = re.search(r'<script[^>]*\bsrc="([^":]*/)?' + re.escape(PLOTLYJS_NAME) + '"', text)
    if match is None:
        return None
    return Path(os.path.normpath(Path(html_path).absolute().parent / (match.group(1) or "") / PLOTLYJS_NAME))


def opens_offline(html_path: str | Path) -> bool:
    """Whether the page loads plotly.js from a copy on disk and no script from anywhere else:
    every `<script src>` is a relative path to an existing file, and one of them is plotly.js."""
    text = Path(html_path).read_text(encoding="utf-8")
    sources = re.findall(r'<script[^>]*\bsrc="([^"]*)"', text)
    folder = Path(html_path).absolute().parent
    local = all(":" not in src and not src.startswith("/") and (folder / src).is_file() for src in sources)
    return local and loaded_plotlyjs(html_path) is not None


def write_plotly(fig, path: str | Path, *, auto_play: bool = True) -> Path:
    """`fig` as a full HTML page at `path` (written atomically), loading the shared plotly.js.
    The plot's id comes from the file name, so a redraw writes the same bytes; `auto_play` starts
    an animated figure's frames on load."""
    path = Path(path)
    src = shared_plotlyjs(path)
    # a figure without a fixed width fills the window and follows it when the window is resized
    page = fig.to_html(include_plotlyjs=src, full_html=True, div_id=plot_div_id(path),
                       config={"responsive": True}, auto_play=auto_play)
    with atomic_open(path) as f:  # a page drawn halfway is never left behind
        f.write(page)
    return path


LEGEND_ROW_PX = 26  # one line of a horizontal legend


def legend_below(fig, bottom_px: int) -> None:
    """One horizontal legend at the foot of the figure, under the lowest axis titles: it wraps to
    the window's width instead of being cut at its right edge, and covers no data."""
    fig.update_layout(legend={"orientation": "h", "x": 0.5, "xanchor": "center", "y": 0, "yanchor": "bottom",
                              "yref": "container", "font": {"size": 13}},
                      margin={"b": bottom_px})


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
        # plotly breaks a tick label only at <br>, not at the PNG's newlines
        fig.update_xaxes(title_text=xlabel, type="category", tickmode="array", tickvals=list(x_labels),
                         ticktext=[html_title(x) for x in x_labels], row=1, col=i + 1)
        fig.update_yaxes(title_text=panel.ylabel, range=list(panel.ylim) if panel.ylim else None, row=1, col=i + 1)
    fig.update_layout(title=html_title(title), height=500 + 20 * title.count("\n"),
                      margin={"t": 90 + 20 * title.count("\n"), "l": 60, "r": 30})
    legend_below(fig, 110)
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
    """`panels_figure` as an HTML file (`write_plotly`)."""
    return write_plotly(panels_figure(panels, title=title, ncols=ncols), path)


def panels_figure(panels: Sequence[Panel], *, title: str, ncols: int = 3):
    """The panel grid as a plotly figure; the dashed mark is a trace, so it takes data values on log axes too.
    Rows are as tall as `panels.row_heights` says (a horizontal bar panel grows with its
    categories); the width follows the window."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    nrows, ncols = grid_shape(len(panels), ncols)
    colors = series_colors(panels, GRID_COLORS)
    heights = row_heights(panels, ncols)
    # two-line panel titles need room above each row, a two-line figure title above the grid
    lines = max(p.title.count("\n") for p in panels) + 1
    gap_px = 110 + 18 * (lines - 1)  # x-axis title of one row, subplot title of the next
    plot_px = sum(round(88 * h) for h in heights)
    top_px = 100 + 20 * title.count("\n") + 18 * (lines - 1)
    legend_px = 60 + LEGEND_ROW_PX * max(0, len({n for p in panels for n in legend_names(p)}) // 5)
    height = plot_px + gap_px * (nrows - 1) + top_px + legend_px + 60
    fig = make_subplots(rows=nrows, cols=ncols, subplot_titles=[html_title(p.title) for p in panels],
                        row_heights=heights, vertical_spacing=gap_px / (height - top_px - legend_px),
                        horizontal_spacing=0.08 if ncols > 1 else 0.0)
    shown: set[str] = set()
    for i, panel in enumerate(panels):
        row, col = i // ncols + 1, i % ncols + 1
        # the value axis is x for horizontal bars
        value_axis = fig.update_xaxes if panel.horizontal else fig.update_yaxes
        fig.update_xaxes(title_text=html_title(panel.xlabel), row=row, col=col)
        fig.update_yaxes(title_text=html_title(panel.ylabel), row=row, col=col)
        if not panel.series:
            fig.add_annotation(text=panel.note.replace("\n", "<br>"), showarrow=False, xref="x domain",
                               yref="y domain", x=0.5, y=0.5,
                               row=row, col=col)
            fig.update_xaxes(showticklabels=False, row=row, col=col)
            fig.update_yaxes(showticklabels=False, row=row, col=col)
            continue
        for s in panel.series:
            xs = own_x(s)
            # a line is drawn left to right; bars keep the series' order
            order = range(len(xs)) if panel.kind == "bar" else sorted(range(len(xs)), key=lambda k: float(xs[k]))
            err = error_bars(s)
            error = None if err is None else {
                "type": "data", "array": [err[1][k] for k in order], "arrayminus": [err[0][k] for k in order],
                "visible": True,
            }
            style = {"name": s.name, "legendgroup": s.name, "showlegend": s.name not in shown}
            y = [None if v is None else float(v) for v in s.y]
            if panel.kind == "bar" and panel.horizontal:
                trace = go.Bar(y=[str(x) for x in xs], x=y, orientation="h", marker_color=colors[s.name],
                               error_x=error, **style)
            elif panel.kind == "bar":
                trace = go.Bar(x=[str(x) for x in xs], y=y, marker_color=colors[s.name], error_y=error, **style)
            else:
                trace = go.Scatter(x=[float(xs[k]) for k in order], y=[y[k] for k in order],
                                   mode="lines+markers", line={"color": colors[s.name]}, error_y=error, **style)
            fig.add_trace(trace, row=row, col=col)
            shown.add(s.name)
        if panel.horizontal:
            cats = categories(panel)
            fig.update_yaxes(categoryorder="array", categoryarray=cats, autorange="reversed", automargin=True,
                             showticklabels=not shares_categories_with_previous(panels, i, ncols),
                             tickfont={"size": 12}, row=row, col=col)
        if panel.kind == "line" and panel.log_x:
            values, text = log_ticks(panel)
            fig.update_xaxes(type="log", tickmode="array", tickvals=values, ticktext=text, row=row, col=col)
        if panel.log_y:
            value_axis(type="log", row=row, col=col)
        if panel.ylim is not None:
            value_axis(range=list(panel.ylim), row=row, col=col)
        if panel.ref is not None:
            add_line = fig.add_vline if panel.horizontal else fig.add_hline
            key = "__ref " + panel.ref_label
            add_line(panel.ref, line={"color": "black", "width": 1.5}, row=row, col=col,
                     layer="above" if panel.kind == "bar" else "below",  # over bars, under lines
                     name=panel.ref_label or None, showlegend=bool(panel.ref_label) and key not in shown,
                     legendgroup=key)
            shown.add(key)
        if panel.kind == "line" and panel.mark_x is not None:
            lo, hi = panel.ylim or y_extent(panel)
            fig.add_trace(go.Scatter(x=[panel.mark_x, panel.mark_x], y=[lo, hi], mode="lines",
                                     line={"color": "black", "dash": "dash", "width": 1}, name=panel.mark_label,
                                     legendgroup="__mark", showlegend="__mark" not in shown, hoverinfo="name"),
                          row=row, col=col)
            shown.add("__mark")
        if panel.annotation:
            fig.add_annotation(text=html_title(panel.annotation), showarrow=False, xref="x domain", yref="y domain",
                               x=0.5, y=0.97, yanchor="top", bgcolor="white", bordercolor="#999", borderwidth=1,
                               row=row, col=col)
    fig.update_layout(title=html_title(title), barmode="group", height=height,
                      margin={"t": top_px, "l": 70, "r": 30})
    legend_below(fig, legend_px)
    return fig
