"""Head-score heatmaps: PNG and self-contained plotly HTML."""

from __future__ import annotations

import math
import re

import pytest
import torch

from dysco_interp.viz import heatmap

SCORES = torch.tensor([[0.8125, -1.0, 0.25], [0.125, 0.5, -1.0]])


def test_grid_blanks_unscored_heads():
    grid = heatmap.head_score_grid(SCORES)
    assert math.isnan(grid[0, 1]) and math.isnan(grid[1, 2]) and grid[0, 0] == 0.8125
    # an explicit mask wins over the -1 convention (a real score may be -1)
    scored = torch.tensor([[True, True, False], [True, True, True]])
    grid = heatmap.head_score_grid(SCORES, scored)
    assert grid[0, 1] == -1.0 and math.isnan(grid[0, 2])
    with pytest.raises(ValueError, match="n_layers, n_heads"):
        heatmap.head_score_grid(torch.zeros(3))
    with pytest.raises(ValueError, match="does not match"):
        heatmap.head_score_grid(SCORES, torch.ones(3, 2, dtype=torch.bool))


def test_png_is_written(tmp_path):
    path = heatmap.head_scores_png(SCORES, tmp_path / "sub" / "h.png", title="t", highlight=[(0, 0)])
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    import matplotlib.image

    img = matplotlib.image.imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100


def test_html_is_self_contained_and_holds_the_scores(tmp_path):
    path = heatmap.head_scores_html(SCORES, tmp_path / "h.html", title="qrscore head scores: tiny", highlight=[(0, 0)])
    html = path.read_text()
    # no CDN or any other external script (plotly.js itself mentions cdn.plot.ly for geo maps)
    assert not re.search(r"<script[^>]*\bsrc=", html)
    assert len(html) > 1_000_000 and "Plotly.newPlot" in html  # plotly.js inlined
    assert "0.8125" in html and "0.125" in html and "null" in html  # scores, unscored as gaps
    assert "qrscore head scores: tiny" in html


def test_save_head_heatmaps_names_files_after_the_head_file(tmp_path):
    png, html = heatmap.save_head_heatmaps(SCORES, tmp_path / "heads.json", model="m", method="qrscore", n_examples=3)
    assert png == tmp_path / "heads_heatmap.png" and html == tmp_path / "heads_heatmap.html"
    assert png.exists() and "qrscore head scores: m, 3 examples" in html.read_text()
