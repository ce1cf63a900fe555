"""The whole small pipeline on the real default model: every table and figure is written
and holds what it should (runs analyses/run_all.py --small; a few minutes on 2 CPU cores).
Redrawing from stores with --out-dir writes only there, the same bytes every time."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dysco_interp.stores.archives import stores_in
from dysco_interp.studies import overhead
from dysco_interp.studies.decoding_runs import SMALL_TAUS
from dysco_interp.studies.pipeline import SMALL_N
from dysco_interp.viz.render_html import opens_offline

REPO = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MODEL = "smollm2-135m"


def check_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 5000, path


def check_html(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    # draws, with plotly.js from the shared copy on disk and no external script
    assert opens_offline(path) and "Plotly.newPlot" in text, path


def check_md(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# ") and "|---|" in text, path


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run_all_small")
    proc = subprocess.run([sys.executable, str(REPO / "analyses/run_all.py"), "--small", "--out-dir", str(out)],
                          capture_output=True, text=True)
    return out, proc.returncode


@pytest.mark.real_model
def test_every_step_succeeds(small_run):
    out, rc = small_run
    summary = json.loads((out / "run_all.json").read_text())
    failed = [(s["step"], s["reason"]) for s in summary["steps"] if s["status"] != "ok"]
    assert rc == 0 and not failed, failed
    assert all(s["outputs"] for s in summary["steps"])


@pytest.mark.real_model
def test_stores_follow_the_planned_layout(small_run):
    out, _ = small_run
    expected = [f"mrcr/{MODEL}_1k_tau.jsonl", f"path_traversal/{MODEL}_1k.jsonl",
                *(f"{d}/{MODEL}_{t}_1k.jsonl" for d in ("ablations", "robustness") for t in ("path_traversal", "mrcr"))]
    for name in expected:
        header, *records = [json.loads(x) for x in (out / name).read_text().splitlines()]
        assert header["kind"] == "dysco-interp-store" and header["settings"]["model"] == MODEL, name
        assert records and all(r["model"] == MODEL and r["settings"]["model"] == MODEL for r in records), name


@pytest.mark.real_model
def test_path_traversal_table(small_run):
    out, _ = small_run
    table = json.loads((out / "path_traversal/table.json").read_text())
    check_md(out / "path_traversal/table.md")
    assert [r["role"] for r in table["rows"]] == ["vanilla", "uniattns", "dysco"]
    assert all(r["n"] == SMALL_N and r["length"] == 1024 for r in table["rows"])
    sweep = table["tau_selection"][MODEL]
    assert [r["tau"] for r in sweep["rows"]] == sorted(SMALL_TAUS)
    assert sweep["chosen_tau"] in SMALL_TAUS
    for r in table["rows"]:
        for est in r["metrics"].values():
            assert 0 <= est["lo"] <= est["mean"] <= est["hi"] <= 1


@pytest.mark.real_model
def test_ablation_table(small_run):
    out, _ = small_run
    table = json.loads((out / "ablations/table.json").read_text())
    check_md(out / "ablations/table.md")
    assert len(table["rows"]) == 2 * 3  # two tasks x (DySCO, random heads, static)
    assert {(r["task"], r["variant"]) for r in table["rows"]} == {
        (t, v) for t in ("path_traversal", "mrcr") for v in ("dysco", "dysco-random", "dysco-static")}
    assert all(r["n"] == 2 for r in table["rows"])


@pytest.mark.real_model
def test_robustness_figure(small_run):
    out, _ = small_run
    result = json.loads((out / "robustness/robustness.json").read_text())
    # two tasks x three parameters x (default + one other value)
    assert len(result["points"]) == 2 * 3 * 2
    assert sum(p["is_default"] for p in result["points"]) == 2 * 3
    check_png(out / "robustness/robustness.png")
    check_html(out / "robustness/robustness.html")
    check_md(out / "robustness/robustness.md")


@pytest.mark.real_model
def test_overhead_figure(small_run):
    out, _ = small_run
    result = json.loads((out / "overhead/overhead.json").read_text())
    # the paper's setting (2 output lengths) + 2 models x 4 input x 2 output lengths
    assert len(result["flops"]) == 2 + 2 * 4 * 2
    paper = result["flops"][0]
    assert paper["model"] == "Qwen3-8B" and 1.6 < paper["decode_ratio"] < 1 + 25 / 36
    labels = [r["label"] for r in result["measured"]]
    assert any(MODEL in label for label in labels)  # speeds from the small run's records
    check_png(out / "overhead/overhead.png")
    check_html(out / "overhead/overhead.html")
    check_md(out / "overhead/overhead.md")


@pytest.mark.real_model
@pytest.mark.parametrize("name", ["motivation", "first_error"])
def test_other_analyses_ran_small(small_run, name):
    out, _ = small_run
    folder = out / name
    pngs, htmls, jsons = (sorted(folder.glob(f"*.{ext}")) for ext in ("png", "html", "json"))
    assert pngs and htmls and jsons, f"{name}: missing outputs in {folder}"
    for p in pngs:
        check_png(p)
    figures = [h for h in htmls if "Plotly.newPlot" in h.read_text(encoding="utf-8")]
    assert figures, f"{name}: no plotly figure among {htmls}"
    for h in figures:
        check_html(h)
    for j in jsons:
        assert json.loads(j.read_text()), j


@pytest.mark.real_model
def test_recorded_shapes_match_the_converted_configs():
    from dysco_interp.models import packaged as packaged_models

    checked = 0
    for alias, shape in overhead.RECORDED_SHAPES.items():
        model = packaged_models.REGISTRY[alias]
        if not packaged_models.is_converted(model):
            continue
        setting = overhead.model_setting(alias)  # reads config.json when converted
        assert setting["shape"].as_dict() == {**shape, "mlp_matrices": 3, "name": alias}
        checked += 1
    assert checked >= 1  # the default model is always converted where real-model tests run


def tree_hashes(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_redraw_into_out_dir_writes_only_there_and_is_byte_identical(tmp_path):
    src = tmp_path / "figs"
    (src / "reuse").mkdir(parents=True)
    for store in stores_in(REPO / "figures" / "reuse"):  # committed compressed
        shutil.copy2(store, src / "reuse" / store.name)
    before, committed = tree_hashes(src), tree_hashes(REPO / "figures")
    outs = [tmp_path / "out_a", tmp_path / "elsewhere" / "out_b"]
    for out in outs:
        proc = subprocess.run([sys.executable, str(REPO / "analyses/run_all.py"), "--figures-dir", str(src),
                               "--out-dir", str(out)], capture_output=True, text=True, cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert tree_hashes(src) == before  # the stores' folder is only read
    assert tree_hashes(REPO / "figures") == committed  # the heatmaps once went into the repository's figures/
    a, b = (tree_hashes(out) for out in outs)
    for name in ("reuse/table.md", "reuse/table.json", "overhead/overhead.html", "overhead/overhead.png",
                 "heads/smollm2-135m_qrscore_heatmap.html", "heads/smollm2-135m_qrscore_heatmap.png"):
        assert name in a, name
    # a copy of the stores plus the outputs, byte for byte the same wherever it is written
    assert set(before) < set(a) and a == b
    table = (outs[0] / "reuse/table.md").read_text(encoding="utf-8")
    assert table.rstrip().endswith("`python analyses/ablation_table.py --stores 'figures/reuse/*.jsonl' "
                                   "--out figures/reuse/table`")


def test_two_draws_of_a_figure_are_byte_identical(tmp_path):
    from dysco_interp.viz.panels import Panel, Series
    from dysco_interp.viz.render_html import ci_lines_html, panels_html
    from dysco_interp.viz.render_png import ci_lines_png, panels_png

    line = [Panel("acc", "accuracy", (Series("dysco", [0.1, 0.5, None], lo=[0.0, 0.4, None], hi=[0.2, 0.6, None]),))]
    grid = [Panel("p", "score", (Series("a", [1.0, 2.0], x=[1, 4]),), xlabel="K", log_x=True, mark_x=2.0)]
    drawn = []
    for run in ("one", "two"):
        folder = tmp_path / run
        drawn.append([ci_lines_html(line, ["1k", "2k", "4k"], folder / "ci.html", title="t", xlabel="length"),
                      ci_lines_png(line, ["1k", "2k", "4k"], folder / "ci.png", title="t", xlabel="length"),
                      panels_html(grid, folder / "grid.html", title="g"),
                      panels_png(grid, folder / "grid.png", title="g")])
    for first, second in zip(*drawn):
        assert first.read_bytes() == second.read_bytes(), first.name
    # the plot's element id comes from the file name, not a random uuid
    ci = drawn[0][0].read_text(encoding="utf-8")
    assert 'id="plot-ci"' in ci and "Plotly.newPlot" in ci
    assert not re.search(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", ci)
