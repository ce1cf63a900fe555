"""Figures read on a projector: split panels, outside legends, reference lines, legend entries
for framed heads, responsive HTML and byte-identical redraws."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from dysco_interp.studies.overhead import is_batched, panels, short_label
from dysco_interp.studies.table_reports import robustness_panels, zero_note
from dysco_interp.viz import heatmap, render_html, render_png
from dysco_interp.viz.figures import save_ci_lines, save_panels
from dysco_interp.viz.panels import Panel, Series

REPO = Path(__file__).resolve().parents[1]


def _meas(label, context, batch, source="figures/bench.json", **extra):
    return {"source": source, "label": label, "model": "qwen3-8b-random", "device": "H100", "backend": "static",
            "context": context, "batch": batch, "vanilla_tok_per_s": 50.0, "dysco_tok_per_s": 30.0,
            "slowdown": 50 / 30, "flops_ratio": 1.69, "vanilla_peak_gib": 20.0, "dysco_peak_gib": 20.1, **extra}


def _speed_panels():
    from dysco_interp.studies.overhead import overhead_settings

    meas = [_meas("a", 32768, 1), _meas("b", 2048, 16), _meas("c", 102400, None)]
    return panels(overhead_settings([], [1024], [100]), meas)


def test_overhead_keeps_batched_and_single_stream_speeds_in_separate_panels():
    by_title = {p.title: p for p in _speed_panels()}
    single = by_title["Decode speed, single stream (batch 1)"]
    batched = by_title["Decode speed, batched"]
    assert {x for s in single.series for x in s.x} == {"qwen3-8b shape · H100 static · 32K",
                                                      "qwen3-8b shape · H100 static · 100K"}
    assert {x for s in batched.series for x in s.x} == {"qwen3-8b shape · H100 static · 2K × 16"}
    # one row per configuration, read left to right
    assert single.horizontal and batched.horizontal and by_title["Peak memory"].horizontal
    slow = by_title["Slowdown, batched"]
    assert slow.ref == 1.0 and [s.x for s in slow.series][0] == batched.series[0].x
    assert is_batched({"batch": 4}) and not is_batched({"batch": 1}) and not is_batched({"batch": None})


def test_overhead_labels_are_short():
    row = _meas("long", 65536, 4, variant="dysco-reuse")
    assert short_label(row) == "qwen3-8b shape · H100 static · 64K × 4 · dysco-reuse"
    assert short_label({"source": "evaluation stores", "model": "m", "task": "path_traversal", "context": 2048,
                        "batch": 50}) == "m · eval run (path traversal) · 2K × 50"
    # the static backend's float32 reference attention and YaRN are configurations of their own
    assert short_label({**_meas("x", 131072, 1), "attention": "float32", "yarn": 4.0}) == \
        "qwen3-8b shape · H100 static (float32 attention) · 128K YaRN 4"


def test_committed_overhead_report_names_no_machine_of_its_own():
    text = (REPO / "figures/overhead/overhead.md").read_text()
    assert "this machine" not in text and "not converted" not in text
    doc = json.loads((REPO / "figures/overhead/overhead.json").read_text())
    assert {m["shape_source"] for m in doc["models"] if m["role"] == "ours"} == {"its HF config.json"}


def _point(model, value, mean, delta, metric="step_accuracy", hi=None):
    return {"model": model, "task": "path_traversal", "length": 2048, "setting": {"max_new_tokens": 120},
            "param": "beta", "value": value, "is_default": value == 2.0,
            "metrics": {metric: {"mean": mean, "lo": 0.0, "hi": mean if hi is None else hi}},
            "delta": {metric: {"mean": delta, "lo": min(delta, 0.0) - 0.01 * (delta != 0),
                               "hi": max(delta, 0.0)}}}


def test_robustness_panels_plot_deltas_against_a_vanilla_line_on_one_scale():
    pts = [_point("a", 2.0, 0.3, 0.1), _point("a", 3.0, 0.2, -0.05)]
    out = robustness_panels(pts)
    beta = next(p for p in out if p.title == "Path Traversal step accuracy vs strength beta")
    assert beta.ref == 0.0 and "vanilla" in beta.ref_label
    assert list(beta.series[0].y) == [0.1, -0.05]  # differences, not the raw scores
    lo, hi = beta.ylim
    assert lo == -hi and hi >= 0.1  # symmetric about vanilla, every interval inside
    assert all(p.ylim == beta.ylim for p in out)


def test_a_row_of_zeros_says_so():
    zero = {"a": [_point("a", 2.0, 0.0, 0.0, hi=0.0)]}
    assert "DySCO and vanilla alike" in zero_note(zero, "step_accuracy")
    below = {"a": [_point("a", 2.0, 0.0, -0.02, hi=0.0)]}
    assert zero_note(below, "step_accuracy").startswith("DySCO scores 0")
    assert zero_note({"a": [_point("a", 2.0, 0.1, 0.1)]}, "step_accuracy") == ""


def _grid():
    return [
        Panel("p1", "y", [Series("m1", [0.1, 0.0], [0.0, -0.1], [0.2, 0.1], x=[1024, 4096])], log_x=True,
              mark_x=4096, mark_label="default", ref=0.0, ref_label="vanilla", annotation="note"),
        Panel("p2", "y", [Series("m1", [0.2, 0.0], x=[1024, 4096])], log_x=True, mark_x=4096,
              mark_label="default", ref=0.0, ref_label="vanilla"),
        Panel("speed", "", [Series("vanilla", [3.0, 2.0], x=["a", "b"]), Series("DySCO", [1.5, 1.0], x=["a", "b"])],
              kind="bar", horizontal=True, log_y=True),
        Panel("slowdown", "", [Series("ratio", [2.0, 2.0], x=["a", "b"])], kind="bar", horizontal=True, ref=1.0,
              ref_label="1x"),
    ]


def test_png_legends_sit_outside_the_axes_once_per_row():
    fig = render_png.panels_figure(_grid(), title="t", ncols=2)
    axes = fig.axes
    assert axes[0].get_legend() is None  # same entries as its right neighbour: drawn there
    legend = axes[1].get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["default", "vanilla", "m1"]
    assert legend.get_bbox_to_anchor().x0 > axes[1].get_window_extent().x1 - 1  # right of the axes
    # the horizontal slowdown panel repeats its neighbour's rows, without their labels
    assert [t.get_text() for t in axes[2].get_yticklabels()] == ["a", "b"]
    assert all(t.get_text() == "" for t in axes[3].get_yticklabels())
    assert "note" in [t.get_text() for t in axes[0].texts]


def test_html_grid_is_responsive_with_reference_lines_in_the_legend():
    fig = render_html.panels_figure(_grid(), title="t", ncols=2)
    assert fig.layout.width is None and fig.layout.legend.orientation == "h"
    refs = [s for s in fig.layout.shapes if s.name in ("vanilla", "1x")]
    assert {s.name for s in refs if s.showlegend} == {"vanilla", "1x"}
    bars = [t for t in fig.data if t.type == "bar"]
    assert bars and all(t.orientation == "h" for t in bars)
    assert fig.layout.xaxis.ticktext == ("1K", "4K")


def test_heatmap_frames_have_a_legend_entry_in_both_formats():
    scores = torch.tensor([[0.8, 0.1, 0.3], [0.2, 0.5, 0.0]])
    top = [(0, 0), (1, 1)]
    fig = heatmap.head_scores_figure(scores, title="t", highlight=top)
    texts = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert texts == ["top-2 heads (framed)"]
    plotly_fig = heatmap.head_scores_plotly(scores, title="t", highlight=top)
    marks = [t for t in plotly_fig.data if t.type == "scatter"]
    assert marks[0].name.startswith("top-2 heads") and plotly_fig.layout.showlegend
    assert plotly_fig.layout.legend.orientation == "h"  # under the map, clear of the colour bar


@pytest.mark.parametrize("draw", ["grid", "lines", "heatmap"])
def test_redraws_are_byte_identical(tmp_path, draw):
    def once(folder: Path) -> list[bytes]:
        if draw == "grid":
            paths = save_panels(_grid(), folder / "fig", title="t", ncols=2)
        elif draw == "lines":
            paths = save_ci_lines([Panel("a", "y", [Series("s", [0.1, 0.2], [0.0, 0.1], [0.2, 0.3])])], ["1K", "2K"],
                                  folder / "fig", title="t", xlabel="x")
        else:
            paths = heatmap.save_head_heatmaps(torch.eye(3), folder / "h.json", model="m", method="qrscore",
                                               highlight=[(0, 0)])
        return [Path(p).read_bytes() for p in paths]

    first, second = once(tmp_path / "a"), once(tmp_path / "b")
    assert first == second
    html = first[1].decode()
    # the plot fills the window's width and follows it when resized
    assert '"responsive": true' in html and re.search(r'class="plotly-graph-div" style="[^"]*width:100%', html)
