"""The CPU thread rule (`dysco_interp.threads`): --threads, then OMP_NUM_THREADS, then the free cores."""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch

from dysco_interp import threads
from dysco_interp.analysis import bench_threads
from dysco_interp.cli import main
from dysco_interp.errors import ConfigError


@pytest.fixture(autouse=True)
def keep_torch_threads():
    # the commands set torch's thread count for the whole process; the other tests run on one
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("allowed,machine,load,expected", [
    (2, 2, 0.0, 2), (2, 2, 0.4, 2), (2, 2, 0.6, 1), (2, 2, 2.0, 1), (2, 2, 40.0, 1),
    (4, 16, 10.0, 4), (16, 16, 10.0, 6), (8, 4, 0.0, 4),
])
def test_free_cores_are_the_allowed_ones_less_the_load(allowed, machine, load, expected):
    assert threads.free_cores(allowed, machine, load) == expected


def test_the_flag_wins_then_the_environment_then_the_free_cores(monkeypatch):
    assert threads.choose_threads(3, {"OMP_NUM_THREADS": "5"}) == threads.ThreadChoice(3, "--threads")
    assert threads.choose_threads(None, {"OMP_NUM_THREADS": "5"}) == threads.ThreadChoice(5, "OMP_NUM_THREADS")
    assert threads.choose_threads(None, {"OMP_NUM_THREADS": "4,2"}).n == 4  # OpenMP's nested list: the outer count
    monkeypatch.setattr(threads, "other_load", lambda: 0.0)
    choice = threads.choose_threads(None, {"OMP_NUM_THREADS": " "})
    assert choice == threads.ThreadChoice(threads.allowed_cores(), "free cores")


def test_a_loaded_machine_leaves_one_thread_and_never_more_than_the_cores(monkeypatch):
    monkeypatch.setattr(threads, "other_load", lambda: 1000.0)
    assert threads.choose_threads(None, {}).n == 1
    monkeypatch.setattr(threads, "other_load", lambda: 0.0)
    assert 1 <= threads.choose_threads(None, {}).n <= threads.allowed_cores()


@pytest.mark.parametrize("value", ["abc", "0", "-2", "2.5"])
def test_a_bad_omp_num_threads_is_one_clear_error(value):
    with pytest.raises(ConfigError, match=f"OMP_NUM_THREADS='{value}' is not a positive integer"):
        threads.choose_threads(None, {"OMP_NUM_THREADS": value})


def test_the_load_is_the_larger_of_the_average_and_the_runnable_count(monkeypatch, tmp_path):
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("0.50 0.40 0.30 5/300 12345\n")
    monkeypatch.setattr(threads, "LOADAVG_FILE", str(loadavg))
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (0.5, 0.4, 0.3))
    assert threads.other_load() == 4.0  # five runnable, this process one of them
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (7.0, 0.4, 0.3))
    # less this process's own share of the average, which grows with the CPU time it has spent
    monkeypatch.setattr(threads.time, "process_time", lambda: 0.0)
    assert threads.other_load() == 7.0
    monkeypatch.setattr(threads.time, "process_time", lambda: 60.0)
    assert threads.other_load() == pytest.approx(7.0 - (1.0 - math.exp(-1.0)))
    monkeypatch.setattr(threads, "LOADAVG_FILE", str(tmp_path / "missing"))
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (_ for _ in ()).throw(OSError("no load average")))
    assert threads.other_load() == 0.0


