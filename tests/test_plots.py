"""Head-score heatmaps: PNG and plotly HTML; every HTML figure the package writes loads the one
shared plotly.min.js by a relative path."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from dysco_interp.analysis.replay import AttentionReplay
from dysco_interp.viz import heatmap
from dysco_interp.viz.figures import save_bars, save_ci_lines, save_panels
from dysco_interp.viz.panels import BarPanel, Panel, Series
from dysco_interp.viz.render_html import (
    CARTESIAN_PLOTLYJS,
    CARTESIAN_PLOTLYJS_VERSION,
    PLOTLYJS_NAME,
    SHARED_MARKER,
    cartesian_plotlyjs,
    loaded_plotlyjs,
    plotlyjs_bundle,
    write_plotly,
)
from dysco_interp.viz.replay_view import write_replay_html

REPO = Path(__file__).resolve().parents[1]

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


def check_shared_plotlyjs(page: Path) -> Path:
    """`page` draws with plotly, loads it from a plotly.min.js beside it or one folder up that is
    the plotly.js the package writes, embeds no copy of its own and loads nothing else; returns
    that copy."""
    html = page.read_text(encoding="utf-8")
    js = loaded_plotlyjs(page)
    assert js is not None and js.is_file() and js.read_bytes() == plotlyjs_bundle(), page
    assert js.parent in (page.absolute().parent, page.absolute().parent.parent), js
    # no CDN nor any other external script (plotly.js itself mentions cdn.plot.ly for geo maps)
    assert re.findall(r"<script[^>]*\bsrc=\"([^\"]*)\"", html) in (
        [PLOTLYJS_NAME], [f"../{PLOTLYJS_NAME}"]), page
    assert "Plotly.newPlot" in html and plotlyjs_bundle()[:300].decode() not in html and len(html) < 1_000_000
    return js


def test_html_loads_the_shared_plotlyjs_and_holds_the_scores(tmp_path):
    path = heatmap.head_scores_html(SCORES, tmp_path / "h.html", title="qrscore head scores: tiny", highlight=[(0, 0)])
    assert check_shared_plotlyjs(path) == tmp_path / PLOTLYJS_NAME
    html = path.read_text()
    assert "0.8125" in html and "0.125" in html and "null" in html  # scores, unscored as gaps
    assert "qrscore head scores: tiny" in html


def test_save_head_heatmaps_names_files_after_the_head_file(tmp_path):
    png, html = heatmap.save_head_heatmaps(SCORES, tmp_path / "heads.json", model="m", method="qrscore", n_examples=3)
    assert png == tmp_path / "heads_heatmap.png" and html == tmp_path / "heads_heatmap.html"
    assert png.exists() and "qrscore head scores: m, 3 examples" in html.read_text()


def draw_every_html_figure(folder: Path) -> list[Path]:
    """One HTML file of each writer of the package, in two subfolders of `folder`."""
    panel = Panel("acc", "accuracy", (Series("dysco", [0.1, 0.5], lo=[0.0, 0.4], hi=[0.2, 0.6]),))
    qr = torch.tensor([[0.1, 0.5], [0.3, 0.1]])
    replay = AttentionReplay(method="dysco", names=["A → B", "B → C"], spans=[(0, 4), (4, 8)], tokens=[5, 6],
                             pieces=["A", "B"], query_positions=[11, 12], qr_heads=qr, all_heads=qr / 2,
                             heads=[(1, 0)], gold=[0, 1])
    return [
        save_ci_lines([panel], ["1k", "2k"], folder / "a" / "ci", title="t", xlabel="length")[1],
        save_bars([BarPanel("b", "score", [0.5, 0.2])], ["L0H0", "L0H1"], folder / "a" / "bars", title="t",
                  marks={0: "top"})[1],
        save_panels([Panel("p", "score", (Series("a", [1.0, 2.0], x=[1, 4]),))], folder / "b" / "grid", title="g")[1],
        heatmap.save_head_heatmaps(SCORES, folder / "b" / "h.json", model="m", method="qrscore")[1],
        write_replay_html(replay, folder / "b" / "replay.html"),
    ]


def test_every_html_figure_loads_one_plotlyjs_beside_it_or_from_a_tree_that_lends_it(tmp_path):
    import plotly.graph_objects as go

    # an output folder of its own: a copy beside the figures of each folder, so each opens offline
    pages = draw_every_html_figure(tmp_path / "out")
    assert {check_shared_plotlyjs(p) for p in pages} == {tmp_path / "out" / s / PLOTLYJS_NAME for s in "ab"}
    # a copy one folder up is not borrowed: each output folder opens offline when moved alone
    write_plotly(go.Figure(), tmp_path / "parent" / "top.html")
    pages = draw_every_html_figure(tmp_path / "parent")
    assert {check_shared_plotlyjs(p) for p in pages} == {tmp_path / "parent" / s / PLOTLYJS_NAME for s in "ab"}
    # a tree that lends its copy (as figures/ does): its subfolders share that one and get none
    write_plotly(go.Figure(), tmp_path / "tree" / "top.html")
    (tmp_path / "tree" / SHARED_MARKER).touch()
    pages = draw_every_html_figure(tmp_path / "tree")
    assert {check_shared_plotlyjs(p) for p in pages} == {tmp_path / "tree" / PLOTLYJS_NAME}
    assert sorted(tmp_path.glob(f"tree/**/{PLOTLYJS_NAME}")) == [tmp_path / "tree" / PLOTLYJS_NAME]


def test_the_shared_copy_is_written_only_when_missing_or_different(tmp_path):
    import plotly.graph_objects as go

    page = write_plotly(go.Figure(), tmp_path / "f.html")
    js = tmp_path / PLOTLYJS_NAME
    first = js.stat()
    write_plotly(go.Figure(), tmp_path / "g.html")
    assert (js.stat().st_ino, js.stat().st_mtime_ns) == (first.st_ino, first.st_mtime_ns)  # left as it was
    js.write_text("/* plotly.js of an older plotly */")
    write_plotly(go.Figure(), page)
    assert js.read_bytes() == plotlyjs_bundle()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.html", "g.html", PLOTLYJS_NAME]  # no temporary left


CARTESIAN_BANNER = re.compile(rb"\A/\*\*\n\* plotly\.js \(cartesian - minified\) v(\S+)\n")


def full_plotlyjs() -> bytes:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs().encode("utf-8")


def test_the_shipped_bundle_is_the_cartesian_plotlyjs_of_the_version_it_is_recorded_as():
    js = cartesian_plotlyjs()
    assert cartesian_plotlyjs() is js  # decompressed once
    banner = CARTESIAN_BANNER.match(js)
    assert banner is not None, js[:200]
    assert banner.group(1).decode() == CARTESIAN_PLOTLYJS_VERSION
    assert len(js) < len(full_plotlyjs()) / 2
    folder = REPO / "dysco_interp" / "viz" / CARTESIAN_PLOTLYJS[0]
    assert (folder / "LICENSE").read_text(encoding="utf-8").startswith("MIT License")
    assert f" {CARTESIAN_PLOTLYJS_VERSION}\n" in (folder / "README.md").read_text(encoding="utf-8")


def test_every_trace_the_package_draws_is_in_the_cartesian_bundle(tmp_path, trace_types, cartesian_trace_types):
    assert {"scatter", "bar", "heatmap"} <= cartesian_trace_types and "scatter3d" not in cartesian_trace_types
    pages = draw_every_html_figure(tmp_path)
    committed = sorted((REPO / "figures").rglob("*.html"))
    pages += [p for p in committed if "Plotly.newPlot" in p.read_text(encoding="utf-8")]
    drawn = {str(p): trace_types(p) for p in pages}
    assert all(drawn.values()) and {"scatter", "bar", "heatmap"} <= set().union(*drawn.values())
    assert {p: t - cartesian_trace_types for p, t in drawn.items() if t - cartesian_trace_types} == {}


def test_pages_load_the_cartesian_bundle_where_plotly_bundles_its_version(tmp_path, monkeypatch):
    import plotly.graph_objects as go
    import plotly.offline

    monkeypatch.setattr(plotly.offline, "get_plotlyjs_version", lambda: CARTESIAN_PLOTLYJS_VERSION)
    page = write_plotly(go.Figure(go.Heatmap(z=[[1, 2], [3, 4]])), tmp_path / "h.html")
    js = (tmp_path / PLOTLYJS_NAME).read_bytes()
    assert loaded_plotlyjs(page) == tmp_path / PLOTLYJS_NAME
    assert js == plotlyjs_bundle() == cartesian_plotlyjs() and CARTESIAN_BANNER.match(js)
    assert len(js) < len(full_plotlyjs()) / 2


@pytest.mark.parametrize("patched", ["plotly", "shipped"])
def test_pages_load_plotlys_full_bundle_under_another_plotlyjs_version(tmp_path, monkeypatch, patched):
    import plotly.graph_objects as go
    import plotly.offline

    from dysco_interp.viz import render_html

    if patched == "plotly":  # a plotly release that bundles another plotly.js
        monkeypatch.setattr(plotly.offline, "get_plotlyjs_version", lambda: "0.0.0")
    else:
        monkeypatch.setattr(render_html, "CARTESIAN_PLOTLYJS_VERSION", "0.0.0")
    js = tmp_path / PLOTLYJS_NAME
    js.write_bytes(cartesian_plotlyjs())  # written under the other version: replaced
    write_plotly(go.Figure(go.Bar(y=[1, 2])), tmp_path / "b.html")
    assert js.read_bytes() == plotlyjs_bundle() == full_plotlyjs()
    assert CARTESIAN_BANNER.match(js.read_bytes()) is None


def test_the_committed_figures_share_one_plotlyjs():
    figures = REPO / "figures"
    pages = [p for p in sorted(figures.rglob("*.html")) if "Plotly.newPlot" in p.read_text(encoding="utf-8")]
    assert pages and {check_shared_plotlyjs(p) for p in pages} == {figures / PLOTLYJS_NAME}
    assert list(figures.rglob(PLOTLYJS_NAME)) == [figures / PLOTLYJS_NAME]
