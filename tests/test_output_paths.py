"""Output paths: only a regular file or a new path is ever written, a symbolic link is written
through, the writer lock is the file's own, shards are the files marked as shards, compressed
stores are read only as far as needed, and every command refuses a bad output before the model
loads."""

import gzip
import json
import os
import signal
import socket
import stat
from pathlib import Path

import pytest

from dysco_interp import distributed
from dysco_interp.atomic import atomic_open
from dysco_interp.cli.app import build_parser, main
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet
from dysco_interp.models.tiny import tiny_tokenizer
from dysco_interp.stores import format as store_format
from dysco_interp.stores.store import (
    NotAStoreError,
    ResultStore,
    StoreBusyError,
    StoreError,
    read_store,
    shard_path,
    shard_paths,
)
from dysco_interp.tasks import make_dataset, save_dataset

KEY = ("k",)
SETTINGS = {"model": "m"}
PROC = Path("/proc")  # a folder where nothing can be created, even by root (Linux)






@pytest.fixture
def no_hang():
    """Opening a FIFO blocks until a writer comes: a test that does so fails instead of hanging."""

    def stop(signum, frame):
        raise TimeoutError("blocked opening a FIFO")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(30)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def fifo(tmp_path) -> Path:
    path = tmp_path / "pipe.json"  # a name every command takes
    os.mkfifo(path)
    return path


def is_fifo(path: Path) -> bool:
    return stat.S_ISFIFO(os.lstat(path).st_mode)


@pytest.fixture
def data(tmp_path) -> Path:
    path = tmp_path / "needle_qa_600.jsonl"
    save_dataset(path, make_dataset("needle_qa", tiny_tokenizer("llama"), 600, n=1))
    return path


def evaluate_argv(data: Path, out) -> list[str]:
    return ["evaluate", "--model", "tiny-llama", "--task", "needle_qa", "--data", str(data), "--methods", "vanilla",
            "--out", str(out)]


def detect_argv(out, *extra: str) -> list[str]:
    return ["detect-heads", "--model", "tiny-llama", "--n", "2", "--length", "700", "--n-heads", "4",
            "--out", str(out), "--no-progress", *extra]


def writer(path, settings=SETTINGS) -> ResultStore:
    return ResultStore(path, KEY, settings, purpose="test")


# ---------------------------------------------------------------- 1: only regular files are written


def test_the_output_rule_refuses_everything_but_a_regular_file_or_a_new_path(tmp_path, fifo):
    from dysco_interp.outputs import OutputPathError, check_output_file

    (tmp_path / "file.json").write_text("{}")
    assert check_output_file(tmp_path / "file.json") == (tmp_path / "file.json").resolve()
    assert check_output_file(tmp_path / "new" / "h.json") == (tmp_path / "new" / "h.json").resolve()
    with pytest.raises(OutputPathError, match="is a FIFO"):
        check_output_file(fifo)
    with pytest.raises(OutputPathError, match="is a folder"):
        check_output_file(tmp_path)
    with pytest.raises(OutputPathError, match="is a character device"):
        check_output_file("/dev/null")  # only looked at: stat says what it is
    sock_path = tmp_path / "s.sock"
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(sock_path))
    except OSError:
        pytest.skip("no room for a socket path here")
    with sock, pytest.raises(OutputPathError, match="is a socket"):
        check_output_file(sock_path)
    assert issubclass(OutputPathError, ConfigError)


@pytest.mark.parametrize("command", ["evaluate", "demo", "detect-heads"])
def test_every_command_refuses_a_fifo_out_before_the_model_loads(
        command, fifo, data, no_model, no_hang, capsys, error_line):
    argv = {"evaluate": evaluate_argv(data, fifo), "demo": ["demo", "--out", str(fifo)],
            "detect-heads": detect_argv(fifo)}[command]
    assert main(argv) == 2
    line = error_line(capsys.readouterr().err)
    assert f"argument --out: {fifo} is a FIFO" in line
    assert is_fifo(fifo)


@pytest.mark.parametrize("command", ["evaluate", "demo", "detect-heads"])
def test_every_command_refuses_a_device_out_while_parsing(command, data, capsys, error_line):
    # parsing alone: nothing runs, so /dev/null is never opened whatever the outcome
    argv = {"evaluate": evaluate_argv(data, "/dev/null"), "demo": ["demo", "--out", "/dev/null"],
            "detect-heads": detect_argv("/dev/null")}[command]
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)
    assert "argument --out: /dev/null is a character device" in error_line(capsys.readouterr().err)


