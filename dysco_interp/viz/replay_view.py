"""The attention replay as an interactive plotly figure, and as one offline HTML file.

One column per run (e.g. vanilla and DySCO side by side), one frame per generated token,
moved by a slider. Rows: per-span attention of the QRHeads, of all heads, and the fraction
of each span's tokens DySCO selected. The gold span of the token's route step is orange
(and starred); spans of which DySCO selected at least half the tokens get a red outline.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from pathlib import Path

from dysco_interp.analysis.replay import AttentionReplay
from dysco_interp.atomic import atomic_open
from dysco_interp.errors import ConfigError

ROW_COLORS = {"qr_heads": "#4c78a8", "all_heads": "#72b7b2", "selected": "#b279a2"}
ROW_TITLES = {
    "qr_heads": "QRHeads<br>attention", "all_heads": "all heads<br>attention", "selected": "DySCO<br>selected",
}
GOLD_COLOR = "#f58518"
SELECTED_OUTLINE = "#d62728"
SELECTED_AT = 0.5  # outline spans with at least this fraction of their tokens selected
CONTEXT_CHARS = 70  # generated text shown before the current token
ROW_PX = 230  # height of one row of bar charts


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


def _bar(rep: AttentionReplay, row: str, j: int) -> dict:
    """One bar trace's data for token j: heights, gold colour, selection outline, hover."""
    values = _row_values(rep, row, j)
    gold = rep.gold[j] if rep.gold is not None and j < len(rep) else None
    chosen = _row_values(rep, "selected", j) if rep.selected is not None else [None] * len(values)
    colors = [GOLD_COLOR if i == gold else ROW_COLORS[row] for i in range(len(values))]
    widths = [3 if c is not None and c >= SELECTED_AT else 0 for c in chosen]
    details = rep.details or rep.names
    hover = [
        f"{_visible(rep.names[i])}<br>{_visible(details[i])}<br>"
        + ("no value" if values[i] is None else f"value {values[i]:.4f}")
        + ("" if chosen[i] is None else f"<br>DySCO selected {chosen[i]:.0%} of its tokens")
        + ("<br><b>gold edge of this step</b>" if i == gold else "")
        for i in range(len(values))
    ]
    return {
        "y": values,
        "marker": {"color": colors, "line": {"color": SELECTED_OUTLINE, "width": widths}},
        "text": ["★" if i == gold and values[i] is not None else "" for i in range(len(values))],
        "hovertext": hover,
    }


