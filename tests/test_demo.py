"""`dysco-interp demo` on the default model: the teacher-forced step table, both free routes, the
verdict, and one HTML page that opens offline."""

import re

import pytest

from dysco_interp.cli import main
from dysco_interp.viz.render_html import PLOTLYJS_NAME, loaded_plotlyjs

pytestmark = pytest.mark.real_model


def test_demo_prints_the_mechanism_and_both_routes_and_writes_the_page(tmp_path, capsys, trace_types,
                                                                      cartesian_trace_types):
    out = tmp_path / "demo" / "demo.html"
    assert main(["demo", "--max-new-tokens", "12", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "gold route:" in printed and "From " in printed.split("gold route:")[1]
    assert "K 8, β 1.5" in printed  # the small-budget preset by default
    # one line per route step: the gold edge, where the heads looked, what each method predicted
    steps = re.findall(r"^  (\d) +\S.* → .*\(rank \d+/\d+\).*[+-]\d\.\d\d +[+-]\d\.\d\d +(yes|no) +(yes|no)$",
                       printed, re.MULTILINE)
    assert [s[0] for s in steps] == ["1", "2", "3", "4"]
    assert re.search(r"step accuracy: vanilla \d\.\d\d, DySCO \d\.\d\d", printed)
    assert re.search(r"^vanilla, free greedy generation: .*steps right", printed, re.MULTILINE)
    assert re.search(r"^DySCO, free greedy generation: .*steps right", printed, re.MULTILINE)
    assert "DySCO selected" in printed and str(out) in printed
    # the default model cannot show the effect: one line says so and names the model that can
    assert re.search(r"^smollm2-135m is too small to show DySCO's effect on one instance: .*"
                     r"dysco-interp demo --model qwen2.5-coder-1.5b", printed, re.MULTILINE)

    html = out.read_text()
    # opens offline: the one script loaded is the plotly.min.js written beside the page, no copy inlined
    assert re.findall(r"<script[^>]+src=\"([^\"]*)\"", html) == [PLOTLYJS_NAME] and len(html) < 1_000_000
    assert loaded_plotlyjs(out) == out.parent / PLOTLYJS_NAME and (out.parent / PLOTLYJS_NAME).is_file()
    assert html.count("Plotly.newPlot") == 4 and "addFrames" in html
    assert trace_types(out) and trace_types(out) <= cartesian_trace_types  # drawn by the cartesian bundle too
    assert "Teacher-forced on the gold route" in html and "Free greedy generation" in html
    # the effect measured over many instances, beside this one instance's mechanism
    assert "The effect over many instances" in html and "<tr class=this>" in html
    box = re.search(r"<p class='verdict[^']*'>(.*?)</p>", html).group(1)
    assert "<code>dysco-interp install-model qwen2.5-coder-1.5b" in box and "`" not in box  # no Markdown
    assert re.search(r"^Measured on qwen2.5-coder-1.5b, Path Traversal test split", printed, re.MULTILINE)


def test_demo_rejects_a_bad_setting(tmp_path, capsys):
    assert main(["demo", "--length", "10", "--out", str(tmp_path / "x.html")]) == 2
    assert "too short" in capsys.readouterr().err
