"""The attention-replay figure, on hand-made replays (no model)."""

import math
import re

import pytest
import torch

from dysco_interp.analysis.replay import AttentionReplay
from dysco_interp.errors import ConfigError
from dysco_interp.viz.replay_view import GOLD_COLOR, SELECTED_OUTLINE, replay_figure, token_caption, write_replay_html


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
    assert len(fig.data) == 6  # 3 rows x 2 runs
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


def test_caption_marks_the_token_and_the_gold_edge():
    rep = make_replay()
    assert "gold: B → C" in token_caption(rep, 0)
    assert "no gold span" in token_caption(rep, 1) and "⏎" in token_caption(rep, 1)
    assert "ended" in token_caption(rep, 5)


def test_html_is_self_contained(tmp_path):
    path = write_replay_html(make_replay(), tmp_path / "sub" / "replay.html", title="t <x>\nsecond line")
    text = path.read_text()
    assert not re.search(r"<script[^>]+src=", text)  # no CDN: plotly.js is inlined
    assert "Plotly.newPlot" in text and "addFrames" in text and "t &lt;x&gt;" in text and "second line" in text
    assert path.stat().st_size > 1_000_000


def test_bad_input_is_a_clear_error():
    with pytest.raises(ConfigError):
        replay_figure({})
    with pytest.raises(ConfigError, match="AttentionReplay"):
        replay_figure({"x": object()})
