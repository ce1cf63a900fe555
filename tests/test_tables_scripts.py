"""The table and figure scripts on small synthetic stores (no model): outputs, missing inputs,
and run_all's regenerate mode skipping what has no stores."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dysco_interp.viz.render_html import opens_offline

REPO = Path(__file__).resolve().parents[1]


def run_script(name: str, *argv: str) -> subprocess.CompletedProcess:
    """`python analyses/<name>.py ARGV`, as a user runs it."""
    return subprocess.run([sys.executable, str(REPO / "analyses" / f"{name}.py"), *argv], capture_output=True,
                          text=True, timeout=600)


def ok(proc: subprocess.CompletedProcess) -> bool:
    assert proc.returncode == 0, proc.stderr[-2000:]
    return True


def _record(method, task, index, value, **config):
    metrics = {"score": value} if task == "mrcr" else {"accuracy": value, "step_accuracy": value,
                                                        "partial_accuracy": value}
    return {"model": "m", "task": task, "length": 1024, "method": method if not config else f"{method} {config}",
            "seed": 0, "index": index, "id": f"{task}-{index}", "output": "", "finished": True,
            "timings": {"decode_tok_per_s": 10.0 if method == "vanilla" else 6.0},
            "config": {"method": method, "max_new_tokens": 8, "schedule": "reference", "template_masking": "reference",
                       **config}, **metrics}


def _write(path: Path, records) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture()
def figures(tmp_path):
    root = tmp_path / "figures"
    _write(root / "mrcr/m_1k_tau.jsonl", [_record("uniattns", "mrcr", i, v, tau=t)
                                          for t, vals in ((0.975, [0.2, 0.4]), (0.85, [0.5, 0.5]))
                                          for i, v in enumerate(vals)])
    _write(root / "path_traversal/m_1k.jsonl",
           [_record(m, "path_traversal", i, v, **c) for m, c, vals in
            (("vanilla", {}, [0, 1, 0]), ("uniattns", {"tau": 0.85}, [1, 1, 0]), ("dysco", {}, [1, 1, 1]))
            for i, v in enumerate(vals)])
    for task in ("path_traversal", "mrcr"):
        _write(root / f"ablations/m_{task}_1k.jsonl",
               [_record(m, task, i, v) for m, vals in (("dysco", [1, 1]), ("dysco-random", [0, 1]),
                                                        ("dysco-static", [0, 0])) for i, v in enumerate(vals)])
    return root


@pytest.mark.slow
def test_table_scripts_on_synthetic_stores(figures, tmp_path):
    out = tmp_path / "out"
    assert ok(run_script("pt_table", "--stores", str(figures / "path_traversal/*.jsonl"), "--tau-stores",
                         str(figures / "mrcr/*.jsonl"), "--out", str(out / "pt")))
    table = json.loads((out / "pt.json").read_text())
    assert table["tau_selection"]["m"]["chosen_tau"] == 0.85  # 0.5 beats 0.3
    assert [(r["method"], r["metrics"]["accuracy"]["mean"]) for r in table["rows"]] == [
        ("vanilla", pytest.approx(1 / 3, abs=1e-4)), ("UniAttnS (tau=0.85)", pytest.approx(2 / 3, abs=1e-4)),
        ("DySCO", 1.0)]
    assert "**chosen**" in (out / "pt.md").read_text()
    assert ok(run_script("ablation_table", "--stores", str(figures / "ablations/*.jsonl"), "--out", str(out / "abl")))
    assert len(json.loads((out / "abl.json").read_text())["rows"]) == 6
    assert ok(run_script("robustness", "--stores", str(figures / "ablations/*.jsonl"), "--out", str(out / "rob")))
    rob = json.loads((out / "rob.json").read_text())
    assert len(rob["points"]) == 2 * 3 and all(p["is_default"] for p in rob["points"])
    assert (out / "rob.png").read_bytes()[:4] == b"\x89PNG" and opens_offline(out / "rob.html")


@pytest.mark.slow
def test_scripts_say_what_is_missing(tmp_path):
    missing = str(tmp_path / "none/*.jsonl")
    proc = run_script("ablation_table", "--stores", missing, "--out", str(tmp_path / "x"))
    assert proc.returncode == 2
    assert "no records" in proc.stderr
    proc = run_script("pt_table", "--stores", missing, "--tau-stores", missing, "--out", str(tmp_path / "x"))
    assert proc.returncode == 2
    assert "no Path Traversal records" in proc.stderr


@pytest.mark.slow
def test_overhead_without_benchmarks(tmp_path):
    out = tmp_path / "ov"
    assert ok(run_script("overhead", "--bench", str(tmp_path / "none.json"), "--stores", "--out", str(out)))
    result = json.loads(out.with_suffix(".json").read_text())
    assert [r["setting"] for r in result["flops"]][:2] == ["paper", "paper"] and len(result["flops"]) == 2 + 8
    assert [r["source"] for r in result["measured"]] == ["paper (reported)"]
    assert any("no benchmark file matches" in n for n in result["notes"])
    assert any("no peak-memory measurements" in n for n in result["notes"])


@pytest.mark.slow
def test_run_all_regenerates_what_has_stores(figures):
    proc = run_script("run_all", "--figures-dir", str(figures))
    assert ok(proc)
    log = proc.stdout
    assert "robustness figure: skipped" in log and "motivation figure (from its stored records): skipped" in log
    for name in ("path_traversal/table.md", "ablations/table.json", "overhead/overhead.png",
                 "overhead/overhead.html"):
        assert (figures / name).stat().st_size > 0, name


def test_the_preset_table_redraws_the_committed_paper_regime_numbers_from_its_stores(tmp_path):
    committed = json.loads((REPO / "figures/paper_regime/test_tf.json").read_text())
    assert ok(run_script("preset_table", "--stores",
                         str(REPO / "figures/paper_regime/test/*_path_traversal_*k_tf.jsonl"),
                         "--out", str(tmp_path / "tf_table")))
    ours = json.loads((tmp_path / "tf_table.json").read_text())

    def numbers(rows):  # the study names presets where the script prints labels
        return sorted(json.dumps([r["length"], r["n"], r["params"], r["metrics"], r["delta"]], sort_keys=True)
                      for r in rows)

    assert ours["rows"] and numbers(ours["rows"]) == numbers(committed["rows"])
    vanilla = [r for r in ours["rows"] if r["method"] == "vanilla"]
    assert vanilla and all(r["delta"] is None for r in vanilla)
    assert all(r["delta"] is not None for r in ours["rows"] if r["method"] != "vanilla")
    bad = run_script("preset_table", "--stores", str(tmp_path / "none*.jsonl"), "--out", str(tmp_path / "x"))
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
