"""The attention replay as an interactive plotly figure, as one offline HTML file, and as a static
matplotlib snapshot of one token (for places that show no JavaScript: GitHub, nbconvert, a slide).

One column per run (e.g. vanilla and DySCO side by side), one frame per generated token,
moved by a slider labelled with the token's number (the runs' tokens differ; each column's
caption shows its own token in its text). Rows: per-span attention of the QRHeads, of
all heads, and the fraction of each span's tokens DySCO selected. The gold span of the token's
route step is orange (and starred); spans of which DySCO selected at least half the tokens get a
red outline; each panel says how much of the attention fell outside every span. The figure
opens on the first token that names a route step's destination (`start_token`), and its width
follows the window.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Mapping
from pathlib import Path

from dysco_interp.analysis.replay import AttentionReplay
from dysco_interp.decoding.choices import METHOD_NAMES
from dysco_interp.errors import ConfigError
from dysco_interp.viz.render_html import write_plotly

ROW_COLORS = {"qr_heads": "#4c78a8", "all_heads": "#72b7b2", "selected": "#b279a2"}
# "{who}": the method that selected, DySCO unless a run of one's own method is shown (`selector_name`)
ROW_TITLES = {
    "qr_heads": "QRHeads<br>attention", "all_heads": "all heads<br>attention", "selected": "{who}<br>selected",
}
GOLD_COLOR = "#f58518"
SELECTED_OUTLINE = "#d62728"
SELECTED_AT = 0.5  # outline spans with at least this fraction of their tokens selected
CONTEXT_CHARS = 70  # generated text shown before the current token
ROW_PX = 230  # height of one row of bar charts
# the figure's margins, in pixels: the top holds the title, the legend and the column captions;
# the bottom the rotated edge names, a note and the slider
TITLE_PX, LEGEND_PX, CAPTION_PX = 52, 48, 70
NOTE_PX, SLIDER_PX = 30, 90
# a rotated edge name drops this many pixels per character and per line, per pixel of its font (at 45 degrees)
CHAR_DROP, LINE_DROP = 1 / 3, 1.0
TICK_FONT_PX = {1: 12, 2: 10}  # by the number of runs side by side: narrower columns, smaller names
# the line before a route step's destination city ("From X, take a train to"; the space before
# the city usually starts the city's first token)
_BEFORE_DESTINATION = re.compile(r"take an? \S+ to ?$")


def _as_runs(replays: AttentionReplay | Mapping[str, AttentionReplay]) -> dict[str, AttentionReplay]:
    runs = {replays.method or "run": replays} if isinstance(replays, AttentionReplay) else dict(replays)
    if not runs:
        raise ConfigError("no replay to show")
    for name, rep in runs.items():
        if not isinstance(rep, AttentionReplay):
            raise ConfigError(f"run {name!r} is a {type(rep).__name__}, not an AttentionReplay")
        if len(rep) == 0:
            raise ConfigError(f"run {name!r} generated no tokens")
    return runs


def _visible(text: str) -> str:
    # plotly reads a subset of HTML, so "<Route>" must be escaped; newlines shown as a glyph
    return html.escape(text).replace("\n", "⏎")


def token_caption(rep: AttentionReplay, j: int) -> str:
    """The generated text before token j (its tail), the token in bold, and its gold span."""
    if j >= len(rep):
        return f"(ended after {len(rep)} tokens)"
    before = "".join(rep.pieces[:j])
    tail = ("…" + before[-CONTEXT_CHARS:]) if len(before) > CONTEXT_CHARS else before
    gold = rep.gold[j] if rep.gold is not None else None
    where = f"gold: {_visible(rep.names[gold])}" if gold is not None else "no gold span"
    token = f"<b><span style='color:{SELECTED_OUTLINE}'>{_visible(rep.pieces[j]) or '∅'}</span></b>"
    return f"token {j}: {_visible(tail)}{token}<br><i>{where}</i>"


def _row_values(rep: AttentionReplay, row: str, j: int) -> list[float | None]:
    if j >= len(rep):
        return [None] * len(rep.names)
    table = getattr(rep, row)
    if table is None:
        return [None] * len(rep.names)
    return [None if math.isnan(v) else round(v, 5) for v in table[j].tolist()]


def selector_name(runs: AttentionReplay | Mapping[str, AttentionReplay]) -> str:
    """Who selected the keys the "selected" row shows: DySCO for the built-in methods, a method of
    one's own by its name (PASTA's "selection" is its emphasised spans' complement, not DySCO's)."""
    reps = [runs] if isinstance(runs, AttentionReplay) else list(runs.values())
    names = dict.fromkeys("DySCO" if not r.method or r.method in METHOD_NAMES else r.method
                          for r in reps if r.selected is not None)
    return " / ".join(names) or "DySCO"


def _rows(runs: Mapping[str, AttentionReplay]) -> list[str]:
    """The figure's rows: attention of the QRHeads and of all heads, and DySCO's selection if any run has one."""
    return ["qr_heads", "all_heads"] + (["selected"] if any(r.selected is not None for r in runs.values()) else [])


def _bar_style(rep: AttentionReplay, row: str, j: int):
    """Token j's bars in one row: heights, the gold span's index, each span's selected share,
    colours (the gold span orange) and whether each is outlined (selected at least SELECTED_AT)."""
    values = _row_values(rep, row, j)
    gold = rep.gold[j] if rep.gold is not None and j < len(rep) else None
    chosen = _row_values(rep, "selected", j) if rep.selected is not None else [None] * len(values)
    colors = [GOLD_COLOR if i == gold else ROW_COLORS[row] for i in range(len(values))]
    outlined = [c is not None and c >= SELECTED_AT for c in chosen]
    return values, gold, chosen, colors, outlined


def _edge_hover(rep: AttentionReplay) -> list[str]:
    """Each span's name and text, the part of the hover that no token changes: held once by the
    trace (its customdata), not repeated in every frame, which would multiply the page's size."""
    details = rep.details or rep.names
    return [f"{_visible(name)}<br>{_visible(detail)}" for name, detail in zip(rep.names, details)]


