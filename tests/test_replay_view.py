"""The attention-replay figure, on hand-made replays (no model)."""

import math
import re

import pytest
import torch

from dysco_interp.analysis.replay import AttentionReplay
from dysco_interp.errors import ConfigError
from dysco_interp.viz.render_html import PLOTLYJS_NAME, loaded_plotlyjs
from dysco_interp.viz.replay_view import (
    GOLD_COLOR,
    SELECTED_OUTLINE,
    replay_figure,
    replay_snapshot,
    start_token,
    tick_drop_px,
    tick_label,
    token_caption,
    write_replay_html,
)


def make_replay(method="dysco", n_tokens=3, selected=True):
    names = ["A → B", "B → C", "C → D"]
    qr = torch.tensor([[0.1, 0.5, 0.2], [0.3, 0.1, 0.0], [0.0, 0.0, 0.9]])[:n_tokens]
    sel = torch.tensor([[1.0, 0.2, 0.0], [0.6, 0.6, 0.6], [math.nan] * 3])[:n_tokens] if selected else None
    return AttentionReplay(
        method=method, names=names, spans=[(0, 4), (4, 8), (8, 12)], tokens=[5, 6, 7][:n_tokens],
        pieces=["<Route>", "\n", "From"][:n_tokens], query_positions=[11, 12, 13][:n_tokens],
        qr_heads=qr, all_heads=qr / 10, heads=[(1, 0)], selected=sel, gold=[1, None, 2][:n_tokens],
        details=["A to B.", "B to C.", "C to D."],
    )


def test_one_frame_per_token_with_gold_and_selection_marks():
    fig = replay_figure({"vanilla": make_replay("vanilla", n_tokens=2, selected=False), "dysco": make_replay()},
                        title="replay of <Route>\nline two")
    assert fig.layout.title.text == "replay of &lt;Route&gt;<br>line two"
    assert len(fig.frames) == 3  # the longer run sets the slider
    bars = [t for t in fig.data if t.type == "bar"]
    assert len(bars) == 6  # 3 rows x 2 runs
    legend = [t.name for t in fig.data if t.showlegend]
    assert any("QRHeads" in n for n in legend) and any("gold edge" in n for n in legend)
    assert any("red outline" in n for n in legend)  # the bars' colours and outlines explained in a legend
    dysco_qr = fig.frames[0].data[3]
    assert list(dysco_qr.y) == [0.1, 0.5, 0.2]
    assert dysco_qr.marker.color[1] == GOLD_COLOR and dysco_qr.text[1] == "★"
    # selected >= 50% of the span's tokens: outlined
    assert list(dysco_qr.marker.line.width) == [3, 0, 0] and dysco_qr.marker.line.color == SELECTED_OUTLINE
    # the vanilla run ended after 2 tokens: its bars are empty on frame 2
    assert all(v is None for v in fig.frames[2].data[0].y)
    # a step without selection draws no selection bars
    assert all(v is None for v in fig.frames[2].data[5].y)
    # y ranges follow the frame's largest bar
    assert fig.frames[2].layout.yaxis.range[1] == pytest.approx(0.9 * 1.2)
    texts = " ".join(a.text for a in fig.frames[0].layout.annotations)
    assert "no selection (vanilla)" in texts and "&lt;Route&gt;" in texts  # tags escaped for plotly
    # each span's text is the trace's, once; a frame carries only the token's values
    assert list(fig.data[3].customdata) == ["A → B<br>A to B.", "B → C<br>B to C.", "C → D<br>C to D."]
    assert fig.data[3].hovertemplate == "%{customdata}<br>%{hovertext}<extra></extra>"
    assert dysco_qr.customdata is None and "A to B." not in str(dysco_qr.hovertext)
    assert dysco_qr.hovertext[1] == "value 0.5000<br>DySCO selected 20% of its tokens<br><b>gold edge of this step</b>"


def test_caption_marks_the_token_and_the_gold_edge():
    rep = make_replay()
    assert "gold: B → C" in token_caption(rep, 0)
    assert "no gold span" in token_caption(rep, 1) and "⏎" in token_caption(rep, 1)
    assert "ended" in token_caption(rep, 5)


def test_html_opens_offline_with_plotlyjs_beside_it(tmp_path):
    path = write_replay_html(make_replay(), tmp_path / "sub" / "replay.html", title="t <x>\nsecond line")
    text = path.read_text()
    # no CDN: the one script loaded is the plotly.min.js written beside the page
    assert re.findall(r"<script[^>]+src=\"([^\"]*)\"", text) == [PLOTLYJS_NAME]
    assert loaded_plotlyjs(path) == tmp_path / "sub" / PLOTLYJS_NAME and (tmp_path / "sub" / PLOTLYJS_NAME).is_file()
    assert "Plotly.newPlot" in text and "addFrames" in text and "t &lt;x&gt;" in text and "second line" in text
    assert path.stat().st_size < 1_000_000  # no copy of plotly.js of its own