def replay_figure(replays: AttentionReplay | Mapping[str, AttentionReplay], title: str = "Attention replay"):
    """A plotly Figure with one frame per generated token (slider and play button)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    runs = _as_runs(replays)
    rows = ["qr_heads", "all_heads"] + (["selected"] if any(r.selected is not None for r in runs.values()) else [])
    n_frames = max(len(r) for r in runs.values())
    fig = make_subplots(
        rows=len(rows), cols=len(runs), shared_xaxes=True, vertical_spacing=0.06, horizontal_spacing=0.06
    )
    # fixed pixel layout: the bottom margin holds rotated edge names, the note and the slider
    plot_px, top_px, bottom_px = ROW_PX * len(rows), 150, 300
    width_px, left_px, right_px = max(760, 640 * len(runs)), 80, 40
    slider_x = 100 / (width_px - left_px - right_px)  # leaves room for the play buttons

    def below(px: int) -> float:  # paper y of a point px pixels under the plots
        return -px / plot_px

    cells = [(r, c, row, rep) for c, rep in enumerate(runs.values(), 1) for r, row in enumerate(rows, 1)]
    for r, c, row, rep in cells:
        fig.add_trace(
            go.Bar(x=list(range(len(rep.names))), textposition="outside", hoverinfo="text", showlegend=False,
                   **_bar(rep, row, 0)),
            row=r, col=c,
        )
        fig.update_yaxes(title_text=ROW_TITLES[row] if c == 1 else None, row=r, col=c)
    for c, rep in enumerate(runs.values(), 1):
        labelled = len(rep.names) <= 40
        fig.update_xaxes(
            tickvals=list(range(len(rep.names))) if labelled else None,
            ticktext=[_visible(n) for n in rep.names] if labelled else None,
            tickangle=-45, row=len(rows), col=c,
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

    def annotations(j: int) -> list[dict]:
        out = []
        for c, (name, rep) in enumerate(runs.items(), 1):
            out.append({"text": f"<b>{_visible(name)}</b><br>{token_caption(rep, j)}", "x": (c - 0.5) / len(runs),
                        "y": 1.02, "xref": "paper", "yref": "paper", "xanchor": "center", "yanchor": "bottom",
                        "showarrow": False, "font": {"size": 11}, "align": "left"})
            if "selected" in rows and rep.selected is None:
                x_id, y_id = axes[len(rows), c].yaxis.anchor, axes[len(rows), c].xaxis.anchor  # "x5", "y5"
                out.append({"text": f"no selection ({_visible(rep.method or name)})", "showarrow": False,
                            "x": 0.5, "y": 0.5, "xref": f"{x_id} domain", "yref": f"{y_id} domain",
                            "font": {"color": "#888"}})
        out.append({"text": "bars: context spans in prompt order · orange ★: gold edge of the token's route "
                            f"step · red outline: DySCO selected ≥{SELECTED_AT:.0%} of the span's tokens<br>"
                            "attention: mean over heads of the row that produced the token, summed over the span "
                            "(teacher-forced pass, no DySCO bias)",
                    "x": 0, "y": below(200), "xref": "paper", "yref": "paper", "showarrow": False,
                    "xanchor": "left", "yanchor": "top", "align": "left", "font": {"size": 10, "color": "#555"}})
        return out

    fig.frames = [
        go.Frame(name=str(j), data=[go.Bar(**_bar(rep, row, j)) for _, _, row, rep in cells],
                 traces=list(range(len(cells))), layout={"annotations": annotations(j), **y_ranges(j)})
        for j in range(n_frames)
    ]
    fig.update_layout(annotations=annotations(0), **y_ranges(0))
    show = {"mode": "immediate", "frame": {"duration": 0, "redraw": True}, "transition": {"duration": 0}}
    fig.update_layout(
        # a title's lines stay lines (the modebar sits at the top right of the first one)
        title={"text": "<br>".join(html.escape(line) for line in title.split("\n")), "x": 0.01, "y": 0.975,
               "yanchor": "top"},
        height=plot_px + top_px + bottom_px,
        width=width_px,
        margin={"t": top_px, "b": bottom_px, "l": left_px, "r": right_px},
        plot_bgcolor="white",
        bargap=0.15,
        sliders=[{
            "active": 0, "y": below(240), "yanchor": "top", "len": 1 - slider_x, "x": slider_x,
            "currentvalue": {"prefix": "generated token "},
            "steps": [{"label": str(j), "method": "animate", "args": [[str(j)], show]} for j in range(n_frames)],
        }],
        updatemenus=[{
            "type": "buttons", "x": 0.0, "y": below(240), "yanchor": "top", "xanchor": "left", "direction": "left",
            "buttons": [
                {"label": "▶", "method": "animate",
                 "args": [None, {**show, "frame": {"duration": 400, "redraw": True}, "fromcurrent": True}]},
                {"label": "❚❚", "method": "animate", "args": [[None], show]},
            ],
        }],
    )
    fig.update_yaxes(gridcolor="#eee")
    return fig


def write_replay_html(
    replays: AttentionReplay | Mapping[str, AttentionReplay], path: str | Path, title: str = "Attention replay"
) -> Path:
    """Write the figure as one self-contained HTML file (plotly.js inlined; opens offline)."""
    path = Path(path)
    with atomic_open(path) as f:  # a page of several MB: never leave half of one behind
        replay_figure(replays, title).write_html(f, include_plotlyjs=True, full_html=True, auto_play=False)
    return path


__all__ = ["replay_figure", "token_caption", "write_replay_html"]
