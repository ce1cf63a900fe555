"""`dysco-interp demo` on the default model: both routes, the gold one, and a self-contained replay HTML."""

import re

import pytest

from dysco_interp.cli import main

pytestmark = pytest.mark.real_model


def test_demo_prints_both_routes_and_writes_the_replay(tmp_path, capsys):
    out = tmp_path / "demo" / "attention_replay.html"
    assert main(["demo", "--max-new-tokens", "12", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "gold route:" in printed and "From " in printed.split("gold route:")[1]
    assert re.search(r"^vanilla: .*steps right", printed, re.MULTILINE)
    assert re.search(r"^dysco: .*steps right", printed, re.MULTILINE)
    assert "DySCO selected" in printed and str(out) in printed

    html = out.read_text()
    assert not re.search(r"<script[^>]+src=", html)  # plotly.js inlined: opens offline
    assert "Plotly.newPlot" in html and "addFrames" in html
    assert "vanilla" in html and "dysco" in html and "QRHeads" in html


def test_demo_rejects_a_bad_setting(tmp_path, capsys):
    assert main(["demo", "--length", "10", "--out", str(tmp_path / "x.html")]) == 2
    assert "too short" in capsys.readouterr().err
