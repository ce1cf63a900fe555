"""Files that parse but are malformed, and inputs the model's spec refuses: one line, exit 2,
before the model loads wherever the files (or the model's config) allow."""

import json
from pathlib import Path

import pytest

from dysco_interp.cli.app import main
from dysco_interp.models.tiny import tiny_tokenizer
from dysco_interp.stores.store import read_store
from dysco_interp.tasks import load_dataset, make_dataset, save_dataset


@pytest.fixture(scope="module")
def record():
    """One needle-QA data record, as make-data writes it."""
    return make_dataset("needle_qa", tiny_tokenizer("llama"), 600, n=1)[0].to_dict()


@pytest.fixture(scope="module")
def made(tmp_path_factory, record):
    """A data folder and a store of one vanilla record on it (written without --keep-trace)."""
    d = tmp_path_factory.mktemp("made")
    (d / "data").mkdir()
    (d / "data" / "needle_qa_600.jsonl").write_text(json.dumps(record) + "\n")
    assert main(evaluate_argv(d / "data", d / "store.jsonl")) == 0
    return d


def evaluate_argv(data, out, *extra):
    return ["evaluate", "--model", "tiny-llama", "--task", "needle_qa", "--data", str(data), "--methods", "vanilla",
            "--out", str(out), "--max-new-tokens", "2", *extra]


def write_data(folder: Path, *records: dict, name: str = "needle_qa_600.jsonl") -> Path:
    folder.mkdir(exist_ok=True)
    (folder / name).write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def vanilla() -> dict:
    from dysco_interp.decoding.config import DecodingConfig

    return {"vanilla": DecodingConfig(method="vanilla", max_new_tokens=2)}


@pytest.fixture
def refused(capsys, error_line):
    """Runs a command that must be refused; its one line on stderr."""

    def run(argv) -> str:
        assert main([str(a) for a in argv]) == 2
        line = error_line(capsys.readouterr().err)
        assert line.startswith("dysco-interp: error: ")
        return line

    return run


# --- 1. resuming with --keep-trace ------------------------------------------------------------


def test_keep_trace_on_a_store_of_records_without_traces_is_refused_before_the_load(made, tmp_path, capsys,
                                                                                     no_weights, refused):
    store = tmp_path / "store.jsonl"
    store.write_bytes((made / "store.jsonl").read_bytes())
    before = store.read_bytes()
    line = refused(evaluate_argv(made / "data", store, "--keep-trace"))
    assert "without a trace" in line and "--keep-trace" in line
    assert store.read_bytes() == before


def test_keep_trace_with_a_new_store_writes_records_with_traces(made, tmp_path, capsys):
    store = tmp_path / "store.jsonl"
    store.write_bytes((made / "store.jsonl").read_bytes())
    argv = evaluate_argv(made / "data", store, "--keep-trace", "--if-settings-differ", "new")
    assert main([str(a) for a in argv]) == 0
    assert "store.2.jsonl" in capsys.readouterr().out
    assert all("trace" in r for r in read_store(tmp_path / "store.2.jsonl").records)


def test_the_library_refuses_to_hand_back_records_without_traces(made, tmp_path, tiny_llama):
    from dysco_interp.experiments.evaluate import evaluate
    from dysco_interp.stores.store import StoreMismatchError

    store = tmp_path / "store.jsonl"
    store.write_bytes((made / "store.jsonl").read_bytes())
    data = load_dataset(made / "data" / "needle_qa_600.jsonl")
    with pytest.raises(StoreMismatchError, match="without a trace"):
        evaluate(tiny_llama, "tiny-llama", "needle_qa", data, vanilla(), None, store, keep_trace=True,
                 progress=False)


# --- 2. files that parse but are malformed ----------------------------------------------------


def damaged_store(made: Path, tmp_path: Path, change) -> Path:
    header, line = (made / "store.jsonl").read_text().splitlines()
    rec = json.loads(line)
    change(rec)
    path = tmp_path / "store.jsonl"
    path.write_text(header + "\n" + json.dumps(rec) + "\n")
    return path


