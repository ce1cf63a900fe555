"""Resumable JSONL result stores: settings headers, safe repair, one writer at a time."""

import json
import subprocess
import sys
import textwrap

import pytest

from dysco_interp.stores.store import (
    NotAStoreError,
    ResultStore,
    StoreBusyError,
    StoreCorruptError,
    StoreError,
    StoreMismatchError,
    content_hash,
    differences,
    open_store,
    read_store,
)

KEY = ("model", "method", "index")
SETTINGS = {"model": "m", "config": {"beta": 2.0, "top_p": 0.975}}


def rec(i, method="dysco", **extra):
    return {"model": "m", "method": method, "index": i, **extra}


def writer(path, settings=SETTINGS, **kw):
    return ResultStore(path, KEY, settings, **kw)


def test_records_survive_and_are_skipped_after_a_restart(tmp_path):
    path = tmp_path / "r.jsonl"
    with writer(path) as store:
        store.append(rec(0, score=0.5))
        store.append(rec(1, score=1.0))
    with writer(path) as again:
        assert len(again) == 2 and rec(0) in again and rec(1, method="vanilla") not in again
        assert [r["score"] for r in again.records()] == [0.5, 1.0]
    header = json.loads(path.read_text().splitlines()[0])
    assert header["kind"] == "dysco-interp-store" and header["settings"] == SETTINGS


def test_a_line_cut_by_a_kill_is_dropped_by_the_next_writer_only(tmp_path):
    path = tmp_path / "r.jsonl"
    with writer(path) as store:
        store.append(rec(0))
    with open(path, "a") as f:
        f.write('{"model": "m", "method": "dys')  # killed mid-write
    before = path.read_bytes()
    assert len(ResultStore(path, KEY, readonly=True)) == 1 and len(read_store(path).records) == 1
    assert path.read_bytes() == before, "a reader never modifies the store"
    with writer(path) as store:
        assert len(store) == 1
        store.append(rec(1))
    assert [r["index"] for r in ResultStore(path, KEY, readonly=True).records()] == [0, 1]


def test_a_complete_last_record_without_its_newline_is_kept(tmp_path):
    path = tmp_path / "r.jsonl"
    with writer(path) as store:
        store.append(rec(0))
    path.write_text(path.read_text() + json.dumps(rec(1)))  # valid, only the newline is missing
    with writer(path) as store:
        assert rec(1) in store
        store.append(rec(2))
    assert [r["index"] for r in read_store(path).records] == [0, 1, 2]


def test_corruption_in_the_middle_is_an_error_naming_the_line(tmp_path):
    path = tmp_path / "r.jsonl"
    with writer(path) as store:
        store.append(rec(0))
    path.write_text(path.read_text() + "not json\n" + json.dumps(rec(1)) + "\n")
    with pytest.raises(StoreCorruptError, match="line 3"):
        writer(path)


@pytest.mark.parametrize("content", [
    '[["17-3", 0.5], ["17-4", 0.25]]',  # a QRHead JSON head file, no final newline
    '{"model": "m", "heads": [[1, 2]]}',  # our own head file format, one line
    "a note\nits last line",  # text
    '{"task": "path_traversal", "id": "x", "index": 0}\n',  # a task data file
    "\xff\xfe binary",
])
def test_files_that_are_not_stores_are_refused_and_left_untouched(tmp_path, content):
    path = tmp_path / "out.jsonl"
    data = content.encode("latin-1") if content.startswith("\xff") else content.encode()
    path.write_bytes(data)
    with pytest.raises(NotAStoreError, match="not a dysco-interp result store"):
        writer(path)
    with pytest.raises(NotAStoreError):
        read_store(path)
    assert path.read_bytes() == data
    assert not (tmp_path / "out.jsonl.lock").exists() or path.read_bytes() == data


def test_a_folder_is_refused(tmp_path):
    with pytest.raises(NotAStoreError, match="folder"):
        writer(tmp_path)


def test_other_settings_are_an_error_naming_each_field(tmp_path):
    path = tmp_path / "r.jsonl"
    with writer(path) as store:
        store.append(rec(0))
    other = {"model": "m", "config": {"beta": 3.0, "top_p": 0.975, "top_k": 1024}}
    with pytest.raises(StoreMismatchError) as err:
        writer(path, other)
    message = str(err.value)
    assert "config.beta 2.0 -> 3.0" in message and "config.top_k unset -> 1024" in message
    assert "\n" not in message
    with pytest.raises(StoreMismatchError):
        ResultStore(path, KEY, other, readonly=True)
    with pytest.raises(StoreMismatchError, match="not a .detect. one"):
        ResultStore(path, KEY, SETTINGS, purpose="detect")


def test_a_new_store_is_opened_beside_one_with_other_settings_when_asked(tmp_path):
    path = tmp_path / "r.jsonl"
    with writer(path) as store:
        store.append(rec(0))
    other = {"model": "m", "config": {"beta": 3.0}}
    with pytest.raises(StoreMismatchError):
        open_store(path, KEY, other)
    with open_store(path, KEY, other, if_differs="new") as store:
        assert store.path == tmp_path / "r.2.jsonl" and len(store) == 0
        store.append(rec(0))
    with open_store(path, KEY, other, if_differs="new") as store:  # the matching sibling is resumed
        assert store.path == tmp_path / "r.2.jsonl" and len(store) == 1
    assert len(read_store(path).records) == 1