def test_the_writers_refuse_a_fifo_and_leave_it(fifo, no_hang):
    with pytest.raises(ConfigError, match="is a FIFO"):
        with atomic_open(fifo) as f:
            f.write("x")
    assert is_fifo(fifo)
    with pytest.raises(NotAStoreError, match="is a FIFO"):
        read_store(fifo)
    with pytest.raises(ConfigError, match="is a FIFO"):
        writer(fifo)
    assert is_fifo(fifo)


# ---------------------------------------------------------------- 2, 3: symbolic links


def test_a_second_writer_through_a_symlink_is_busy(tmp_path):
    real = tmp_path / "real.jsonl"
    link = tmp_path / "link.jsonl"
    link.symlink_to(real)
    with writer(real) as first:
        first.append({"k": 1})
        with pytest.raises(StoreBusyError, match="another writer"):
            writer(link)
    assert len(read_store(real).records) == 1


def test_atomic_open_writes_through_a_symlink_to_a_missing_file(tmp_path):
    target = tmp_path / "elsewhere" / "h.json"
    link = tmp_path / "h.json"
    link.symlink_to(target)
    with atomic_open(link) as f:
        f.write("content")
    assert link.is_symlink() and target.read_text() == "content"
    with atomic_open(link) as f:  # and through a link to an existing file
        f.write("again")
    assert link.is_symlink() and target.read_text() == "again"


def test_a_store_through_a_symlink_to_an_empty_file_writes_the_target(tmp_path):
    target = tmp_path / "empty.jsonl"
    target.write_text("")
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    with writer(link) as store:
        store.append({"k": 1})
    assert link.is_symlink()
    assert read_store(target).records == [{"k": 1}]


# ---------------------------------------------------------------- 4: detect-heads --out


@pytest.mark.parametrize("where", ["below a file", "in /proc"])
def test_detect_heads_refuses_an_unwritable_out_before_the_model_loads(where, tmp_path, no_model, capsys, error_line):
    if where == "in /proc" and not PROC.is_dir():
        pytest.skip("no /proc")
    (tmp_path / "file.txt").write_text("a file")
    out = tmp_path / "file.txt" / "h.json" if where == "below a file" else PROC / "h.json"
    assert main(detect_argv(out)) == 2
    line = error_line(capsys.readouterr().err)
    assert "argument --out: " in line
    assert "cannot be created below it" in line or f"cannot write {out}: no new file can be made in /proc" in line


def test_detect_heads_keeps_the_scores_when_the_head_file_cannot_be_written(tmp_path, monkeypatch, capsys, error_line):
    import dysco_interp.detection as detection

    sub = tmp_path / "sub"
    sub.mkdir()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    real_detect = detection.detect

    def detect_then_lose_the_folder(*args, **kwargs):
        result = real_detect(*args, **kwargs)
        sub.rmdir()
        sub.write_text("the folder became a file during the run")
        return result

    monkeypatch.setattr(detection, "detect", detect_then_lose_the_folder)
    out = sub / "h.json"
    assert main(detect_argv(out)) == 1
    line = error_line(capsys.readouterr().err)
    kept = [p for p in cwd.iterdir() if p.suffix == ".json"]
    assert len(kept) == 1
    assert f"cannot write {out}" in line and f"kept in {kept[0].resolve()}" in line
    heads = HeadSet.from_json(kept[0])
    assert len(heads) == 4 and "score_matrix" in heads.extra


# ---------------------------------------------------------------- 5: shards are marked


def test_a_store_named_like_a_shard_is_neither_folded_nor_deleted(tmp_path):
    out = tmp_path / "r.jsonl"
    with writer(out) as main_store:
        main_store.append({"k": 1})
    with writer(shard_path(out, 1)) as unrelated:
        unrelated.append({"k": 2})
    before = shard_path(out, 1).read_bytes()
    assert shard_paths(out) == []
    with writer(out) as main_store:
        assert main_store.fold_shards() == []
    assert shard_path(out, 1).read_bytes() == before
    assert read_store(out).records == [{"k": 1}]


def test_a_data_parallel_run_marks_its_shards_and_folds_them(tmp_path):
    out = tmp_path / "r.jsonl"
    with distributed.sharded_store(distributed.World(), lambda: writer(out), writer) as shard:
        shard.store.append({"k": 1})
        assert shard_paths(out) == [shard_path(out, 0)]
        header = json.loads(shard_path(out, 0).read_text().splitlines()[0])
        assert header["shard_of"] == "r.jsonl" and header["settings"] == SETTINGS
    assert read_store(out).records == [{"k": 1}] and not shard_path(out, 0).exists()