def test_bad_input_is_a_clear_error():
    with pytest.raises(ConfigError):
        replay_figure({})
    with pytest.raises(ConfigError, match="AttentionReplay"):
        replay_figure({"x": object()})


def route_replay():
    """A replay of "<Route>\nFrom A, take a bus to B." with a gold edge on every route token."""
    pieces = ["<Route>", "\n", "From", " A", ",", " take", " a", " bus", " to", " B", "."]
    n = len(pieces)
    qr = torch.full((n, 3), 0.1)
    return AttentionReplay(
        method="dysco", names=["A → B", "B → C", "C → D"], spans=[(0, 4), (4, 8), (8, 12)], tokens=list(range(n)),
        pieces=pieces, query_positions=list(range(11, 11 + n)), qr_heads=qr, all_heads=qr / 2, heads=[(1, 0)],
        gold=[None, None] + [0] * (n - 2))


def test_the_figure_opens_on_the_first_destination_city_with_token_numbers_on_the_slider():
    rep = route_replay()
    assert start_token(rep) == 9  # " B": the first token the QRHeads have to look up
    fig = replay_figure(rep)
    assert fig.layout.sliders[0].active == 9
    # numbers, not token fragments ("<", "Sh", "acent"): side by side, the runs' tokens differ, and
    # each column's caption shows its own
    assert [step.label for step in fig.layout.sliders[0].steps] == [str(j) for j in range(len(rep))]
    assert fig.layout.sliders[0].currentvalue.prefix == "token "
    # the first frame shown is that token's, not token 0's
    assert "<b>" in token_caption(rep, 9) and "token 9" in fig.layout.annotations[0].text
    # no route line at all: the first token with a gold span, else 0
    assert start_token(make_replay()) == 0
    # a run that writes no route line does not pull the start back to its first token
    assert start_token({"vanilla": make_replay("vanilla"), "dysco": rep}) == 9
    with pytest.raises(ConfigError, match="start token"):
        replay_figure(rep, start=99)


def test_each_panel_says_how_much_attention_fell_outside_every_edge():
    fig = replay_figure(route_replay())
    notes = [a.text for a in fig.layout.annotations if a.text.startswith("outside every edge")]
    assert notes == ["outside every edge: 70%", "outside every edge: 85%"]  # 1 - 3 x 0.1, 1 - 3 x 0.05
    assert fig.layout.width is None and fig.layout.autosize  # the width follows the window


def test_html_is_responsive_and_redraws_byte_identically(tmp_path):
    a = write_replay_html(route_replay(), tmp_path / "a" / "replay.html").read_bytes()
    b = write_replay_html(route_replay(), tmp_path / "b" / "replay.html").read_bytes()
    assert a == b and b'"responsive": true' in a


def test_static_snapshot_draws_the_start_token():
    fig = replay_snapshot({"vanilla": make_replay("vanilla", selected=False), "dysco": route_replay()})
    assert len(fig.axes) == 4  # neither run selected anything: QRHeads and all-heads rows, two runs
    # the start token of the figure: the destination city of the run that writes a route line
    assert fig.axes[0].get_title() == "vanilla: ended after 3 tokens"
    assert fig.axes[1].get_title() == "dysco: token 9 ' B'"


def test_the_layout_leaves_no_gap_over_the_captions_and_room_under_long_edge_names():
    short = replay_figure(make_replay())
    names = ["Budapest XVI. kerulet → Saint Clair Shores", "B → C", "C → D"]
    long = replay_figure(AttentionReplay(**{**vars(make_replay()), "names": names}))
    assert tick_label(names[0]) == "Budapest XVI. kerulet →<br>Saint Clair Shores"
    assert tick_drop_px(names) > tick_drop_px(["A → B"])
    for fig, edge_names in ((short, make_replay().names), (long, names)):
        plot_px = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
        # the legend's foot and the captions' head: the captions are 3 lines (under 70 px)
        legend_px = (fig.layout.legend.y - 1) * plot_px
        assert legend_px <= 75
        # the note under the axis starts below the rotated names, the slider below the note
        note = next(a for a in fig.layout.annotations if a.text.startswith("attention: mean over heads"))
        assert -note.y * plot_px == pytest.approx(tick_drop_px(edge_names, fig.layout.xaxis3.tickfont.size))
        assert fig.layout.sliders[0].y < note.y
    assert long.layout.margin.b > short.layout.margin.b  # longer names push the note and slider down
