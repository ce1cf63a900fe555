"""Data-parallel evaluate and detect-heads under torchrun: two gloo processes on the CPU give the
records one process gives, a killed rank loses nothing, and bad input stops every rank in one line."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist
from filelock import FileLock

from dysco_interp import distributed
from dysco_interp.analysis.bench_data_parallel import comparable
from dysco_interp.cli import main
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet
from dysco_interp.stores.store import (
    FORMAT,
    STORE_KIND,
    ResultStore,
    StoreBusyError,
    StoreMismatchError,
    create_shard,
    read_store,
    shard_path,
    shard_paths,
)

REPO = Path(__file__).resolve().parents[1]
N_INSTANCES = 5  # odd: the two shares differ in size


def torchrun(args: list[str], cwd: Path, script: Path | None = None) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc-per-node 2 -m dysco_interp.cli -- ARGS` (or the script instead)."""
    target = [str(script)] if script is not None else ["-m", "dysco_interp.cli"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               *target, "--", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def stored(path: Path) -> list[dict]:
    """The records of the store at `path` (which must exist)."""
    contents = read_store(path)
    assert contents is not None, path
    return contents.records


def settings_of(path: Path) -> dict:
    contents = read_store(path)
    assert contents is not None and contents.header is not None, path
    return contents.header["settings"]


def by_key(records: list[dict]) -> dict[tuple, dict]:
    return {(r["method"], r["instance"]): r for r in records}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Needle-QA data for tiny-llama and a head file for DySCO."""
    root = tmp_path_factory.mktemp("dp")
    assert main(["make-data", "needle_qa", "--model", "tiny-llama", "--lengths", "500", "--n", str(N_INSTANCES),
                 "--out", str(root / "data")]) == 0
    HeadSet([(1, 0), (2, 3)], model="tiny-llama", n_layers=4, n_heads=4, n_kv_heads=2).to_json(root / "h.json")
    return root


def evaluate_args(root: Path, out: Path, *extra: str, device: str = "cpu") -> list[str]:
    return ["evaluate", "--model", "tiny-llama", "--task", "needle_qa", "--data", str(root / "data"),
            "--methods", "vanilla,dysco", "--heads", str(root / "h.json"), "--max-new-tokens", "4",
            "--out", str(out), "--threads", "1", "--device", device, *extra]


def single_process(root: Path, name: str, *extra: str) -> list[dict]:
    out = root / name
    if not out.exists():
        assert main(evaluate_args(root, out, *extra)) == 0
    return stored(out)


@pytest.mark.slow
def test_two_ranks_store_what_one_process_stores_record_for_record(setup, tmp_path, capsys):
    expected = single_process(setup, "single.jsonl")
    capsys.readouterr()
    out = tmp_path / "results.jsonl"
    run = torchrun(evaluate_args(setup, out, "--json"), tmp_path)
    assert run.returncode == 0, run.stderr
    printed = json.loads(run.stdout)  # rank 0 alone prints, and only the JSON
    assert printed["new_records"] == 2 * N_INSTANCES and printed["results"] == str(out)
    assert printed["rows"][0]["n"] == N_INSTANCES
    assert comparable(stored(out)) == comparable(expected)  # in the order one process writes them
    assert settings_of(out) == settings_of(setup / "single.jsonl")
    assert shard_paths(out) == [] and sorted(p.name for p in tmp_path.iterdir()) == [out.name, out.name + ".lock"]
    # one progress bar: rank 0's, over its 3 of the 5 instances under each of the 2 methods
    assert "rank 1 of 2" not in run.stderr
    assert "| 6/6 [" in run.stderr and "10/10" not in run.stderr


KILL_RANK_1 = """
import os
import sys

from dysco_interp.cli.app import main
from dysco_interp.stores.store import ResultStore

append = ResultStore.append


def append_then_die(self, record):
    append(self, record)
    if self.path.name.endswith(".rank1.jsonl"):
        os._exit(9)  # rank 1 is killed right after its first record


ResultStore.append = append_then_die
sys.exit(main())
"""


@pytest.mark.slow
def test_a_killed_rank_loses_nothing_and_the_rerun_does_only_the_missing_work(setup, tmp_path):
    expected = single_process(setup, "single_tf.jsonl", "--teacher-forced")
    out = tmp_path / "tf.jsonl"
    script = tmp_path / "kill_rank_1.py"
    script.write_text(KILL_RANK_1)
    killed = torchrun(evaluate_args(setup, out, "--teacher-forced"), tmp_path, script=script)
    assert killed.returncode != 0
    assert stored(out) == []  # nothing was folded in: the run never finished
    shards = shard_paths(out)
    assert shard_path(out, 1) in shards
    assert len(stored(shard_path(out, 1))) == 1
    kept = [r for shard in shards for r in stored(shard)]

    rerun = torchrun(evaluate_args(setup, out, "--teacher-forced", "--json"), tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout)["new_records"] == 2 * N_INSTANCES - len(kept)
    records = stored(out)
    lines = out.read_text().splitlines()
    assert len(lines) == 1 + 2 * N_INSTANCES == 1 + len(by_key(records))  # header + each record once
    assert by_key(comparable(records)) == by_key(comparable(expected))
    assert all(by_key(records)[key] == r for key, r in by_key(kept).items())  # kept as written, not redone
    assert shard_paths(out) == []


@pytest.mark.slow
def test_detect_heads_on_two_ranks_finds_the_heads_of_one_process(setup, tmp_path, capsys):
    args = ["detect-heads", "--model", "tiny-llama", "--n", "4", "--length", "500", "--n-heads", "4",
            "--threads", "1", "--device", "cpu", "--no-progress"]
    assert main([*args, "--resume-dir", str(tmp_path / "one"), "--out", str(tmp_path / "one.json")]) == 0
    capsys.readouterr()
    run = torchrun([*args, "--resume-dir", str(tmp_path / "two"), "--out", str(tmp_path / "two.json")], tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("rank  label") == 1  # rank 0 alone prints the table
    one, two = HeadSet.from_json(tmp_path / "one.json"), HeadSet.from_json(tmp_path / "two.json")
    assert two.heads == one.heads and two.n_examples == one.n_examples == 4
    assert two.scores == pytest.approx(one.scores, rel=1e-6, abs=1e-9)
    matrix = [v for row in two.extra["score_matrix"] for v in row]
    assert matrix == pytest.approx([v for row in one.extra["score_matrix"] for v in row], rel=1e-6, abs=1e-9)
    store_one, store_two = tmp_path / "one" / "qrscore.jsonl", tmp_path / "two" / "qrscore.jsonl"
    assert stored(store_two) == stored(store_one)  # same order too
    assert shard_paths(store_two) == []


# ---------------------------------------------------------------------------- in one process


@pytest.fixture
def rank_1_of_2(monkeypatch):
    """The environment torchrun gives rank 1 of 2 (no process group is started by bad input)."""
    for name, value in {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": "29999"}.items():
        monkeypatch.setenv(name, value)
    import dysco_interp.models as models

    def refuse(*a, **k):
        raise AssertionError("the model was loaded although the command should have stopped before")

    monkeypatch.setattr(models, "load_model", refuse)


@pytest.mark.parametrize("device, extra, says", [
    ("cpu", ["--task", "mrcr"], "no mrcr data"),
    ("cuda:1", [], "each rank runs on cuda:LOCAL_RANK"),
    ("cpu", ["--heads", "missing.json"], "missing.json"),
])
def test_bad_input_stops_each_rank_in_one_line_before_the_model_loads(setup, tmp_path, capsys, rank_1_of_2,
                                                                      device, extra, says):
    assert main(evaluate_args(setup, tmp_path / "r.jsonl", *extra, device=device)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dysco-interp: error:") and says in err and "\n" not in err, err
    assert not dist.is_initialized() and not (tmp_path / "r.jsonl").exists()


@pytest.mark.parametrize("rank", ["0", "1"])
def test_only_rank_0_probes_the_store_s_lock_before_the_model_loads(setup, tmp_path, capsys, rank_1_of_2,
                                                                    monkeypatch, rank):
    """The probe takes the lock for a moment: ranks probing at once refused each other. Rank 0
    alone writes the store, so it alone refuses a store another writer holds."""
    monkeypatch.setenv("RANK", rank)

    def stop(*args, **kwargs):
        raise ConfigError("reached the process group")

    monkeypatch.setattr(distributed, "process_group", stop)
    out = tmp_path / "r.jsonl"
    with FileLock(str(out) + ".lock"):  # another writer's lock, as a store takes it
        assert main(evaluate_args(setup, out)) == 2
    err = capsys.readouterr().err
    assert ("is being written by another writer" in err) == (rank == "0")
    assert ("reached the process group" in err) == (rank == "1")


def test_the_launch_is_read_from_torchruns_environment():
    assert distributed.torchrun_launch({}) is None
    assert distributed.torchrun_launch({"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"}) is None
    env = {"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    launch = distributed.torchrun_launch(env)
    assert launch == distributed.Launch(rank=3, local_rank=1, size=4) and launch.world.share(range(10)) == [3, 7]
    with pytest.raises(ConfigError, match="MASTER_ADDR"):
        distributed.torchrun_launch({**env, "MASTER_ADDR": ""})
    with pytest.raises(ConfigError, match="RANK"):
        distributed.torchrun_launch({"WORLD_SIZE": "2"})
    with pytest.raises(ConfigError, match="do not fit"):
        distributed.torchrun_launch({**env, "RANK": "4"})
    assert distributed.rank_device(None, "cuda:3") == "cuda:3"  # alone: as asked
    assert distributed.rank_device(launch, "cpu") == "cpu"


def test_one_process_is_a_world_of_one():
    world = distributed.current_world()
    assert world == distributed.World(0, 1) and world.is_main and world.share([1, 2, 3]) == [1, 2, 3]
    assert distributed.gather(world, {"a": 1}) == [{"a": 1}]
    assert distributed.agree(world, lambda: 5) == 5
    with pytest.raises(ConfigError, match="own error"):
        distributed.agree(world, lambda: (_ for _ in ()).throw(ConfigError("own error")))


KEY = ("k",)
SETTINGS = {"model": "m"}


def make_store(path: Path, records: list[dict], settings: dict = SETTINGS) -> None:
    with ResultStore(path, KEY, settings, purpose="test") as store:
        for r in records:
            store.append(r)


def new_shard(store: Path, rank: int, settings: dict = SETTINGS, purpose: str = "test") -> Path:
    """Rank `rank`'s shard of `store`, as a data-parallel run starts it (marked in its header)."""
    return create_shard(store, rank, {"kind": STORE_KIND, "format": FORMAT, "purpose": purpose, "settings": settings})


def test_folding_shards_appends_what_is_missing_in_order_then_deletes_them(tmp_path):
    out = tmp_path / "r.jsonl"
    make_store(out, [{"k": 1, "v": "main"}])
    make_store(new_shard(out, 0), [{"k": 4, "v": "s0"}, {"k": 1, "v": "s0"}])
    make_store(new_shard(out, 3), [{"k": 2, "v": "s3"}])
    with open(shard_path(out, 3), "a") as f:
        f.write('{"k": 9, "v"')  # cut by a kill
    assert shard_paths(out) == [shard_path(out, 0), shard_path(out, 3)]
    assert shard_paths(tmp_path / "r.2.jsonl") == []  # a sibling store has shards of its own
    with ResultStore(out, KEY, SETTINGS, purpose="test") as store:
        added = store.fold_shards(order=lambda r: r["k"])
        assert [r["k"] for r in added] == [2, 4]
    assert stored(out) == [{"k": 1, "v": "main"}, {"k": 2, "v": "s3"}, {"k": 4, "v": "s0"}]
    assert shard_paths(out) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl", "r.jsonl.lock"]


def test_a_shard_with_other_settings_or_a_writer_stops_the_fold_untouched(tmp_path):
    out = tmp_path / "r.jsonl"
    make_store(out, [])
    make_store(new_shard(out, 1, {"model": "other"}), [{"k": 1}], settings={"model": "other"})
    before = out.read_bytes()
    with ResultStore(out, KEY, SETTINGS, purpose="test") as store:
        with pytest.raises(StoreMismatchError, match="rank1"):
            store.fold_shards()
    assert out.read_bytes() == before and shard_path(out, 1).exists()
    shard_path(out, 1).unlink()
    with ResultStore(new_shard(out, 2), KEY, SETTINGS, purpose="test") as busy:
        busy.append({"k": 2})
        with ResultStore(out, KEY, SETTINGS, purpose="test") as store, pytest.raises(StoreBusyError):
            store.fold_shards()
    assert out.read_bytes() == before


def test_one_process_folds_in_what_a_killed_parallel_run_left(setup, tmp_path, capsys):
    expected = single_process(setup, "single.jsonl")
    out = tmp_path / "r.jsonl"
    settings = settings_of(setup / "single.jsonl")
    with ResultStore(new_shard(out, 1, settings, "evaluate"), ("method", "instance"), settings,
                     purpose="evaluate") as shard:
        for r in expected[3:6]:
            shard.append(r)
    capsys.readouterr()  # the reference run prints its table when this test is the first to need it
    assert main(evaluate_args(setup, out, "--json")) == 0
    assert json.loads(capsys.readouterr().out)["new_records"] == len(expected) - 3
    records = stored(out)
    assert by_key(comparable(records)) == by_key(comparable(expected)) and len(records) == len(expected)
    assert all(by_key(records)[key] == r for key, r in by_key(expected[3:6]).items())
    assert shard_paths(out) == []
