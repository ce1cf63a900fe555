"""Evaluation of decoding methods on task data: scoring, resuming, clear errors."""

import dataclasses
import json

import pytest

from dysco_interp.cli import main
from dysco_interp.decoding.config import DecodingConfig, with_flat
from dysco_interp.decoding.methods import FLAT_FIELDS
from dysco_interp.decoding.sampling import SamplingConfig
from dysco_interp.errors import ConfigError
from dysco_interp.experiments.evaluate import evaluate, instance_id
from dysco_interp.experiments.summary import format_table, summarise
from dysco_interp.heads import HeadSet
from dysco_interp.stores.store import StoreMismatchError, read_store
from dysco_interp.tasks import make_dataset


@pytest.fixture(scope="module")
def pt_data():
    from dysco_interp.models.tiny import tiny_tokenizer

    return make_dataset("path_traversal", tiny_tokenizer("llama"), 1950, n=2, seed=0, progress=False)


def methods():
    return {m: DecodingConfig(method=m, max_new_tokens=6) for m in ("vanilla", "dysco")}


def heads(model):
    s = model.spec
    return HeadSet([(1, 0), (2, 3)], model=s.name, n_layers=s.n_layers, n_heads=s.n_heads, n_kv_heads=s.n_kv_heads)


def test_records_are_scored_and_a_rerun_does_nothing(tiny_llama, pt_data, tmp_path):
    run = evaluate(tiny_llama, "tiny-llama", "path_traversal", pt_data, methods(), heads(tiny_llama),
                   tmp_path / "r.jsonl", progress=False)
    new = run.new
    assert len(new) == 4 and {r["method"] for r in new} == {"vanilla", "dysco"} and run.records == new
    for r in new:
        assert {"accuracy", "partial_accuracy", "step_accuracy", "extraction_rate", "output"} <= set(r)
        assert r["length"] == 1950 and r["n_tokens"] == pt_data[r["index"]].n_tokens
    again = evaluate(tiny_llama, "tiny-llama", "path_traversal", pt_data, methods(), heads(tiny_llama),
                     tmp_path / "r.jsonl", progress=False)
    assert again.new == [] and again.records == new
    table = format_table(summarise(again.records, ["accuracy"]), ["accuracy"])
    assert "dysco" in table and "vanilla" in table


def test_batched_sdpa_evaluation_stores_what_the_bridge_does(tiny_llama, pt_data, tmp_path):
    ref = evaluate(tiny_llama, "tiny-llama", "path_traversal", pt_data, methods(), heads(tiny_llama),
                   tmp_path / "bridge.jsonl", progress=False).new
    fast = evaluate(tiny_llama, "tiny-llama", "path_traversal", pt_data, methods(), heads(tiny_llama),
                    tmp_path / "sdpa.jsonl", progress=False, backend="sdpa", batch_size=2).new
    def by_key(records):
        return {(r["method"], r["index"]): r["output"] for r in records}
    assert by_key(fast) == by_key(ref) and len(fast) == 4
    assert {r["timings"]["batch_size"] for r in fast} == {2} and {r["backend"] for r in fast} == {"sdpa"}
    with pytest.raises(ConfigError, match="batch_size"):
        evaluate(tiny_llama, "tiny-llama", "path_traversal", pt_data, methods(), heads(tiny_llama),
                 tmp_path / "x.jsonl", progress=False, batch_size=0)


def test_a_killed_run_resumes_with_only_the_missing_items(tiny_llama, pt_data, tmp_path):
    path = tmp_path / "r.jsonl"
    evaluate(tiny_llama, "tiny-llama", "path_traversal", pt_data[:1], methods(), heads(tiny_llama), path,
             progress=False)
    with open(path, "a") as f:
        f.write('{"accuracy": 0.0, "metho')  # killed while writing the next record
    resumed = evaluate(tiny_llama, "tiny-llama", "path_traversal", pt_data, methods(), heads(tiny_llama), path,
                       progress=False)
    assert {(r["index"], r["method"]) for r in resumed.new} == {(1, "vanilla"), (1, "dysco")}
    assert len(read_store(path).records) == 4