STORE_DAMAGE = {
    "record without instance": (lambda r: r.pop("instance"), "record 1 has no 'instance'"),
    "settings a string": (lambda r: r.update(settings="x"), "record 1: 'settings' must be an object, got 'x'"),
    "settings.method a string": (lambda r: r["settings"].update(method="x"),
                                 "record 1: 'settings.method' must be an object, got 'x'"),
    "length a string": (lambda r: r.update(length="600"), "record 1: 'length' must be an integer or null"),
}


@pytest.mark.parametrize("damage", STORE_DAMAGE)
@pytest.mark.parametrize("mode", ["error", "new"])
def test_a_malformed_store_record_is_one_line_before_the_load(made, tmp_path, no_weights, damage, mode, refused):
    change, words = STORE_DAMAGE[damage]
    path = damaged_store(made, tmp_path, change)
    before = path.read_bytes()
    line = refused(evaluate_argv(made / "data", path, "--if-settings-differ", mode))
    assert f"{path}: " in line and words in line
    assert path.read_bytes() == before and not (tmp_path / "store.2.jsonl").exists()


def test_the_library_refuses_a_malformed_store_record(made, tmp_path, tiny_llama):
    from dysco_interp.errors import DataError
    from dysco_interp.experiments.evaluate import evaluate

    path = damaged_store(made, tmp_path, lambda r: r.pop("instance"))
    data = load_dataset(made / "data" / "needle_qa_600.jsonl")
    with pytest.raises(DataError, match="record 1 has no 'instance'"):
        evaluate(tiny_llama, "tiny-llama", "needle_qa", data, vanilla(), None, path, progress=False)


def test_a_data_record_without_answers_is_refused_before_the_load(record, tmp_path, capsys, no_weights, refused):
    data = write_data(tmp_path / "data", {**record, "answers": []})
    line = refused(evaluate_argv(data, tmp_path / "r.jsonl"))
    assert "needle_qa_600.jsonl, line 1: not a valid needle_qa record" in line and "answers" in line


def test_a_null_query_example_is_refused_before_the_load(record, tmp_path, capsys, no_weights, refused):
    data = write_data(tmp_path / "data", {**record, "answers": [], "is_null_query": True})
    line = refused(evaluate_argv(data, tmp_path / "r.jsonl"))
    assert f"instance {record['id']!r}: a null-query example (for calibration) has no answer to score" in line


def test_spans_outside_the_prompt_are_refused_before_the_load(record, tmp_path, capsys, no_weights, refused):
    n = record["n_tokens"]
    data = write_data(tmp_path / "data", {**record, "doc_token_spans": [[0, 5], [n - 2, n + 50]]})
    line = refused(evaluate_argv(data, tmp_path / "r.jsonl", "--keep-trace"))
    assert "line 1: not a valid needle_qa record" in line
    assert f"doc_token_spans[1] ({n - 2}, {n + 50}) is outside the prompt's {n} tokens" in line
    for spans in ([[5, 2]], [[-1, 3]], [[0, "3"]], [[0, 1, 2]]):
        write_data(tmp_path / "data", {**record, "doc_token_spans": spans})
        assert "doc_token_spans[0]" in refused(evaluate_argv(data, tmp_path / "r.jsonl"))


def test_target_tokens_of_two_types_is_refused_before_the_load(record, tmp_path, capsys, no_weights, refused):
    data = write_data(tmp_path / "data", {**record, "target_tokens": "600"})
    write_data(data, {**record, "id": "other"}, name="needle_qa_601.jsonl")
    line = refused(evaluate_argv(data, tmp_path / "r.jsonl"))
    assert "needle_qa_600.jsonl, line 1" in line and "'target_tokens' must be an integer or null, got '600'" in line


@pytest.mark.parametrize("field,value", [("n_tokens", "571"), ("answers", "Paris"), ("enable_thinking", "no"),
                                         ("documents", [1]), ("index", True)])
