"""Panel grids: PNG and self-contained HTML with the data inside."""

from __future__ import annotations

import pytest

from dysco_interp.viz.figures import save_panels
from dysco_interp.viz.panels import Panel, Series
from dysco_interp.viz.render_html import opens_offline

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_panels_with_lines_bars_marks_and_empty_panels(tmp_path):
    panels = [
        Panel("acc vs K", "accuracy", [Series("1K", [0.25, 0.5], [0.0, 0.25], [0.5, 0.75], x=[256, 4096])],
              xlabel="K", log_x=True, mark_x=4096, mark_label="default 4096"),
        Panel("speed", "tok/s",
              [Series("vanilla", [3.0, 2.0], x=["a", "b"]), Series("DySCO", [1.5, None], x=["a", "b"])],
              kind="bar", log_y=True),
        Panel("memory", "GiB", [], kind="bar", note="nothing measured"),
    ]
    png, html = save_panels(panels, tmp_path / "sub" / "fig", title="grid", ncols=2)
    assert png.name == "fig.png" and png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 5000
    text = html.read_text()
    # plotly.js from the shared copy beside it, no external script
    assert html.name == "fig.html" and opens_offline(html) and "Plotly.newPlot" in text
    assert "default 4096" in text and "nothing measured" in text
    # the data travel in the file: the means, and the interval as offsets from them (0.75 - 0.5)
    assert '"y":[0.25,0.5]' in text and '"array":[0.25,0.25]' in text and "DySCO" in text


def test_bad_panels_are_rejected():
    with pytest.raises(ValueError, match="y has 1 values for 2"):
        Series("s", [0.5], x=[1, 2])
    with pytest.raises(ValueError, match="both lo and hi"):
        Series("s", [0.5], lo=[0.1], x=[1])
    with pytest.raises(ValueError, match="kind"):
        Panel("t", "y", xlabel="x", kind="pie")
    with pytest.raises(ValueError, match="at least one panel"):
        save_panels([], "unused", title="t")
