"""The steering harness end to end on a tiny model: dev grids, one choice per method, test rows
at the choices; and its driver's refusals before any model loads."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dysco_interp.errors import ConfigError
from dysco_interp.studies import harness
from dysco_interp.studies.harness_protocol import GRIDS

REPO = Path(__file__).resolve().parents[1]


def test_the_parts_run_end_to_end_on_a_tiny_model(tmp_path):
    from dysco_interp.analysis.records import read_records
    from dysco_interp.heads import HeadSet
    from dysco_interp.models.tiny import tiny_model
    from dysco_interp.tasks import make_dataset, save_dataset

    model = tiny_model("llama", max_position_embeddings=4096)  # room for the 400 forced tokens
    data = tmp_path / "data"
    for split, seed in (("dev", 1), ("test", 0)):
        save_dataset(data / split / "path_traversal_1950.jsonl",
                     make_dataset("path_traversal", model.tokenizer, 1950, n=2, seed=seed, progress=False))
    # two grids of two points keep the CPU run short; the parts, stores and choice are what is checked
    grids = {"uniattns": ({"tau": 0.9}, {"tau": 0.8}), "dysco": ({}, {"select_k": 32})}
    s = harness.HarnessSettings("tiny-llama", data, tmp_path / "out", ("uniattns", "dysco"),
                                tasks=("path_traversal",), lengths=("1950",), grids=grids, backend="sdpa")
    lines: list[str] = []
    harness.run_harness(model, HeadSet([(1, 0), (2, 1)]), s, log=lines.append)
    dev = read_records(s.store("dev", "path_traversal", "1950"))
    assert len(dev) == 2 * 5  # two instances x (vanilla + two points of each method)
    choices = json.loads(s.choice_path.read_text())["choices"]
    assert set(choices) == {"uniattns", "dysco"}
    assert choices["uniattns"]["point"] in [{"tau": 0.9}, {"tau": 0.8}] and choices["dysco"]["rule"]
    for kind in ("tf", "free"):
        test = read_records(s.store("test", "path_traversal", "1950", kind))
        assert sorted({r["method"] for r in test}) == sorted(harness.test_methods(s, 1))
        assert len(test) == 2 * 3
    assert [line.split(":")[0] for line in lines[1:3]] == ["uniattns", "dysco"]
    # a second call finds every record stored
    again: list[str] = []
    harness.run_harness(model, HeadSet([(1, 0), (2, 1)]), s, log=again.append)
    assert all(" 0 new records" in line for line in again if "records" in line)
    # the leaderboard: every method in both modes, one BH family, a figure per mode that opens offline
    from dysco_interp.studies.harness_report import leaderboard, write_reports
    from dysco_interp.viz.render_html import opens_offline

    written = write_reports(s.out_dir)
    board = leaderboard(s.folder)
    assert {(r["mode"], r["method"]) for r in board["rows"]} == {(m, n) for m in ("tf", "free")
                                                                 for n in ("uniattns", "dysco")}
    assert all(r["n"] == 2 and r["delta"]["q"] is not None for r in board["rows"])
    assert {Path(p).name for p in written} >= {"leaderboard.md", "leaderboard.json", "where_tiny-llama_tf.png",
                                               "where_tiny-llama_free.html"}
    assert opens_offline(s.folder / "where_tiny-llama_tf.html")
    assert "| tiny-llama | teacher forced | path_traversal | 1K |" in (s.folder / "leaderboard.md").read_text()


@pytest.mark.parametrize("changes, message", [
    ({"parts": ("dev", "sweep")}, "unknown part"),
    ({"methods": ("vanilla", "dysco")}, "vanilla is every cell's baseline"),
    ({"methods": ("dysco",), "grids": {**GRIDS, "dysco": ({"select_k": 0},)}}, "select_k must be"),
    ({"methods": ("dysco",), "grids": {**GRIDS, "mine": ({},)}}, "a grid for 'mine'"),
    ({"methods": ("no-such-method",)}, "unknown method"),
])
def test_bad_settings_are_one_line_before_any_model_loads(tmp_path, changes, message):
    base = {"model_name": "m", "data_dir": tmp_path, "out_dir": tmp_path, "methods": ("dysco",)}
    with pytest.raises(ConfigError, match=message):
        harness.check_settings(harness.HarnessSettings(**{**base, **changes}))


def test_the_test_parts_need_the_dev_choice(tmp_path):
    s = harness.HarnessSettings("m", tmp_path, tmp_path, ("dysco",))
    with pytest.raises(ConfigError, match="run the dev part and 'choose' first"):
        harness.test_methods(s, 16)


@pytest.mark.parametrize("argv, message", [
    (["--grid", "dysco={beta: 2}"], "dysco=...: not valid JSON"),
    (["--grid", "dysco=" + "[" * 50_000 + "]" * 50_000], "nested too deeply"),
    (["--grid", 'dysco={"beta": 2}'], "--grid takes NAME=[{...}, ...]"),
    (["--grid", 'dysco=[{"select_k": 0}]'], "select_k must be"),
    ([], "make the dev split first"),
    (["--methods", "dysco,nothing"], "unknown method"),
    (["--parts", "dev,sweep"], "unknown part"),
])
def test_the_driver_refuses_bad_flags_in_one_line_before_any_model_loads(tmp_path, argv, message):
    proc = subprocess.run([sys.executable, str(REPO / "analyses" / "harness.py"), "--data-dir", str(tmp_path),
                           "--out-dir", str(tmp_path / "out"), *argv], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