def test_fields_of_the_wrong_type_are_refused(record, tmp_path, field, value, refused):
    from dysco_interp.errors import DataError

    path = write_data(tmp_path, {**record, field: value}) / "needle_qa_600.jsonl"
    with pytest.raises(DataError, match=f"'{field}(\\[0\\])?' must be"):
        load_dataset(path)


def test_every_generated_record_passes_its_own_checks(tmp_path):
    tokenizer = tiny_tokenizer("llama")
    for task, length in (("path_traversal", 1950), ("needle_qa", 600), ("mrcr", 1500)):
        data = make_dataset(task, tokenizer, length, n=1)
        assert load_dataset(save_dataset(tmp_path / f"{task}.jsonl", data)) == data


# --- 3. make-data never overwrites what is not its own data -----------------------------------


@pytest.mark.parametrize("kind", ["result store", "other task", "text"])
def test_make_data_refuses_to_overwrite_what_is_not_its_data(made, record, tmp_path, kind, monkeypatch, refused):
    import dysco_interp.models as models

    monkeypatch.setattr(models, "load_tokenizer", lambda *a, **k: pytest.fail("nothing is made before the check"))
    target = tmp_path / "needle_qa_600.jsonl"
    if kind == "result store":
        target.write_bytes((made / "store.jsonl").read_bytes())
    elif kind == "other task":
        pt = make_dataset("path_traversal", tiny_tokenizer("llama"), 1950, n=1)
        save_dataset(target, pt)
    else:
        target.write_text("notes\n")
    before = target.read_bytes()
    line = refused(["make-data", "needle_qa", "--model", "tiny-llama", "--lengths", "600", "--n", "1",
                    "--out", tmp_path])
    assert f"{target} exists and is not a needle_qa data file" in line
    assert target.read_bytes() == before


def test_make_data_replaces_its_own_data_file(record, tmp_path):
    target = write_data(tmp_path, {**record, "id": "old"}) / "needle_qa_600.jsonl"
    assert main(["make-data", "needle_qa", "--model", "tiny-llama", "--lengths", "600", "--n", "1",
                 "--out", str(tmp_path)]) == 0
    assert load_dataset(target)[0].id == "needle_qa-s0-0-600t"


# --- 5. what the model's spec refuses, before the load ----------------------------------------


@pytest.mark.parametrize("command", ["generate", "evaluate"])
def test_heads_out_of_range_are_refused_before_the_load(made, tmp_path, capsys, no_weights, command, refused):
    argv = (["generate", "--model", "tiny-llama", "--prompt", "hi", "--method", "dysco"] if command == "generate"
            else evaluate_argv(made / "data", tmp_path / "r.jsonl", "--methods", "vanilla,dysco"))
    line = refused([*argv, "--heads", "99-0"])
    assert "--heads 99-0: head L99H0 is out of range for tiny-llama (4 layers x 4 heads" in line


def test_a_prompt_that_overflows_the_context_is_refused_before_the_load(tmp_path, capsys, no_weights, refused):
    prompt = tmp_path / "long.txt"
    prompt.write_text("word " * 3000)
    line = refused(["generate", "--model", "tiny-llama", "--prompt-file", prompt, "--max-new-tokens", "8"])
    assert "the prompt is " in line and "tiny-llama's 2048-token context" in line and "--yarn" in line


def test_data_that_overflows_the_context_is_refused_before_the_load(tmp_path, capsys, no_weights, refused):
    data = tmp_path / "data"
    assert main(["make-data", "needle_qa", "--model", "tiny-llama", "--lengths", "1950", "--n", "1",
                 "--out", str(data)]) == 0
    n = load_dataset(data / "needle_qa_1950.jsonl")[0].n_tokens
    capsys.readouterr()
    argv = ["evaluate", "--model", "tiny-llama", "--task", "needle_qa", "--data", data, "--methods", "vanilla",
            "--out", tmp_path / "r.jsonl", "--max-new-tokens", "300"]
    line = refused(argv)
    assert f"needle_qa_1950.jsonl: instance 'needle_qa-s0-0-1950t' has a {n}-token prompt" in line
    assert "tiny-llama's 2048-token context" in line and "--max-new-tokens" in line
