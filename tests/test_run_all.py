"""The whole small pipeline on the real default model: every table and figure is written
and holds what it should (runs analyses/run_all.py --small; a few minutes on 2 CPU cores)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dysco_interp.analysis import overhead
from dysco_interp.analysis.decoding_runs import SMALL_TAUS
from dysco_interp.analysis.pipeline import SMALL_N

pytestmark = pytest.mark.real_model

REPO = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MODEL = "smollm2-135m"


def check_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 5000, path


def check_html(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    # plotly.js inlined (opens offline): large, draws, loads no external script
    assert len(text) > 1_000_000 and "Plotly.newPlot" in text, path
    assert not re.search(r"<script[^>]*\bsrc=", text), path


def check_md(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# ") and "|---|" in text, path


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run_all_small")
    proc = subprocess.run([sys.executable, str(REPO / "analyses/run_all.py"), "--small", "--out-dir", str(out)],
                          capture_output=True, text=True)
    return out, proc.returncode


def test_every_step_succeeds(small_run):
    out, rc = small_run
    summary = json.loads((out / "run_all.json").read_text())
    failed = [(s["step"], s["reason"]) for s in summary["steps"] if s["status"] != "ok"]
    assert rc == 0 and not failed, failed
    assert all(s["outputs"] for s in summary["steps"])


def test_stores_follow_the_planned_layout(small_run):
    out, _ = small_run
    expected = [f"mrcr/{MODEL}_1k_tau.jsonl", f"path_traversal/{MODEL}_1k.jsonl",
                *(f"{d}/{MODEL}_{t}_1k.jsonl" for d in ("ablations", "robustness") for t in ("path_traversal", "mrcr"))]
    for name in expected:
        header, *records = [json.loads(x) for x in (out / name).read_text().splitlines()]
        assert header["kind"] == "dysco-interp-store" and header["settings"]["model"] == MODEL, name
        assert records and all(r["model"] == MODEL and r["settings"]["model"] == MODEL for r in records), name


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


def test_ablation_table(small_run):
    out, _ = small_run
    table = json.loads((out / "ablations/table.json").read_text())
    check_md(out / "ablations/table.md")
    assert len(table["rows"]) == 2 * 3  # two tasks x (DySCO, random heads, static)
    assert {(r["task"], r["variant"]) for r in table["rows"]} == {
        (t, v) for t in ("path_traversal", "mrcr") for v in ("dysco", "dysco-random", "dysco-static")}
    assert all(r["n"] == 2 for r in table["rows"])


def test_robustness_figure(small_run):
    out, _ = small_run
    result = json.loads((out / "robustness/robustness.json").read_text())
    # two tasks x three parameters x (default + one other value)
    assert len(result["points"]) == 2 * 3 * 2
    assert sum(p["is_default"] for p in result["points"]) == 2 * 3
    check_png(out / "robustness/robustness.png")
    check_html(out / "robustness/robustness.html")
    check_md(out / "robustness/robustness.md")


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
