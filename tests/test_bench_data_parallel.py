"""The data-parallel throughput benchmark: one and two gloo processes on the CPU, records compared."""

import json
import os
from pathlib import Path

import pytest

from dysco_interp.analysis import bench_data_parallel as dp
from dysco_interp.cli import main as cli

REPO = Path(__file__).resolve().parents[1]


def load_script():
    import importlib.util

    path = REPO / "analyses/bench_data_parallel.py"
    spec = importlib.util.spec_from_file_location("bench_data_parallel_script", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_one_and_two_processes_give_the_same_records(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert cli(["make-data", "needle_qa", "--model", "tiny-llama", "--lengths", "400", "--n", "3",
                "--out", str(tmp_path / "data")]) == 0
    out = tmp_path / "dp.json"
    script = load_script()
    code = script.main(["--processes", "1,2", "--work-dir", str(tmp_path / "runs"), "--out", str(out), "--",
                        "--model", "tiny-llama", "--task", "needle_qa", "--data", str(tmp_path / "data"),
                        "--methods", "vanilla", "--max-new-tokens", "3", "--device", "cpu", "--threads", "1"])
    assert code == 0
    doc = json.loads(out.read_text())
    assert [r["processes"] for r in doc["rows"]] == [1, 2] and doc["all_records_equal"]
    assert all(r["instances"] == 3 and r["records"] == 3 and r["instances_per_s"] > 0 for r in doc["rows"])
    assert doc["rows"][0]["speedup"] == 1.0 and doc["n_gpus"] == 0
    assert "--processes 1,2" in doc["command"]
    # each run wrote its own store, and no shard is left beside the two-process one
    assert sorted(p.name for p in (tmp_path / "runs").iterdir() if p.suffix == ".jsonl") == \
        ["results_1.jsonl", "results_2.jsonl", "warmup.jsonl"]
    assert all(r["decoding_instances_per_s"] > 0 and r["busiest_rank_decoding_s"] > 0 for r in doc["rows"])
    # a sweep in pieces: finished runs are read back with their recorded seconds, never repeated
    monkeypatch.setattr(dp.subprocess, "run", lambda *a, **k: pytest.fail("a finished run was repeated"))
    again = dp.scaling([1, 2], ["--model", "tiny-llama"], tmp_path / "runs", reuse=True)
    assert [r["seconds"] for r in again["rows"]] == [r["seconds"] for r in doc["rows"]]


def test_the_busiest_rank_is_found_from_the_round_robin_share():
    def rec(instance, method, seconds):
        return {"instance": instance, "method": method, "timings": {"prefill_s": 1.0, "decode_s": seconds - 1.0}}

    records = [rec("a", "vanilla", 2), rec("a", "dysco", 3), rec("b", "vanilla", 4), rec("b", "dysco", 4),
               rec("c", "vanilla", 1), rec("c", "dysco", 1)]
    assert dp.busiest_rank_seconds(records, 1) == 15.0
    assert dp.busiest_rank_seconds(records, 2) == 8.0  # rank 0: a and c (7 s); rank 1: b (8 s)
    assert dp.busiest_rank_seconds(records, 3) == 8.0


def test_a_changed_record_is_caught_and_bad_arguments_are_refused(tmp_path):
    record = {"instance": "a", "method": "vanilla", "score": 1.0, "timings": {"decode_s": 1.0, "n_new": 3}}
    slower = {**record, "timings": {"decode_s": 9.0, "n_new": 3}}
    assert dp.comparable([record]) == dp.comparable([slower])
    assert dp.comparable([record]) != dp.comparable([{**record, "score": 0.0}])
    with pytest.raises(dp.ConfigError, match=">= 1"):
        dp.scaling([0, 2], ["--model", "m"], tmp_path)
    existing = tmp_path / "results_1.jsonl"
    existing.write_text("")
    with pytest.raises(dp.ConfigError, match="fresh store"):
        dp.timed_run(1, ["--model", "m"], existing)
    script = load_script()
    with pytest.raises(SystemExit, match="after --"):
        script.main(["--processes", "1"])
    with pytest.raises(SystemExit, match="leave --out out"):
        script.main(["--", "--out", "x.jsonl"])