def test_a_record_level_check_can_send_a_run_to_a_new_store(tmp_path):
    path = tmp_path / "r.jsonl"
    with writer(path) as store:
        store.append(rec(0, beta=2))

    def same_beta(store):
        if any(r["beta"] != 3 for r in store.records()):
            raise StoreMismatchError("beta differs")

    with pytest.raises(StoreMismatchError):
        open_store(path, KEY, SETTINGS, check=same_beta)
    with open_store(path, KEY, SETTINGS, if_differs="new", check=same_beta) as store:
        assert store.path.name == "r.2.jsonl"


def test_one_writer_at_a_time_and_readers_never_block(tmp_path):
    path = tmp_path / "r.jsonl"
    with writer(path) as first:
        first.append(rec(0))
        with pytest.raises(StoreBusyError, match="another writer"):
            writer(path)
        assert len(ResultStore(path, KEY, readonly=True)) == 1
    with writer(path) as second:  # the lock went with the first writer
        second.append(rec(1))


def test_a_writer_in_another_process_excludes_this_one(tmp_path):
    path = tmp_path / "r.jsonl"
    script = textwrap.dedent(f"""
        import sys, time
        from dysco_interp.stores.store import ResultStore
        store = ResultStore({str(path)!r}, {KEY!r}, {SETTINGS!r})
        store.append({{"model": "m", "method": "x", "index": 0}})
        with open({str(path)!r}, "a") as f:
            f.write('{{"model": "m", "meth')  # a record being written right now
        print("ready", flush=True)
        sys.stdin.readline()
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        before = path.read_bytes()
        with pytest.raises(StoreBusyError):
            writer(path)
        assert len(ResultStore(path, KEY, readonly=True)) == 1
        assert path.read_bytes() == before, "neither a refused writer nor a reader touched the file"
    finally:
        proc.communicate("\n", timeout=60)
    with writer(path) as store:  # the first process is gone: its lock is free, its torn line dropped
        assert len(store) == 1


def test_format_1_stores_stay_readable(tmp_path):
    headed = tmp_path / "headed.jsonl"
    headed.write_text(json.dumps({"kind": "header", "analysis": "x", "package_version": "0.0.1"}) + "\n"
                      + json.dumps(rec(0)) + "\n")
    with ResultStore(headed, KEY, {"analysis": "x"}) as store:  # its header still names the settings
        store.append(rec(1))
    with pytest.raises(StoreMismatchError, match="analysis"):
        ResultStore(headed, KEY, {"analysis": "y"})
    bare = tmp_path / "bare.jsonl"
    legacy = {"model": "m", "task": "t", "method": "vanilla", "index": 0, "config": {}}
    bare.write_text(json.dumps(legacy) + "\n")
    assert read_store(bare).records == [legacy] and read_store(bare).format == 1
    with pytest.raises(StoreError, match="cannot be resumed"):
        writer(bare)
    assert bare.read_text() == json.dumps(legacy) + "\n"


def test_records_need_their_key_fields_and_plain_json(tmp_path):
    store = writer(tmp_path / "r.jsonl")
    with pytest.raises(KeyError, match="index"):
        store.append({"model": "m", "method": "x"})
    with pytest.raises(ValueError):
        store.append(rec(0, score=float("nan")))
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.append(rec(0))
    with pytest.raises(StoreError, match="read-only"):
        ResultStore(tmp_path / "r.jsonl", KEY, readonly=True).append(rec(0))


def test_hashes_and_differences_are_stable():
    assert content_hash({"a": 1, "b": [1, 2]}) == content_hash({"b": [1, 2], "a": 1})
    assert content_hash({"a": 1}) != content_hash({"a": 2})
    assert differences({"a": {"b": 1}}, {"a": {"b": 1}}) == []
    assert differences({"a": {"b": 1}}, {"a": {"b": 2}, "c": None}) == ["a.b 1 -> 2", "c unset -> null"]


@pytest.mark.parametrize("compress", ["xz", "gzip"])
def test_a_compressed_archive_reads_like_the_store_and_is_never_resumed(tmp_path, compress):
    import gzip
    import lzma

    path = tmp_path / "r.jsonl"
    with writer(path) as store:
        store.append(rec(0, score=0.5))
        store.append(rec(1, score=1.0))
    archive = tmp_path / f"r.jsonl.{'xz' if compress == 'xz' else 'gz'}"
    archive.write_bytes((lzma.compress if compress == "xz" else gzip.compress)(path.read_bytes()))
    plain, packed = read_store(path), read_store(archive)
    assert packed.records == plain.records and packed.settings == plain.settings and packed.compressed
    before = archive.read_bytes()
    with pytest.raises(StoreError, match="compressed archive of results.*cannot be resumed"):
        writer(archive)
    assert archive.read_bytes() == before
    archive.write_bytes(before[: len(before) // 2])  # cut short
    with pytest.raises(StoreCorruptError, match="does not decompress"):
        read_store(archive)