# what a bar shows on hover: the span (the trace's customdata), then token j's values (each frame's hovertext)
BAR_HOVER = "%{customdata}<br>%{hovertext}<extra></extra>"


def _bar(rep: AttentionReplay, row: str, j: int) -> dict:
    """One bar trace's data for token j: heights, gold colour, selection outline, hover."""
    values, gold, chosen, colors, outlined = _bar_style(rep, row, j)
    widths = [3 if o else 0 for o in outlined]
    hover = [
        ("no value" if values[i] is None else f"value {values[i]:.4f}")
        + ("" if chosen[i] is None else f"<br>{_visible(selector_name(rep))} selected {chosen[i]:.0%} of its tokens")
        + ("<br><b>gold edge of this step</b>" if i == gold else "")
        for i in range(len(values))
    ]
    return {
        "y": values,
        "marker": {"color": colors, "line": {"color": SELECTED_OUTLINE, "width": widths}},
        "text": ["★" if i == gold and values[i] is not None else "" for i in range(len(values))],
        "hovertext": hover,
    }


def destination_token(rep: AttentionReplay) -> int | None:
    """The first token that names a route step's destination (the first edge look-up), if any."""
    line = ""
    for j, piece in enumerate(rep.pieces):
        if rep.gold is not None and rep.gold[j] is not None and _BEFORE_DESTINATION.search(line):
            return j
        line = (line + piece).rsplit("\n", 1)[-1]
    return None


def start_token(replays: AttentionReplay | Mapping[str, AttentionReplay]) -> int:
    """The token a replay opens on: the earliest destination city any run names, else the first
    token with a gold span, else 0. A run that never writes a route line does not pull it to 0."""
    runs = _as_runs(replays)
    found = [j for j in (destination_token(r) for r in runs.values()) if j is not None]
    if found:
        return min(found)
    golds = [j for r in runs.values() if r.gold is not None for j, g in enumerate(r.gold) if g is not None]
    return min(golds, default=0)