def generate_json(capsys, *extra) -> dict:
    assert main(["generate", "--model", "tiny-llama", "--prompt", "hello", "--max-new-tokens", "1", "--device", "cpu",
                 "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_generate_applies_the_flag_and_the_environment(capsys, monkeypatch):
    assert generate_json(capsys, "--threads", "1")["threads"] == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert generate_json(capsys)["threads"] == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "x")
    assert main(["generate", "--model", "tiny-llama", "--prompt", "hello", "--max-new-tokens", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["dysco-interp: error: OMP_NUM_THREADS='x' is not a positive integer; set a thread count or unset it"]


def test_the_benchmark_times_a_child_and_summarises_its_phases():
    row = bench_threads.timed_child([sys.executable, "-c", "print('{\"threads\": 3, \"n_new\": 1}')"])
    assert row["threads"] == 3 and row["cpu_s"] >= 0 and row["wall_s"] > 0
    with pytest.raises(ConfigError, match="the generate run failed"):
        bench_threads.timed_child([sys.executable, "-c", "import sys; sys.exit(3)"])
    rows = [{"setting": s, "phase": ph, "cpu_s": c, "wall_s": 1.0, "threads": t}
            for s, t, ph, c in [("a", 2, "idle", 2.0), ("a", 2, "loaded", 6.0), ("b", 1, "idle", 2.0),
                                ("b", 1, "loaded", 2.5)]]
    summary = bench_threads.summarise(rows, ["a", "b"])
    assert summary["a"]["loaded_over_idle_cpu"] == 3.0 and summary["b"]["loaded_over_idle_cpu"] == 1.25
    with bench_threads.busy_load(1, 30) as procs:
        assert procs[0].poll() is None
    assert procs[0].poll() is not None  # stopped with the block


def test_a_count_is_the_users_when_it_is_neither_torchs_default_nor_the_rules():
    assert threads.user_set(current=3, default=2, applied=None)
    assert not threads.user_set(current=2, default=2, applied=None)  # torch's own: the rule applies
    assert not threads.user_set(current=1, default=2, applied=1)  # the rule set it before


def test_torchs_default_is_the_environment_else_the_physical_cores(monkeypatch, tmp_path):
    for cpu, (package, core) in enumerate([(0, 0), (0, 0), (0, 1), (0, 1)]):  # 2 cores, 2 threads each
        folder = tmp_path / f"cpu{cpu}" / "topology"
        folder.mkdir(parents=True)
        (folder / "physical_package_id").write_text(f"{package}\n")
        (folder / "core_id").write_text(f"{core}\n")
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 4)
    assert threads.physical_cores(str(tmp_path / "cpu[0-9]*" / "topology")) == 2
    assert threads.physical_cores(str(tmp_path / "missing*")) == 4
    monkeypatch.setattr(threads, "physical_cores", lambda: 2)
    assert threads.torch_default_threads({}) == 2
    assert threads.torch_default_threads({"MKL_NUM_THREADS": "3"}) == 3
    assert threads.torch_default_threads({"OMP_NUM_THREADS": "5", "MKL_NUM_THREADS": "3"}) == 5


def test_torchs_default_is_what_a_fresh_torch_picks_here():
    # the child sets nothing: its count is torch's own, which the rule must recognise
    assert threads.torch_default_threads(bench_threads.clean_env()) == bench_threads.torch_default_threads()


@pytest.fixture
def fresh_rule(monkeypatch):
    """A process where the rule has set nothing yet, on an idle machine of 2 physical cores."""
    monkeypatch.setattr(threads, "_applied", [])
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "physical_cores", lambda: 2)
    monkeypatch.setattr(threads, "free_cores", lambda allowed, machine, load: 1)


def test_load_model_applies_the_rule_to_torchs_own_count(fresh_rule):
    torch.set_num_threads(2)  # torch's default here
    assert threads.threads_for_load() == threads.ThreadChoice(1, "free cores")
    assert torch.get_num_threads() == 1
    assert threads.threads_for_load().n == 1  # its own count again: not mistaken for the user's


def test_load_model_keeps_the_users_count(fresh_rule, monkeypatch):
    from dysco_interp import load_model

    torch.set_num_threads(3)
    assert threads.threads_for_load() == threads.ThreadChoice(3, threads.TORCH_SETTING)
    load_model("tiny-llama", device="cpu", progress=False)
    assert torch.get_num_threads() == 3
    load_model("tiny-llama", device="cpu", progress=False, threads=2)  # an argument wins
    assert torch.get_num_threads() == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # so does the environment, as on the command line
    assert threads.threads_for_load() == threads.ThreadChoice(3, "OMP_NUM_THREADS")
    with pytest.raises(ConfigError, match="threads must be an integer"):
        load_model("tiny-llama", device="cpu", progress=False, threads=0)


def test_the_readme_benchmark_runs_the_block_with_and_without_a_count_of_ones_own():
    assert bench_threads.block_command("print(1)", None)[-1] == "print(1)"
    assert bench_threads.block_command("print(1)", 2)[-1] == "import torch\ntorch.set_num_threads(2)\nprint(1)"
    calls = []

    def run(threads):
        calls.append(threads)
        return {"cpu_s": 1.0, "wall_s": 1.0}

    out = bench_threads.idle_then_loaded({"torch default": 2, "rule": None}, run, repeats=1, n_busy=1, warmup_s=0,
                                         log=lambda line: None)
    assert calls == [None, 2, None, 2, None]  # a warming run, then the settings alternating in each phase
    assert [(r["phase"], r["setting"], r["threads"]) for r in out["rows"]] == [
        ("idle", "torch default", 2), ("idle", "rule", None), ("loaded", "torch default", 2), ("loaded", "rule", None)]
    assert out["summary"]["rule"]["loaded_over_idle_wall"] == 1.0 and out["torch_default_threads"] == 2
