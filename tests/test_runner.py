"""Resumable JSONL result stores."""

import json

import pytest

from dysco_interp.runner import ResultStore

KEY = ("model", "method", "index")


def rec(i, method="dysco", **extra):
    return {"model": "m", "method": method, "index": i, **extra}


def test_records_survive_and_are_skipped_after_a_restart(tmp_path):
    path = tmp_path / "r.jsonl"
    store = ResultStore(path, KEY)
    store.append(rec(0, score=0.5))
    store.append(rec(1, score=1.0))
    again = ResultStore(path, KEY)
    assert len(again) == 2 and rec(0) in again and rec(1, method="vanilla") not in again
    assert [r["score"] for r in again.records()] == [0.5, 1.0]


def test_a_line_cut_by_a_kill_is_ignored_and_appending_continues(tmp_path):
    path = tmp_path / "r.jsonl"
    ResultStore(path, KEY).append(rec(0))
    with open(path, "a") as f:
        f.write('{"model": "m", "method": "dys')  # killed mid-write
    store = ResultStore(path, KEY)
    assert len(store) == 1
    store.append(rec(1))
    assert [r["index"] for r in ResultStore(path, KEY).records()] == [0, 1]


def test_corruption_in_the_middle_is_an_error(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(rec(0)) + "\nnot json\n" + json.dumps(rec(1)) + "\n")
    with pytest.raises(ValueError, match="line 2"):
        ResultStore(path, KEY)


def test_records_need_their_key_fields_and_plain_json(tmp_path):
    store = ResultStore(tmp_path / "r.jsonl", KEY)
    with pytest.raises(KeyError, match="index"):
        store.append({"model": "m", "method": "x"})
    with pytest.raises(ValueError):
        store.append(rec(0, score=float("nan")))