def test_a_data_parallel_run_refuses_a_file_of_its_own_at_a_shard_path(tmp_path):
    out = tmp_path / "r.jsonl"
    with writer(shard_path(out, 0)) as unrelated:
        unrelated.append({"k": 2})
    before = shard_path(out, 0).read_bytes()
    with pytest.raises(StoreError, match="is not a shard of"):
        with distributed.sharded_store(distributed.World(), lambda: writer(out), writer):
            pass
    assert shard_path(out, 0).read_bytes() == before


# ---------------------------------------------------------------- 6: checks before the load, right words


def test_a_lock_that_cannot_be_created_is_no_busy_store():
    if not PROC.is_dir():
        pytest.skip("no /proc")
    with pytest.raises(StoreError, match="cannot write /proc/x.jsonl") as caught:
        writer(PROC / "x.jsonl")
    assert not isinstance(caught.value, StoreBusyError)


@pytest.mark.parametrize("where", ["below a file", "in /proc"])
def test_evaluate_refuses_an_unwritable_out_before_the_model_loads(where, tmp_path, data, no_model, capsys, error_line):
    if where == "in /proc" and not PROC.is_dir():
        pytest.skip("no /proc")
    (tmp_path / "file.txt").write_text("a file")
    out = tmp_path / "file.txt" / "r.jsonl" if where == "below a file" else PROC / "x.jsonl"
    assert main(evaluate_argv(data, out)) == 2
    line = error_line(capsys.readouterr().err)
    assert "argument --out: " in line and "another writer" not in line


def test_detect_heads_refuses_a_resume_dir_that_is_a_file_before_the_model_loads(
        tmp_path, no_model, capsys, error_line):
    (tmp_path / "file.txt").write_text("a file")
    assert main(detect_argv(tmp_path / "h.json", "--resume-dir", str(tmp_path / "file.txt"))) == 2
    line = error_line(capsys.readouterr().err)
    assert f"argument --resume-dir: {tmp_path / 'file.txt'} is an existing file, not a folder" in line


def test_detect_heads_refuses_a_resume_dir_of_other_settings_before_the_model_loads(
        tmp_path, no_model, capsys, error_line):
    from dysco_interp.detection.methods import FILTER_SIGMAS, NDCG_K

    runs = tmp_path / "runs"
    settings = {"family": "qrscore", "model": "tiny-qwen2", "weights": "w", "dtype": "float32", "n_layers": 4,
                "n_heads": 4, "scored_heads": [[0, 0]], "params": {"ndcg_k": NDCG_K, "filter_sigmas": FILTER_SIGMAS}}
    ResultStore(runs / "qrscore.jsonl", ("example",), settings, purpose="detect").close()
    assert main(detect_argv(tmp_path / "h.json", "--resume-dir", str(runs), "--device", "cpu")) == 2
    line = error_line(capsys.readouterr().err)
    assert f"--resume-dir {runs}" in line and 'model "tiny-qwen2" -> "tiny-llama"' in line
    assert "ask for a new store" not in line and "score into another folder" in line


# ---------------------------------------------------------------- 7: compressed stores


def gzip_bomb(path: Path, first_line: bytes, zeros: int) -> None:
    chunk = b"0" * (1 << 20)
    with gzip.open(path, "wb") as f:
        f.write(first_line)
        for _ in range(zeros // len(chunk)):
            f.write(chunk)


def test_a_compressed_store_is_decompressed_up_to_a_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(store_format, "MAX_DECOMPRESSED", 1 << 20)
    header = {"kind": "dysco-interp-store", "format": 2, "purpose": "test", "settings": {}}
    bomb = tmp_path / "bomb.jsonl"
    gzip_bomb(bomb, json.dumps(header).encode() + b"\n", 8 << 20)
    assert bomb.stat().st_size < 100_000
    with pytest.raises(StoreError, match="more than 1 MiB"):
        read_store(bomb)


def test_a_compressed_file_is_refused_on_its_first_line(tmp_path):
    # no store: decided on the first line, before the rest (here cut short) is decompressed
    cut = tmp_path / "cut.jsonl"
    gzip_bomb(cut, b"just text\n", 4 << 20)
    cut.write_bytes(cut.read_bytes()[:-20])
    with pytest.raises(NotAStoreError, match="is not a dysco-interp result store"):
        read_store(cut)


def test_a_stored_record_without_its_key_fields_is_a_corrupt_store(tmp_path):
    from dysco_interp.stores.store import ResultStore, StoreCorruptError

    path = tmp_path / "s.jsonl"
    with ResultStore(path, ("index",), {"a": 1}) as store:
        store.append({"index": 0})
    with open(path, "a") as f:
        f.write('{"no_index": 1}\n')
    for readonly in (True, False):
        with pytest.raises(StoreCorruptError, match="a record lacks index"):
            ResultStore(path, ("index",), {"a": 1}, readonly=readonly)