def tick_label(name: str) -> str:
    """An edge's name as an x tick: visible, broken after its arrow, so that a long route step
    ("Budapest XVI. kerulet → Saint Clair Shores") drops half as far when rotated."""
    return "<br>".join(_visible(part) for part in name.replace(" → ", " →\n").split("\n"))


def tick_drop_px(names: list[str], font_px: int = TICK_FONT_PX[1]) -> int:
    """How far below the axis the rotated tick labels reach."""
    lines = [line for name in names for line in tick_label(name).split("<br>")]
    longest = max((len(html.unescape(line)) for line in lines), default=0)
    rows = max((tick_label(name).count("<br>") + 1 for name in names), default=1)
    return round(font_px * (longest * CHAR_DROP + rows * LINE_DROP)) + 10


def outside_share(rep: AttentionReplay, row: str, j: int) -> float | None:
    """`AttentionReplay.outside_spans` where the row has one (not the selection, not past the run)."""
    if row == "selected" or j >= len(rep):
        return None
    return rep.outside_spans(row, j)


def _legend_traces(with_selection: bool, who: str = "DySCO") -> list[dict]:
    # legend-only entries: the bars' colours vary per bar, which a plotly legend cannot show
    items: list[tuple[str, str, str, int | None]] = [
        ("QRHeads' attention", "square", ROW_COLORS["qr_heads"], None),
        ("all heads' attention", "square", ROW_COLORS["all_heads"], None),
        ("gold edge of the token's route step ★", "square", GOLD_COLOR, None)]
    if with_selection:
        items += [(f"{who} selected that share of the span", "square", ROW_COLORS["selected"], None),
                  (f"red outline: {who} selected ≥{SELECTED_AT:.0%} of the span", "square-open", SELECTED_OUTLINE, 3)]
    return [{"x": [None], "y": [None], "mode": "markers", "name": name, "hoverinfo": "skip", "showlegend": True,
             "marker": {"symbol": symbol, "size": 14, "color": color,
                        **({"line": {"width": width, "color": color}} if width else {})}}
            for name, symbol, color, width in items]


