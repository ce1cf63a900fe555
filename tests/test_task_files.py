"""Task data files: every unusable file is a DataError naming the file and the line; writes are atomic."""

import json
import os
import stat

import pytest

from dysco_interp.errors import ConfigError, DataError
from dysco_interp.jsonl import LineError, iter_jsonl, parse_lines, write_jsonl
from dysco_interp.models.tiny import tiny_tokenizer
from dysco_interp.tasks import load_dataset, make_dataset, save_dataset


@pytest.fixture(scope="module")
def record_line():
    inst = make_dataset("needle_qa", tiny_tokenizer("llama"), 600, n=1)[0]
    return json.dumps(inst.to_dict())


@pytest.mark.parametrize("content, message", [
    (lambda line: line + "\n" + line[: len(line) // 2],
     r"data\.jsonl, line 2: not valid JSON \(.* the record stops early, the file looks truncated\)"),
    (lambda line: line + "\n" + line[:-1] + "\n",
     r"data\.jsonl, line 2: not valid JSON \(.*; the record stops early, the file looks truncated\)"),
    (lambda line: "\n" + line + "\n{not json}\n" + line + "\n", r"data\.jsonl, line 3: not valid JSON \(Expecting"),
    (lambda line: b"\x89PNG\r\n\x1a\n\x00\x00", r"data\.jsonl, line 1: not UTF-8 text \(byte 0x89 at column 1\)"),
    (lambda line: (line + "\n").encode() + b'{"task": "needle_qa", "question": "caf\xe9"}\n',
     r"data\.jsonl, line 2: not UTF-8 text \(byte 0xe9 at column 39\)"),
    (lambda line: "[1, 2]\n", r"data\.jsonl, line 1: expected a JSON object, got list"),
    (lambda line: '{"id": 1}\n', r"data\.jsonl, line 1: the record has no 'task' field"),
    (lambda line: '{"task": "nope"}\n', r"data\.jsonl, line 1: unknown task 'nope'"),
    (lambda line: '{"task": "mrcr", "id": "x"}\n', r"data\.jsonl, line 1: not a valid mrcr record \(missing field"),
    (lambda line: line[:-1] + ', "bogus": 1}\n', r"data\.jsonl, line 1: not a valid needle_qa record \(.*bogus"),
    (lambda line: "", r"data\.jsonl holds no records; make data with `dysco-interp make-data"),
    (lambda line: "\n  \n\n", r"data\.jsonl holds no records"),
    (lambda line: "[" * 100_000 + "]" * 100_000 + "\n", r"data\.jsonl, line 1: JSON nested too deeply"),
])
def test_unusable_data_files_name_file_and_line(tmp_path, record_line, content, message):
    path = tmp_path / "data.jsonl"
    data = content(record_line)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    with pytest.raises(DataError, match=message) as err:
        load_dataset(path)
    assert "\n" not in str(err.value)
    assert isinstance(err.value, ConfigError)  # callers that catch bad input keep catching it


def test_missing_and_folder_data_files(tmp_path):
    with pytest.raises(DataError, match="data file not found: .*nothing.jsonl"):
        load_dataset(tmp_path / "nothing.jsonl")
    with pytest.raises(DataError, match="is a folder, not a JSONL data file"):
        load_dataset(tmp_path)


def test_iter_jsonl_reports_line_numbers(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"a": 1}\n\n{"b": 2}\n')
    assert list(iter_jsonl(path)) == [(1, {"a": 1}), (3, {"b": 2})]


def test_parse_lines_torn_tail_rules():
    whole = parse_lines(b'{"a": 1}\n\n{"b": 2}\n')
    assert whole.records == [(1, {"a": 1}), (3, {"b": 2})]
    assert not whole.torn_tail and not whole.unterminated
    unterminated = parse_lines(b'{"a": 1}\n{"b": 2}', torn_tail="report")
    assert unterminated.records == [(1, {"a": 1}), (2, {"b": 2})] and unterminated.unterminated
    torn = b'{"a": 1}\n{"b": '
    with pytest.raises(LineError, match="line 2: not valid JSON .*truncated") as err:
        parse_lines(torn)  # data files: strict
    assert (err.value.line, err.value.kind) == (2, "json")
    reported = parse_lines(torn, torn_tail="report")  # a log a writer may be killed in: the tail is dropped
    assert reported.records == [(1, {"a": 1})] and reported.torn_tail and not reported.unterminated
    assert parse_lines(b'{"a": 1}\n\xe2\x82', torn_tail="report").torn_tail  # cut inside a character
    with pytest.raises(LineError, match="line 1: expected a JSON object"):
        parse_lines(b'[1]\n{"a": 1}', torn_tail="report")  # only the last line may be torn
    assert parse_lines(b"") == parse_lines(b"\n \n", torn_tail="report")
    assert parse_lines(b"").records == []


def test_write_jsonl_is_atomic(tmp_path):
    path = tmp_path / "sub" / "data.jsonl"
    write_jsonl(path, [{"a": 1}])
    with pytest.raises(TypeError):
        write_jsonl(path, [{"a": 2}, {"b": object()}])  # fails after one line is written
    assert path.read_text() == '{"a": 1}\n'  # the old file, whole
    assert [p.name for p in path.parent.iterdir()] == ["data.jsonl"]  # no temporary file left
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask  # what a plain open() gives


def test_saved_data_round_trips(tmp_path, record_line):
    inst = make_dataset("needle_qa", tiny_tokenizer("llama"), 600, n=1)[0]
    path = save_dataset(tmp_path / "d.jsonl", [inst, inst])
    assert load_dataset(path) == [inst, inst]


def test_a_line_is_read_up_to_the_cap_and_refused_past_it(tmp_path, monkeypatch):
    import dysco_interp.jsonl as jsonl

    monkeypatch.setattr(jsonl, "MAX_LINE", 64)
    at_cap = '{"a": "' + "x" * (64 - 9) + '"}'
    assert len(at_cap) == 64
    path = tmp_path / "x.jsonl"
    path.write_text('{"b": 1}\n' + at_cap + "\n")
    assert [n for n, _ in iter_jsonl(path)] == [1, 2]
    path.write_text('{"b": 1}\n' + at_cap[:-1] + ' }\n{"c": 2}\n')
    with pytest.raises(DataError, match=r"x\.jsonl, line 2: longer than 0 MiB, more than any record holds"):
        list(iter_jsonl(path))
    with pytest.raises(LineError, match="line 2: longer than") as err:
        parse_lines(('{"b": 1}\n' + "x" * 65).encode(), torn_tail="report")  # never a torn tail
    assert err.value.kind == "too_long"
