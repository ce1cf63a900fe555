"""Stores edited by hand, and stores a table cannot show in full: what the scripts that read stores
make of them. A value no run writes is refused in one line naming the file, the method and the
record (exit 2); a null score is left out of its mean and counted apart; what a table leaves out
is named in a note; a store of one's own methods is read with --methods-from."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dysco_interp.cli.user_methods import METHODS_FROM_HELP
from dysco_interp.decoding import methods

TABLES = ("pt_table", "preset_table", "ablation_table", "robustness")


def record(method: str, index: int, task: str = "path_traversal", value: float = 0.5, forced: bool = False,
           **fields) -> dict:
    """An evaluation record as evaluate writes it, scored freely or (`forced`) under teacher forcing."""
    config = {"method": method, "max_new_tokens": 8, "schedule": "reference", "template_masking": "reference",
              **fields.pop("config", {})}
    scores = ({"tf_step_accuracy": value, "tf_city_logprob": -value} if forced else
              {"accuracy": value, "step_accuracy": value, "partial_accuracy": value})
    return {"model": "m", "task": task, "length": 1024, "method": method, "seed": 0, "index": index,
            "id": f"{task}-{index}", "output": "", "finished": True, "config": config, **scores, **fields}


def write_store(path: Path, records: list[dict], task: str = "path_traversal") -> Path:
    header = {"kind": "dysco-interp-store", "format": 2, "purpose": "results",
              "settings": {"model": "m", "task": task, "dtype": "float32", "device": "cpu"}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in [header, *records]))
    return path


def store_of(tmp_path: Path, *edits: tuple[int, dict]) -> Path:
    """vanilla and DySCO on three instances, record N (1-based) updated by each (N, fields)."""
    records = [record(m, i) for m in ("vanilla", "dysco") for i in range(3)]
    for number, fields in edits:
        records[number - 1].update(fields)
    return write_store(tmp_path / "store.jsonl", records)


def table_argv(name: str, store: Path, out: Path) -> list:
    tau = ["--tau-stores", store] if name == "pt_table" else []
    return ["--stores", store, *tau, "--out", out]


def refusal(script_main, error_line, name: str, store: Path, tmp_path: Path) -> str:
    code, _, err = script_main(name, *table_argv(name, store, tmp_path / "out" / "t"))
    assert code == 2, err
    line = error_line(err)
    assert str(store) in line, line
    assert not (tmp_path / "out").exists(), "a refused table wrote something"
    return line


@pytest.mark.parametrize("name", TABLES)
def test_a_length_that_is_no_integer_is_one_line_naming_the_record(name, tmp_path, script_main, error_line):
    line = refusal(script_main, error_line, name, store_of(tmp_path, (5, {"length": "1k"})), tmp_path)
    assert "record 5 (dysco, instance path_traversal-1)" in line and "'length' must be an integer" in line
    assert "'1k'" in line


@pytest.mark.parametrize("name", ["pt_table", "preset_table"])
def test_an_all_nan_metric_is_one_line_naming_the_file(name, tmp_path, script_main, error_line):
    nan = {"accuracy": math.nan, "tf_step_accuracy": math.nan}
    line = refusal(script_main, error_line, name, store_of(tmp_path, *((n, nan) for n in range(1, 7))), tmp_path)
    assert "record 1 (vanilla, instance path_traversal-0)" in line and "is nan" in line.lower()


@pytest.mark.parametrize("field,value,words", [
    ("accuracy", 5.0, "'accuracy' is 5.0; a accuracy is in [0, 1]"),
    ("step_accuracy", -0.25, "'step_accuracy' is -0.25"),
    ("partial_accuracy", True, "'partial_accuracy' must be a number or null, got True"),
    ("accuracy", "0.5", "'accuracy' must be a number or null, got '0.5'"),
    ("tf_city_logprob", 0.5, "'tf_city_logprob' is 0.5; a tf_city_logprob is at most 0"),
    ("tf_step_accuracy", math.inf, "'tf_step_accuracy' is inf"),
])
@pytest.mark.parametrize("name", TABLES)
def test_a_score_no_run_writes_is_refused(name, field, value, words, tmp_path, script_main, error_line):
    line = refusal(script_main, error_line, name, store_of(tmp_path, (2, {field: value})), tmp_path)
    assert "record 2 (vanilla, instance path_traversal-1)" in line and words in line


@pytest.mark.parametrize("name", TABLES)
def test_a_record_of_another_task_than_its_header_is_refused(name, tmp_path, script_main, error_line):
    line = refusal(script_main, error_line, name, store_of(tmp_path, (4, {"task": "mrcr", "score": 0.5})), tmp_path)
    assert "record 4 (dysco, instance path_traversal-0)" in line
    assert "task 'mrcr', but the store's header is for 'path_traversal'" in line


def test_a_null_score_is_left_out_of_its_mean_and_counted_apart(tmp_path, script_main):
    store = store_of(tmp_path, (1, {"accuracy": None}), (2, {"accuracy": 0.0}), (3, {"accuracy": 1.0}))
    code, _, err = script_main("pt_table", *table_argv("pt_table", store, tmp_path / "t"))
    assert code == 0, err
    vanilla = json.loads((tmp_path / "t.json").read_text())["rows"][0]
    assert vanilla["method"] == "vanilla" and vanilla["n"] == 3
    accuracy = vanilla["metrics"]["accuracy"]
    assert (accuracy["mean"], accuracy["n"], accuracy["null"]) == (0.5, 2, 1)
    assert "null" not in vanilla["metrics"]["step_accuracy"] and vanilla["metrics"]["step_accuracy"]["n"] == 3
    assert "(n=2; 1 null)" in (tmp_path / "t.md").read_text()


def test_pt_table_says_what_it_cannot_show(tmp_path, script_main):
    forced = [record(m, i, forced=True) for m in ("vanilla", "dysco") for i in range(2)]
    gated = [record("dysco-gated", i, config={"options": {"min_mass": 0.5}}) for i in range(3)]
    free = [record(m, i) for m in ("vanilla", "dysco") for i in range(3)]
    write_store(tmp_path / "tf" / "s.jsonl", forced)
    write_store(tmp_path / "free" / "s.jsonl", free + gated)
    code, _, err = script_main("pt_table", *table_argv("pt_table", tmp_path / "tf" / "s.jsonl", tmp_path / "t"))
    assert code == 0, err
    notes = json.loads((tmp_path / "t.json").read_text())["notes"]
    assert any("4 of the 4 records are teacher-forced" in n and "preset_table.py" in n for n in notes), notes
    code, _, err = script_main("pt_table", *table_argv("pt_table", tmp_path / "free" / "s.jsonl", tmp_path / "t"))
    assert code == 0, err
    notes = json.loads((tmp_path / "t.json").read_text())["notes"]
    assert any("m 1024: 3 dysco-gated (min_mass=0.5) records left out" in n for n in notes), notes
    assert not any("teacher-forced" in n for n in notes)


def test_step_classes_on_a_store_without_records_says_so(tmp_path, capsys, error_line):
    from dysco_interp.cli.app import main

    empty = write_store(tmp_path / "empty.jsonl", [])
    assert main(["step-classes", str(empty), str(empty)]) == 2
    line = error_line(capsys.readouterr().err)
    assert f"{empty} holds no records" in line and "(it holds )" not in line


@pytest.mark.parametrize("name", ["failure_trace", "first_error"])
def test_the_trace_scripts_end_a_refusal_in_one_line(name, tmp_path, script_main, error_line, no_model):
    notes = tmp_path / "notes.jsonl"
    notes.write_text("notes of mine, not a store\n")
    if name == "failure_trace":
        data = tmp_path / "path_traversal_1k.jsonl"
        data.write_text(json.dumps({"task": "path_traversal"}) + "\n")
        argv = ["--results", notes, "--data", data, "--model", "tiny-llama", "--out", tmp_path / "t.json"]
    else:
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / "first_error.jsonl").write_text("notes of mine, not a store\n")
        argv = ["--figures-only", "--out-dir", tmp_path / "out"]
    code, _, err = script_main(name, *argv)
    assert code == 2, err
    line = error_line(err)
    assert line.startswith(f"{name}: ") and ("not a dysco-interp result store" in line or "not a valid" in line)


# ---------------------------------------------------------------- --methods-from

USER_METHOD = '''
from dysco_interp import SteeringMethod, register_method


class HandMine(SteeringMethod):
    name = "hand-mine"
    description = "a method of one's own, read back by the tables"
    step_shape = "bias-only"
    fields = frozenset({"schedule"})
    options = {"alpha": 0.01}


register_method(HandMine)
'''


@pytest.fixture
def user_store(tmp_path):
    """A store of vanilla and a method of one's own (teacher-forced scores), and the file that registers it."""
    (tmp_path / "mine.py").write_text(USER_METHOD)
    records = [record(m, i, forced=True, config={"options": {"alpha": 0.05}} if m != "vanilla" else {})
               for m in ("vanilla", "hand-mine") for i in range(3)]
    yield write_store(tmp_path / "store.jsonl", records), tmp_path / "mine.py"
    methods.REGISTRY.pop("hand-mine", None)
    methods.METHODS.pop("hand-mine", None)