def test_data_for_another_tokenizer_is_refused(tiny, pt_data, tmp_path):
    if tiny.spec.name == "tiny-llama":
        pytest.skip("same tokenizer")
    with pytest.raises(ConfigError, match="regenerate the data"):
        evaluate(tiny, tiny.spec.name, "path_traversal", pt_data[:1], methods(), heads(tiny), tmp_path / "r.jsonl",
                 progress=False)


def test_cli_make_data_then_evaluate(tmp_path, capsys):
    heads_file = tmp_path / "h.json"
    HeadSet([(1, 0), (2, 3)], model="tiny-llama", n_layers=4, n_heads=4, n_kv_heads=2).to_json(heads_file)
    assert main(["make-data", "path_traversal", "--model", "tiny-llama", "--lengths", "1950", "--n", "1",
                 "--out", str(tmp_path / "data")]) == 0
    out = tmp_path / "res.jsonl"
    argv = ["evaluate", "--model", "tiny-llama", "--data", str(tmp_path / "data"),
            "--methods", "vanilla,dysco,uniattns",
            "--tau", "0.8", "--heads", str(heads_file), "--out", str(out), "--max-new-tokens", "4"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "uniattns" in printed and "step_accuracy" in printed
    records = read_store(out).records
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
    from dysco_interp.decoding import loop

    real = loop.decode_batch
    calls = []

    def dies_on_the_second_method(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "decode_batch", dies_on_the_second_method)
    with pytest.raises(KeyboardInterrupt):
        evaluate(tiny_llama, "tiny-llama", "path_traversal", pt_data, methods(), heads(tiny_llama),
                 tmp_path / "r.jsonl", progress=False, backend="sdpa", batch_size=2)
    kept = read_store(tmp_path / "r.jsonl").records
    assert {(r["method"], r["index"]) for r in kept} == {("vanilla", 0), ("vanilla", 1)}


# ---------------------------------------------------------------------------- results keyed by their settings


def run_one(model, data, out, configs=None, head_set=None, **kw):
    return evaluate(model, "tiny-llama", "path_traversal", data, configs or methods(), head_set or heads(model), out,
                    progress=False, **kw)


def other_heads(model):
    s = model.spec
    return HeadSet([(1, 1), (3, 2)], model=s.name, n_layers=s.n_layers, n_heads=s.n_heads, n_kv_heads=s.n_kv_heads)


@pytest.mark.parametrize("change,field", [
    ({"beta": 3.0}, "beta"),
    ({"top_p": 0.5}, "top_p"),
    ({"max_new_tokens": 5}, "max_new_tokens"),
    ({"sampling": SamplingConfig(temperature=0.7, seed=1)}, "sampling.temperature"),
    ({"sampling": SamplingConfig(seed=10**6)}, "sampling.seed"),
])
def test_a_rerun_with_other_method_settings_is_refused_naming_the_field(tiny_llama, pt_data, tmp_path, change, field):
    out = tmp_path / "r.jsonl"
    run_one(tiny_llama, pt_data[:1], out)
    before = out.read_bytes()
    # a parameter's change given once for both methods, as the command line gives it (--beta)
    flat = {k: v for k, v in change.items() if k in FLAT_FIELDS}
    changed = {m: with_flat(c.replace(**{k: v for k, v in change.items() if k not in flat}), flat)
               for m, c in methods().items()}
    with pytest.raises(StoreMismatchError, match=field.replace(".", r"\.")) as err:
        run_one(tiny_llama, pt_data[:1], out, changed)
    assert "\n" not in str(err.value) and out.read_bytes() == before
    moved = run_one(tiny_llama, pt_data[:1], out, changed, if_differs="new")
    assert moved.path == tmp_path / "r.2.jsonl" and len(moved.new) == 2
    assert out.read_bytes() == before


def test_a_store_written_before_a_method_gained_a_parameter_resumes_at_its_default(tiny_llama, pt_data, tmp_path):
    import dysco_interp.decoding.baselines  # noqa: F401  (registers dysco-sparse)

    out = tmp_path / "r.jsonl"
    sparse = {"sparse": DecodingConfig(method="dysco-sparse", max_new_tokens=4)}
    run_one(tiny_llama, pt_data[:1], out, sparse)
    # the same records as a release before `fill_blocks` existed wrote them
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    for line in lines[1:]:
        del line["settings"]["method"]["options"]["fill_blocks"]
    out.write_text("".join(json.dumps(line) + "\n" for line in lines))
    before = out.read_bytes()
    assert run_one(tiny_llama, pt_data[:1], out, sparse).new == [] and out.read_bytes() == before
    filled = {"sparse": DecodingConfig(method="dysco-sparse", max_new_tokens=4, params={"fill_blocks": True})}
    with pytest.raises(StoreMismatchError, match=r"options\.fill_blocks false -> true"):
        run_one(tiny_llama, pt_data[:1], out, filled)


def test_other_heads_backend_or_weights_are_refused(tiny_llama, pt_data, tmp_path, monkeypatch):
    out = tmp_path / "r.jsonl"
    run_one(tiny_llama, pt_data[:1], out)
    with pytest.raises(StoreMismatchError, match="heads"):
        run_one(tiny_llama, pt_data[:1], out, head_set=other_heads(tiny_llama))
    with pytest.raises(StoreMismatchError, match="backend"):
        run_one(tiny_llama, pt_data[:1], out, backend="sdpa")
    monkeypatch.setattr(type(tiny_llama), "weights_id", property(lambda self: "other-weights"))
    with pytest.raises(StoreMismatchError, match="weights"):
        run_one(tiny_llama, pt_data[:1], out)


def test_vanilla_results_stay_valid_when_only_dysco_parameters_change(tiny_llama, pt_data, tmp_path):
    out = tmp_path / "r.jsonl"
    run_one(tiny_llama, pt_data[:1], out, {"vanilla": methods()["vanilla"]})
    changed = {"vanilla": with_flat(methods()["vanilla"], {"beta": 3.0, "top_k": 16, "tau": 0.5})}
    assert run_one(tiny_llama, pt_data[:1], out, changed).new == []


def test_a_new_method_joins_an_existing_store(tiny_llama, pt_data, tmp_path):
    out = tmp_path / "r.jsonl"
    run_one(tiny_llama, pt_data[:1], out, {"vanilla": methods()["vanilla"]})
    run = run_one(tiny_llama, pt_data[:1], out)  # vanilla is done; dysco is added
    assert [r["method"] for r in run.new] == ["dysco"] and len(run.records) == 2


def test_every_record_carries_the_settings_that_made_it(tiny_llama, pt_data, tmp_path):
    run = run_one(tiny_llama, pt_data[:1], tmp_path / "r.jsonl")
    header = read_store(run.path).header
    assert header["purpose"] == "evaluate"
    assert set(header["settings"]) == {"model", "weights", "dtype", "device", "task", "backend"}
    by_method = {r["method"]: r for r in run.records}
    for method, record in by_method.items():
        settings = record["settings"]
        assert {k: settings[k] for k in header["settings"]} == header["settings"]
        assert settings["method"]["method"] == method and settings["method"]["sampling"]["temperature"] == 0.0
        assert record["instance"] == instance_id(pt_data[0])
    assert by_method["dysco"]["settings"]["method"]["heads"] == [[1, 0], [2, 3]]
    assert by_method["vanilla"]["settings"]["method"]["heads"] is None


def test_instances_are_known_by_content_not_id(tiny_llama, pt_data, tmp_path):
    from dysco_interp.models.tiny import tiny_tokenizer

    out = tmp_path / "r.jsonl"
    run_one(tiny_llama, pt_data[:1], out)
    other_seed = make_dataset("path_traversal", tiny_tokenizer("llama"), 1950, n=1, seed=1, progress=False)
    assert other_seed[0].index == pt_data[0].index and other_seed[0].target_tokens == pt_data[0].target_tokens
    run = run_one(tiny_llama, other_seed, out)
    assert len(run.new) == 2, "data of another seed is decoded, not answered from the store"
    same_id = dataclasses.replace(other_seed[0], id=pt_data[0].id)  # e.g. two files of one length
    assert len(run_one(tiny_llama, [same_id], out).new) == 2
    assert len(run_one(tiny_llama, [same_id, *pt_data[:1]], out).new) == 0
    assert len(read_store(out).records) == 6


def test_the_task_must_match_the_data(tiny_llama, pt_data, tmp_path):
    with pytest.raises(ConfigError, match="not mrcr"):
        evaluate(tiny_llama, "tiny-llama", "mrcr", pt_data[:1], methods(), heads(tiny_llama), tmp_path / "r.jsonl",
                 progress=False)
    assert not (tmp_path / "r.jsonl").exists()




def evaluate_argv(data, out, *extra):
    return ["evaluate", "--model", "tiny-llama", "--data", str(data), "--methods", "vanilla", "--out", str(out),
            "--max-new-tokens", "4", *extra]


def test_cli_rerun_with_other_settings_stops_before_loading_the_model(data_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "r.jsonl"
    assert main(evaluate_argv(data_dir, out)) == 0
    capsys.readouterr()
    import dysco_interp.models as models

    monkeypatch.setattr(models, "load_model", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded")))
    for extra, field in ((["--max-new-tokens", "5"], "max_new_tokens"), (["--temperature", "0.5"], "temperature"),
                         (["--backend", "sdpa"], "backend"), (["--seed", "3"], "seed")):
        assert main(evaluate_argv(data_dir, out, *extra)) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("dysco-interp: error:") and field in err and "\n" not in err, err
    monkeypatch.undo()
    assert main(evaluate_argv(data_dir, out, "--max-new-tokens", "5", "--if-settings-differ", "new")) == 0
    assert "r.2.jsonl" in capsys.readouterr().out


@pytest.mark.parametrize("kind", ["folder", "data file", "head file", "text"])
def test_cli_out_that_is_no_store_is_refused_untouched(data_dir, tmp_path, capsys, no_weights, kind):
    out = {"folder": tmp_path, "data file": next(data_dir.glob("*.jsonl"))}.get(kind, tmp_path / "x.json")
    if kind == "head file":
        out.write_text('[["1-0", 0.5]]')
    elif kind == "text":
        out.write_text("line one\nline two")
    before = None if out.is_dir() else out.read_bytes()
    assert main(evaluate_argv(data_dir, out)) == 2
    err = capsys.readouterr().err
    assert "not a dysco-interp result store" in err or "folder" in err or "left untouched" in err
    assert before is None or out.read_bytes() == before


def test_cli_refuses_a_store_that_cannot_be_resumed_before_loading(data_dir, tmp_path, capsys, no_weights):
    old = tmp_path / "old.jsonl"
    old.write_text(json.dumps({"model": "tiny-llama", "task": "path_traversal", "method": "vanilla", "index": 0,
                               "config": {}}) + "\n")
    assert main(evaluate_argv(data_dir, old)) == 2
    assert "cannot be resumed" in capsys.readouterr().err


def test_cli_task_that_does_not_match_the_data(data_dir, tmp_path, capsys, no_weights):
    data = next(data_dir.glob("*.jsonl"))
    assert main(evaluate_argv(data, tmp_path / "r.jsonl", "--task", "mrcr")) == 2
    assert "not mrcr" in capsys.readouterr().err


def test_cli_evaluate_json_prints_only_json(data_dir, tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    assert main(evaluate_argv(data_dir, out, "--json")) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["results"] == str(out) and printed["new_records"] == 1
    assert printed["rows"][0]["method"] == "vanilla" and printed["rows"][0]["n"] == 1


def test_cli_teacher_forced_prints_paired_intervals_and_keeps_its_store_apart(tmp_path, capsys):
    heads_file = tmp_path / "h.json"
    HeadSet([(1, 0), (2, 3)], model="tiny-llama", n_layers=4, n_heads=4, n_kv_heads=2).to_json(heads_file)
    assert main(["make-data", "needle_qa", "--model", "tiny-llama", "--lengths", "600", "--n", "3",
                 "--out", str(tmp_path / "data")]) == 0
    out = tmp_path / "tf.jsonl"
    argv = ["evaluate", "--model", "tiny-llama", "--task", "needle_qa", "--data", str(tmp_path / "data"),
            "--methods", "vanilla,dysco", "--heads", str(heads_file), "--out", str(out), "--teacher-forced",
            "--beta", "4", "--select-k", "4"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "tf_exact" in printed and "tf_logprob" in printed and "- vanilla" in printed  # the paired CI line
    records = read_store(out).records
    assert {r["method"] for r in records} == {"vanilla", "dysco"} and len(records) == 6
    assert all(r["settings"]["teacher_forced"] and r["n_forced"] >= 1 for r in records)
    assert {r["config"]["top_k"] for r in records if r["method"] == "dysco"} == {4}
    # the same store decoded freely is refused in one line, before the model loads
    assert main([a for a in argv if a != "--teacher-forced"]) == 2
    err = capsys.readouterr().err
    assert "teacher_forced" in err and len(err.strip().splitlines()) == 1


def test_cli_float32_decoding_attention_is_recorded_and_kept_apart(data_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "r.jsonl"
    static = ["--backend", "static"]
    assert main(evaluate_argv(data_dir, out, *static, "--decode-attention", "float32")) == 0
    assert {r["settings"]["decode_attention"] for r in read_store(out).records} == {"float32"}
    capsys.readouterr()
    import dysco_interp.models as models

    monkeypatch.setattr(models, "load_model", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded")))
    # fused and float32 records never share a store: refused in one line, before the model loads
    for extra in ([], ["--decode-attention", "sdpa"]):
        assert main(evaluate_argv(data_dir, out, *static, *extra)) == 2
        err = capsys.readouterr().err.strip()
        assert "decode_attention" in err and "\n" not in err, err
    monkeypatch.undo()
    # the default is not written down, so stores made before the option existed still resume
    default = tmp_path / "default.jsonl"
    assert main(evaluate_argv(data_dir, default, *static)) == 0
    assert "decode_attention" not in read_store(default).records[0]["settings"]
    capsys.readouterr()
    assert main(evaluate_argv(data_dir, default, *static, "--decode-attention", "sdpa", "--json")) == 0
    assert json.loads(capsys.readouterr().out)["new_records"] == 0


def test_each_record_says_where_when_and_by_what_command_it_was_made(tmp_path, tiny_llama):
    from dysco_interp.decoding.config import DecodingConfig
    from dysco_interp.experiments.evaluate import evaluate
    from dysco_interp.tasks import make_dataset

    data = make_dataset("needle_qa", tiny_llama.tokenizer, 500, n=1, seed=0, progress=False)
    vanilla = {"vanilla": DecodingConfig(method="vanilla", max_new_tokens=2)}
    first = evaluate(tiny_llama, "tiny-llama", "needle_qa", data, vanilla, None, tmp_path / "r.jsonl",
                     progress=False, command="dysco-interp evaluate --limit 1")
    run = first.new[0]["run"]
    assert run["command"] == "dysco-interp evaluate --limit 1" and run["machine"].startswith("cpu (")
    assert run["started"].endswith("+00:00")
    # provenance is no setting: a later run with another command resumes the same store
    again = evaluate(tiny_llama, "tiny-llama", "needle_qa", data, vanilla, None, tmp_path / "r.jsonl",
                     progress=False, command="another")
    assert again.new == [] and again.records[0]["run"] == run