def replay_figure(replays: AttentionReplay | Mapping[str, AttentionReplay], title: str = "Attention replay",
                  start: int | None = None):
    """A plotly Figure with one frame per generated token (slider and play button).

    `start`: the token shown first (default `start_token`). Its width follows the window
    (`write_replay_html` and `to_html` make it responsive).
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    runs = _as_runs(replays)
    rows = _rows(runs)
    who = _visible(selector_name(runs))
    n_frames = max(len(r) for r in runs.values())
    first = start_token(runs) if start is None else start
    if not 0 <= first < n_frames:
        raise ConfigError(f"start token {first} is outside the {n_frames} generated tokens")
    fig = make_subplots(
        rows=len(rows), cols=len(runs), shared_xaxes=True, vertical_spacing=0.06, horizontal_spacing=0.06
    )
    labelled = all(len(rep.names) <= 40 for rep in runs.values())
    font_px = TICK_FONT_PX.get(len(runs), min(TICK_FONT_PX.values()))
    drop_px = max(tick_drop_px(rep.names, font_px) for rep in runs.values()) if labelled else 30
    plot_px = ROW_PX * len(rows)
    top_px = TITLE_PX + LEGEND_PX + CAPTION_PX
    bottom_px = drop_px + NOTE_PX + SLIDER_PX

    def below(px: int) -> float:  # paper y of a point px pixels under the plots
        return -px / plot_px

    cells = [(r, c, row, rep) for c, rep in enumerate(runs.values(), 1) for r, row in enumerate(rows, 1)]
    for r, c, row, rep in cells:
        fig.add_trace(
            go.Bar(x=list(range(len(rep.names))), textposition="outside", customdata=_edge_hover(rep),
                   hovertemplate=BAR_HOVER, showlegend=False, **_bar(rep, row, first)),
            row=r, col=c,
        )
        fig.update_yaxes(title_text=ROW_TITLES[row].format(who=who) if c == 1 else None, row=r, col=c)
    for trace in _legend_traces("selected" in rows, who):
        fig.add_trace(go.Scatter(**trace), row=1, col=1)
    for c, rep in enumerate(runs.values(), 1):
        fig.update_xaxes(
            tickvals=list(range(len(rep.names))) if labelled else None,
            ticktext=[tick_label(n) for n in rep.names] if labelled else None,
            tickangle=-45, tickfont={"size": font_px}, row=len(rows), col=c,
        )
    axes = {(r, c): fig.get_subplot(r, c) for r, c, _, _ in cells}

    def y_ranges(j: int) -> dict:
        # one range per row and token, shared by the runs so their bars compare
        out = {}
        for r, row in enumerate(rows, 1):
            values = [v for rep in runs.values() for v in _row_values(rep, row, j) if v is not None]
            top = 1.05 if row == "selected" else max(max(values, default=0.0) * 1.2, 1e-3)
            for c in range(1, len(runs) + 1):
                out[axes[r, c].yaxis.plotly_name] = {"range": [0, top]}
        return out

    def in_cell(r: int, c: int, text: str, **where) -> dict:
        x_id, y_id = axes[r, c].yaxis.anchor, axes[r, c].xaxis.anchor  # "x5", "y5"
        return {"text": text, "showarrow": False, "xref": f"{x_id} domain", "yref": f"{y_id} domain", **where}

    def annotations(j: int) -> list[dict]:
        out = []
        for c, (name, rep) in enumerate(runs.items(), 1):
            out.append({"text": f"<b>{_visible(name)}</b><br>{token_caption(rep, j)}", "x": (c - 0.5) / len(runs),
                        "y": 1.02, "xref": "paper", "yref": "paper", "xanchor": "center", "yanchor": "bottom",
                        "showarrow": False, "font": {"size": 12}, "align": "left"})
            for r, row in enumerate(rows, 1):
                share = outside_share(rep, row, j)
                if share is not None:
                    out.append(in_cell(r, c, f"outside every edge: {share:.0%}", x=1, y=1, xanchor="right",
                                       yanchor="top", font={"size": 11, "color": "#555"}, bgcolor="white"))
            if "selected" in rows and rep.selected is None:
                out.append(in_cell(len(rows), c, f"no selection ({_visible(rep.method or name)})", x=0.5, y=0.5,
                                   font={"color": "#888"}))
        out.append({"text": "attention: mean over heads of the row that produced the token, summed over each "
                            "edge line (a teacher-forced pass of the model without DySCO's bias)",
                    "x": 0, "y": below(drop_px), "xref": "paper", "yref": "paper", "showarrow": False,
                    "xanchor": "left", "yanchor": "top", "align": "left", "font": {"size": 11, "color": "#555"}})
        return out

    fig.frames = [
        go.Frame(name=str(j), data=[go.Bar(**_bar(rep, row, j)) for _, _, row, rep in cells],
                 traces=list(range(len(cells))), layout={"annotations": annotations(j), **y_ranges(j)})
        for j in range(n_frames)
    ]
    fig.update_layout(annotations=annotations(first), **y_ranges(first))
    show = {"mode": "immediate", "frame": {"duration": 0, "redraw": True}, "transition": {"duration": 0}}
    fig.update_layout(
        # a title's lines stay lines (the modebar sits at the top right of the first one)
        title={"text": "<br>".join(html.escape(line) for line in title.split("\n")), "x": 0.01, "y": 1,
               "yanchor": "top", "pad": {"t": 12}, "font": {"size": 16}},
        height=plot_px + top_px + bottom_px,
        autosize=True,
        margin={"t": top_px, "b": bottom_px, "l": 80, "r": 30},
        plot_bgcolor="white",
        bargap=0.15,
        # the legend sits right on top of the captions: a gap there read as the end of the figure
        legend={"orientation": "h", "x": 0, "y": 1 + CAPTION_PX / plot_px, "yanchor": "bottom", "font": {"size": 13}},
        sliders=[{
            "active": first, "y": below(drop_px + NOTE_PX), "yanchor": "top", "x": 0.1, "len": 0.9,
            "currentvalue": {"prefix": "token ", "font": {"size": 14},
                             "suffix": " (each column's caption shows its text)" if len(runs) > 1 else ""},
            "steps": [{"label": str(j), "method": "animate", "args": [[str(j)], show]} for j in range(n_frames)],
        }],
        updatemenus=[{
            "type": "buttons", "x": 0.0, "y": below(drop_px + NOTE_PX), "yanchor": "top", "xanchor": "left",
            "direction": "left",
            "buttons": [
                {"label": "▶", "method": "animate",
                 "args": [None, {**show, "frame": {"duration": 400, "redraw": True}, "fromcurrent": True}]},
                {"label": "❚❚", "method": "animate", "args": [[None], show]},
            ],
        }],
    )
    fig.update_yaxes(gridcolor="#eee")
    return fig


def replay_snapshot(replays: AttentionReplay | Mapping[str, AttentionReplay], token: int | None = None,
                    title: str = "Attention replay"):
    """One token of the replay as a matplotlib Figure (default: `start_token`), for static outputs."""
    import matplotlib.pyplot as plt

    runs = _as_runs(replays)
    rows = _rows(runs)
    who = selector_name(runs)
    j = start_token(runs) if token is None else token
    fig, axes = plt.subplots(len(rows), len(runs), figsize=(6.5 * len(runs), 2.3 * len(rows) + 2.2),
                             squeeze=False, sharex="col", sharey="row")
    for c, (name, rep) in enumerate(runs.items()):
        for r, row in enumerate(rows):
            ax = axes[r][c]
            values, _, _, colors, outlined = _bar_style(rep, row, j)
            ax.bar(range(len(values)), [math.nan if v is None else v for v in values], color=colors,
                   edgecolor=[SELECTED_OUTLINE if o else "none" for o in outlined], linewidth=2)
            if row == "selected":
                ax.set_ylim(0, 1.05)
                if rep.selected is None:
                    ax.text(0.5, 0.5, f"no selection ({rep.method or name})", transform=ax.transAxes, ha="center",
                            color="#888")
            share = outside_share(rep, row, j)
            if share is not None:
                ax.text(1, 1, f"outside every edge: {share:.0%}", transform=ax.transAxes, ha="right", va="top",
                        fontsize=8, color="#555")
            if c == 0:
                ax.set_ylabel(ROW_TITLES[row].format(who=who).replace("<br>", "\n"))
            if r == 0:
                ax.set_title(f"{name}: token {j} {rep.pieces[j].replace(chr(10), '⏎')!r}" if j < len(rep)
                             else f"{name}: ended after {len(rep)} tokens", fontsize=10)
        axes[-1][c].set_xticks(range(len(rep.names)), rep.names, rotation=45, ha="right", fontsize=7)
    fig.suptitle(title.split("\n")[0] + f"\norange: gold edge of the step · red outline: {who} selected "
                 f"≥{SELECTED_AT:.0%} of the span", fontsize=10)
    fig.tight_layout()
    return fig


def write_replay_html(
    replays: AttentionReplay | Mapping[str, AttentionReplay], path: str | Path, title: str = "Attention replay"
) -> Path:
    """Write the figure as one HTML file that opens offline (`render_html.write_plotly`); the
    slider waits for the reader instead of playing on load."""
    return write_plotly(replay_figure(replays, title), path, auto_play=False)


__all__ = ["destination_token", "outside_share", "replay_figure", "replay_snapshot", "selector_name", "start_token",
           "tick_drop_px", "tick_label", "token_caption", "write_replay_html"]