def test_a_table_reads_a_users_method_with_methods_from(user_store, tmp_path, script_main, error_line):
    store, mine = user_store
    code, _, err = script_main("preset_table", "--stores", store, "--out", tmp_path / "t")
    assert code == 2 and "--methods-from FILE.py" in error_line(err)
    code, _, err = script_main("preset_table", "--stores", store, "--methods-from", mine, "--out", tmp_path / "t")
    assert code == 0, err
    rows = json.loads((tmp_path / "t.json").read_text())["rows"]
    assert [r["method"] for r in rows] == ["vanilla", "hand-mine (alpha=0.05)"]
    code, _, err = script_main("preset_table", "--stores", store, "--methods-from", tmp_path / "none.py",
                               "--out", tmp_path / "t")
    assert code == 2 and "argument --methods-from: " in error_line(err) and "none.py: no such file" in err


# every script that reads result stores; each takes --methods-from, with the one help text
STORE_READERS = ("pt_table", "preset_table", "ablation_table", "robustness", "overhead", "failure_trace",
                 "first_error", "step_account", "paper_regime", "budget_study", "run_all")


@pytest.mark.parametrize("name", STORE_READERS)
def test_every_script_that_reads_stores_takes_methods_from(name, script_main):
    code, out, _ = script_main(name, "--help")
    assert code == 0
    flat = " ".join(out.split())
    assert "--methods-from FILE.py" in flat and " ".join(METHODS_FROM_HELP.split()) in flat
    assert "runs as Python code" in METHODS_FROM_HELP
