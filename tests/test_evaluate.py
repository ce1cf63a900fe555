"""Evaluation of decoding methods on task data: scoring, resuming, clear errors."""

import json

import pytest

from dysco_interp.cli import main
from dysco_interp.decoding.config import DecodingConfig
from dysco_interp.errors import ConfigError
from dysco_interp.evaluate import evaluate, format_table, summarise
from dysco_interp.heads import HeadSet
from dysco_interp.runner import ResultStore
from dysco_interp.tasks import make_dataset


@pytest.fixture(scope="module")
def pt_data():
    from dysco_interp.tiny_models import tiny_tokenizer

    return make_dataset("path_traversal", tiny_tokenizer("llama"), 1950, n=2, seed=0, progress=False)


def methods():
    return {m: DecodingConfig(method=m, max_new_tokens=6) for m in ("vanilla", "dysco")}


def heads(model):
    s = model.spec
    return HeadSet([(1, 0), (2, 3)], model=s.name, n_layers=s.n_layers, n_heads=s.n_heads, n_kv_heads=s.n_kv_heads)


def test_records_are_scored_and_a_rerun_does_nothing(tiny_llama, pt_data, tmp_path):
    store = ResultStore(tmp_path / "r.jsonl")
    new = evaluate(tiny_llama, "tiny-llama", "path_traversal", pt_data, methods(), heads(tiny_llama), store, progress=False)
    assert len(new) == 4 and {r["method"] for r in new} == {"vanilla", "dysco"}
    for r in new:
        assert {"accuracy", "partial_accuracy", "step_accuracy", "extraction_rate", "output"} <= set(r)
        assert r["length"] == 1950 and r["n_tokens"] == pt_data[r["index"]].n_tokens
    again = evaluate(tiny_llama, "tiny-llama", "path_traversal", pt_data, methods(), heads(tiny_llama),
                     ResultStore(tmp_path / "r.jsonl"), progress=False)
    assert again == []
    table = format_table(summarise(store.records(), ["accuracy"]), ["accuracy"])
    assert "dysco" in table and "vanilla" in table


def test_batched_sdpa_evaluation_stores_what_the_bridge_does(tiny_llama, pt_data, tmp_path):
    ref = evaluate(tiny_llama, "tiny-llama", "path_traversal", pt_data, methods(), heads(tiny_llama),
                   ResultStore(tmp_path / "bridge.jsonl"), progress=False)
    fast = evaluate(tiny_llama, "tiny-llama", "path_traversal", pt_data, methods(), heads(tiny_llama),
                    ResultStore(tmp_path / "sdpa.jsonl"), progress=False, backend="sdpa", batch_size=2)
    def by_key(records):
        return {(r["method"], r["index"]): r["output"] for r in records}
    assert by_key(fast) == by_key(ref) and len(fast) == 4
    assert {r["timings"]["batch_size"] for r in fast} == {2} and {r["backend"] for r in fast} == {"sdpa"}
    with pytest.raises(ConfigError, match="batch_size"):
        evaluate(tiny_llama, "tiny-llama", "path_traversal", pt_data, methods(), heads(tiny_llama),
                 ResultStore(tmp_path / "x.jsonl"), progress=False, batch_size=0)


def test_a_killed_run_resumes_with_only_the_missing_items(tiny_llama, pt_data, tmp_path):
    path = tmp_path / "r.jsonl"
    evaluate(tiny_llama, "tiny-llama", "path_traversal", pt_data[:1], methods(), heads(tiny_llama), ResultStore(path), progress=False)
    with open(path, "a") as f:
        f.write('{"accuracy": 0.0, "metho')  # killed while writing the next record
    resumed = evaluate(tiny_llama, "tiny-llama", "path_traversal", pt_data, methods(), heads(tiny_llama), ResultStore(path), progress=False)
    assert {(r["index"], r["method"]) for r in resumed} == {(1, "vanilla"), (1, "dysco")}
    assert len(ResultStore(path).records()) == 4


def test_data_for_another_tokenizer_is_refused(tiny, pt_data, tmp_path):
    if tiny.spec.name == "tiny-llama":
        pytest.skip("same tokenizer")
    with pytest.raises(ConfigError, match="regenerate the data"):
        evaluate(tiny, tiny.spec.name, "path_traversal", pt_data[:1], methods(), heads(tiny), ResultStore(tmp_path / "r.jsonl"), progress=False)


def test_cli_make_data_then_evaluate(tmp_path, capsys):
    heads_file = tmp_path / "h.json"
    HeadSet([(1, 0), (2, 3)], model="tiny-llama", n_layers=4, n_heads=4, n_kv_heads=2).to_json(heads_file)
    assert main(["make-data", "path_traversal", "--model", "tiny-llama", "--lengths", "1950", "--n", "1",
                 "--out", str(tmp_path / "data")]) == 0
    out = tmp_path / "res.jsonl"
    argv = ["evaluate", "--model", "tiny-llama", "--data", str(tmp_path / "data"), "--methods", "vanilla,dysco,uniattns",
            "--tau", "0.8", "--heads", str(heads_file), "--out", str(out), "--max-new-tokens", "4"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "uniattns" in printed and "step_accuracy" in printed
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["method"] for r in records) == ["dysco", "uniattns", "vanilla"]
    assert [r["config"]["tau"] for r in records if r["method"] == "uniattns"] == [0.8]


def test_cli_generate_with_dysco_and_a_head_file(tmp_path, capsys):
    heads_file = tmp_path / "h.json"
    HeadSet([(1, 0), (2, 3)], model="tiny-qwen3", n_layers=4, n_heads=4, n_kv_heads=2).to_json(heads_file)
    argv = ["generate", "--model", "tiny-qwen3", "--prompt", "write a short poem about the sea", "--method", "dysco",
            "--heads", str(heads_file), "--max-new-tokens", "5", "--beta", "3"]
    assert main(argv) == 0
    assert "DySCO selected" in capsys.readouterr().out
    assert main(argv[:-2] + ["--beta", "0"]) == 2
    assert "beta" in capsys.readouterr().err
    assert main(["generate", "--model", "tiny-qwen3", "--prompt", "x", "--method", "dysco", "--heads", "shipped"]) == 2


def test_a_batch_killed_mid_way_keeps_the_methods_that_finished(tiny_llama, pt_data, tmp_path, monkeypatch):
    from dysco_interp.decoding import dysco

    real = dysco._decode_rows
    calls = []

    def dies_on_the_second_method(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(dysco, "_decode_rows", dies_on_the_second_method)
    store = ResultStore(tmp_path / "r.jsonl")
    with pytest.raises(KeyboardInterrupt):
        evaluate(tiny_llama, "tiny-llama", "path_traversal", pt_data, methods(), heads(tiny_llama), store,
                 progress=False, backend="sdpa", batch_size=2)
    kept = ResultStore(tmp_path / "r.jsonl").records()
    assert {(r["method"], r["index"]) for r in kept} == {("vanilla", 0), ("vanilla", 1)}
