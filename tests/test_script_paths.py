"""Names read from data files become one safe path component: no analysis script writes
outside the folder it was given, whatever a store's records say."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from dysco_interp.paths import safe_component

REPO = Path(__file__).resolve().parents[1]
EVIL = ["../../x/pwn", "..", ".", "", "/etc/passwd", "a/b", "a\\b", "x\x00y", "~", "-rf", "é" * 300]


def run_script(name: str, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "analyses" / f"{name}.py"), *argv], capture_output=True,
                          text=True, timeout=600, cwd=cwd)


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


def test_plain_names_are_kept_and_others_become_one_component():
    for name in ("qwen2.5-coder-0.5b", "smollm2-135m", "m-test", "path_traversal", "Qwen3-8B_2k_0"):
        assert safe_component(name) == name
    made = [safe_component(n) for n in EVIL]
    for name in made:
        assert name and "/" not in name and "\\" not in name and "\x00" not in name
        assert not name.startswith((".", "-")) and ".." not in name and len(name) <= 100
    assert len(set(made)) == len(made)  # different names never share a file
    assert safe_component("a/b") != safe_component("a_b")
    assert safe_component(7) == "7"


def test_first_error_figures_only_writes_inside_out_dir(tmp_path):
    from dysco_interp.studies.first_error_figures import draw

    out = tmp_path / "a" / "out"
    record = {"model": "../../pwn", "length": 1024, "index": "../x"}
    before = files_under(tmp_path)
    draw(record, out, "test", figures=False)
    new = files_under(tmp_path) - before
    assert len(new) == 1 and all(p.parent == out for p in new), new


def test_causal_ablation_summaries_stay_inside_out_dir_and_apart(tmp_path, monkeypatch):
    from dysco_interp.studies import ablation_summary

    out = tmp_path / "a" / "out"
    out.mkdir(parents=True)
    (out / "m.jsonl").write_text("")
    models = ["x/m", "y/m", "../../m"]
    monkeypatch.setattr(ablation_summary, "read_study", lambda path: ({}, [{"model": m} for m in models]))
    monkeypatch.setattr(ablation_summary, "summarise", lambda records, model, n_boot: {"model": model})
    before = files_under(tmp_path)
    ablation_summary.write_outputs(out, None, 10, "test", figures=False)
    new = files_under(tmp_path) - before
    assert len(new) == 3 and all(p.parent == out for p in new), new  # one file per model, none overwritten
    assert sorted(json.loads(p.read_text())["model"] for p in new) == sorted(models)
