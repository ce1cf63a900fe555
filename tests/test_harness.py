"""The steering harness end to end on a tiny model: dev grids, one choice per method, test rows
at the choices; and its driver's refusals before any model loads."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dysco_interp.errors import ConfigError
from dysco_interp.studies import harness
from dysco_interp.studies.harness_protocol import AT_DYSCO_POINT, GRIDS

REPO = Path(__file__).resolve().parents[1]


def test_the_parts_run_end_to_end_on_a_tiny_model(tmp_path):
    from dysco_interp.analysis.records import read_records
    from dysco_interp.heads import HeadSet
    from dysco_interp.models.tiny import tiny_model
    from dysco_interp.tasks import make_dataset, save_dataset

    model = tiny_model("llama", max_position_embeddings=4096)  # room for the 400 forced tokens
    data = tmp_path / "data"
    for split, seed in (("dev", 1), ("test", 0)):
        save_dataset(data / split / "path_traversal_1950.jsonl",
                     make_dataset("path_traversal", model.tokenizer, 1950, n=2, seed=seed, progress=False))
    # two grids of two points keep the CPU run short; the parts, stores and choice are what is checked
    grids = {"uniattns": ({"tau": 0.9}, {"tau": 0.8}), "dysco": ({}, {"select_k": 32}),
             "pasta": ({"profiled_heads": 2, "alpha": 0.1},)}
    s = harness.HarnessSettings("tiny-llama", data, tmp_path / "out", ("uniattns", "dysco", "pasta"),
                                tasks=("path_traversal",), lengths=("1950",), grids=grids, backend="sdpa",
                                profile_length="1950")
    lines: list[str] = []
    harness.run_harness(model, HeadSet([(1, 0), (2, 1)]), s, log=lines.append)
    # the head profile: every head scored, ranked best first; PASTA steered the best two
    profile = json.loads(s.profile_path("path_traversal").read_text())
    assert len(profile["ranking"]) == model.spec.n_layers * model.spec.n_heads and profile["rule"]
    dev = read_records(s.store("dev", "path_traversal", "1950"))
    assert len(dev) == 2 * 6  # two instances x (vanilla + two points of each method + PASTA's one)
    assert {r["params"]["heads"] for r in dev if r["method"] == "pasta alpha=0.1 profiled_heads=2"} == {
        " ".join(profile["ranking"][:2])}
    choices = json.loads(s.choice_path.read_text())["choices"]
    assert set(choices) == {"uniattns", "dysco", "pasta"}
    assert choices["uniattns"]["point"] in [{"tau": 0.9}, {"tau": 0.8}] and choices["dysco"]["rule"]
    for kind in ("tf", "free", "ff"):
        test = read_records(s.store("test", "path_traversal", "1950", kind))
        assert sorted({r["method"] for r in test}) == sorted(harness.test_methods(s, "path_traversal", 1))
        assert len(test) == 2 * 4
    # format forced: every record decoded with its answer's format forced
    assert all(r["settings"]["decoding"] == "format-forced" for r in read_records(
        s.store("test", "path_traversal", "1950", "ff")))
    assert [line.split(":")[0] for line in lines[2:5]] == ["uniattns", "dysco", "pasta"]
    # a second call finds every record stored
    again: list[str] = []
    harness.run_harness(model, HeadSet([(1, 0), (2, 1)]), s, log=again.append)
    assert all(" 0 new records" in line for line in again if "records" in line)
    # the leaderboard: every method in both modes, one BH family, a figure per mode that opens offline
    from dysco_interp.studies.harness_report import leaderboard, write_reports
    from dysco_interp.viz.render_html import opens_offline

    # a cost row for two of the methods (as bench_decode writes it): their effect against their cost
    (s.folder / "cost_tiny.json").write_text(json.dumps({"rows": [
        {"context": 64, "vanilla_step_ms": 2.0, "dysco_step_ms": 3.0, "uniattns_step_ms": 2.2}]}))
    written = write_reports(s.out_dir)
    board = leaderboard(s.folder)
    assert opens_offline(s.folder / "effect_cost_tiny-llama_tf.html")
    assert {Path(p).name for p in written} >= {"effect_cost_tiny-llama_tf.png", "effect_cost_tiny-llama_free.html"}
    assert {(r["mode"], r["method"]) for r in board["rows"]} == {(m, n) for m in ("tf", "free", "ff")
                                                                 for n in ("uniattns", "dysco", "pasta")}
    assert all(r["n"] == 2 and r["delta"]["q"] is not None for r in board["rows"])
    assert {Path(p).name for p in written} >= {"leaderboard.md", "leaderboard.json", "where_tiny-llama_tf.png",
                                               "where_tiny-llama_free.html"}
    assert opens_offline(s.folder / "where_tiny-llama_tf.html")
    assert "| tiny-llama | teacher forced | path_traversal | 1K |" in (s.folder / "leaderboard.md").read_text()
    assert board["incomplete"] == []
    # an interrupted run: a method short of one instance, and a chosen method never run, are no
    # rows (nor in the q family) but listed as incomplete
    store = s.store("test", "path_traversal", "1950", "tf")
    lines = store.read_text().splitlines(keepends=True)
    dropped = next(i for i, line in enumerate(lines) if '"method": "dysco' in line)
    store.write_text("".join(lines[:dropped] + lines[dropped + 1:]))
    choice = json.loads(s.choice_path.read_text())
    choice["choices"]["mine"] = choice["choices"]["dysco"]
    s.choice_path.write_text(json.dumps(choice))
    board = leaderboard(s.folder)
    every = {(m, n) for m in ("tf", "free", "ff") for n in ("uniattns", "dysco", "pasta")}
    assert {(r["mode"], r["method"]) for r in board["rows"]} == every - {("tf", "dysco")}
    assert sorted((r["mode"], r["method"], r["n"], r["expected"]) for r in board["incomplete"]) == [
        ("ff", "mine", 0, 2), ("free", "mine", 0, 2), ("tf", "dysco", 1, 2), ("tf", "mine", 0, 2)]
    write_reports(s.out_dir)
    short = next(r["label"] for r in board["incomplete"] if r["n"] == 1)
    assert f"| tiny-llama | teacher forced | path_traversal | 1K | {short} | 1 of 2 |" in (
        s.folder / "leaderboard.md").read_text()


def test_the_long_length_runs_the_best_methods_by_the_dev_rule(tmp_path, monkeypatch):
    from dysco_interp.analysis.records import read_records
    from dysco_interp.heads import HeadSet
    from dysco_interp.models.tiny import tiny_model
    from dysco_interp.tasks import make_dataset, save_dataset

    model = tiny_model("llama", max_position_embeddings=4096)
    data = tmp_path / "data"
    save_dataset(data / "test" / "path_traversal_1950.jsonl",
                 make_dataset("path_traversal", model.tokenizer, 1950, n=2, seed=0, progress=False))
    # the long length made short for the CPU, and two methods of three
    monkeypatch.setattr(harness, "LONG_LENGTH", "1950")
    monkeypatch.setattr(harness, "N_LONG", 2)
    s = harness.HarnessSettings("tiny-llama", data, tmp_path / "out", ("uniattns", "dysco", "logn"),
                                parts=("test-long",), tasks=("path_traversal",), backend="sdpa")
    s.folder.mkdir(parents=True)
    gains = {"uniattns": {"a": 0.1, "b": 0.0}, "dysco": {"a": 0.2, "b": 0.3}, "logn": {"a": 0.3, "b": -0.1}}
    choices = {m: {"point": {}, "label": m, "gains": g} for m, g in gains.items()}
    s.choice_path.write_text(json.dumps({"model": "tiny-llama", "choices": choices}))
    lines: list[str] = []
    harness.run_harness(model, HeadSet([(1, 0), (2, 1)]), s, log=lines.append)
    assert lines[0].startswith("at 1950: dysco, logn")  # mean ranks 1.5, 2 and 2.5: uniattns stays out
    for kind in ("tf", "free"):
        records = read_records(s.store("test", "path_traversal", "1950", kind))
        assert sorted({r["method"] for r in records}) == ["dysco", "logn", "vanilla"] and len(records) == 6
    # the leaderboard expects only those methods at the long length: none of them is missing
    from dysco_interp.studies import harness_report

    monkeypatch.setattr(harness_report, "LONG_LENGTH", "1k")  # 1950 tokens, as the report names lengths
    monkeypatch.setattr(harness_report, "N_LONG", 2)
    board = harness_report.leaderboard(s.folder)
    assert board["incomplete"] == [] and {(r["mode"], r["method"]) for r in board["rows"]} == {
        (m, n) for m in ("tf", "free") for n in ("dysco", "logn")}


def test_the_long_rule_ranks_the_methods_chosen_points_against_each_other():
    from dysco_interp.studies.harness_protocol import long_methods

    choices = {"a": {"gains": {"x": 0.2, "y": 0.2}}, "b": {"gains": {"x": 0.2, "y": 0.2}},
               "c": {"gains": {"x": 0.5, "y": 0.25}}, "d": {"gains": {"x": 0.9}}, "e": {"gains": {"x": 0.0, "y": 0.3}}}
    # ranks on x: c 1, a and b 2.5, e 4; on y: e 1, c 2, a and b 3.5. Means: c 1.5, e 2.5, a and b 3
    # (tied: a, listed first, first); d ran on one cell only and is left out
    assert long_methods(choices, 2) == ["c", "e"] and long_methods(choices, 4) == ["c", "e", "a", "b"]
    with pytest.raises(ConfigError, match="no per-cell gains"):
        long_methods({"a": {"gains": {}}})


@pytest.mark.parametrize("changes, message", [
    ({"parts": ("dev", "sweep")}, "unknown part"),
    ({"parts": ("test-tf", "test-long")}, "run 'test-long' on its own"),
    ({"methods": ("vanilla", "dysco")}, "vanilla is every cell's baseline"),
    ({"methods": ("dysco",), "grids": {**GRIDS, "dysco": ({"select_k": 0},)}}, "select_k must be"),
    ({"methods": ("dysco",), "grids": {**GRIDS, "mine": ({},)}}, "a grid for 'mine'"),
    ({"methods": ("no-such-method",)}, "unknown method"),
])
def test_bad_settings_are_one_line_before_any_model_loads(tmp_path, changes, message):
    base = {"model_name": "m", "data_dir": tmp_path, "out_dir": tmp_path, "methods": ("dysco",)}
    with pytest.raises(ConfigError, match=message):
        harness.check_settings(harness.HarnessSettings(**{**base, **changes}))


def test_the_test_parts_need_the_dev_choice(tmp_path):
    s = harness.HarnessSettings("m", tmp_path, tmp_path, ("dysco",))
    with pytest.raises(ConfigError, match="run the dev part and 'choose' first"):
        harness.test_methods(s, "path_traversal", 16)


def test_the_test_parts_need_the_committed_choice_before_any_model_loads(tmp_path):
    import dataclasses

    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "path_traversal_2k.jsonl").write_text("")
    s = harness.HarnessSettings("m", tmp_path, tmp_path / "out", ("dysco",), parts=("test-tf",),
                                tasks=("path_traversal",), lengths=("2k",))
    with pytest.raises(ConfigError, match="run the dev part and 'choose' first"):
        harness.check_data(s)
    harness.check_data(dataclasses.replace(s, parts=("choose", "test-tf")))  # chosen before the test reads it


@pytest.mark.parametrize("argv, message", [
    (["--grid", "dysco={beta: 2}"], "dysco=...: not valid JSON"),
    (["--grid", "dysco=" + "[" * 50_000 + "]" * 50_000], "nested too deeply"),
    (["--grid", 'dysco={"beta": 2}'], "--grid takes NAME=[{...}, ...]"),
    (["--grid", 'dysco=[{"select_k": 0}]'], "select_k must be"),
    ([], "make the dev split first"),
    (["--parts", "profile"], "dev/path_traversal_2k.jsonl: make the dev split first"),  # the protocol's profile length
    (["--parts", "test-long"], "test/path_traversal_127k.jsonl: make the test split first"),
    (["--parts", "test-long,test-tf"], "run 'test-long' on its own"),
    (["--methods", "dysco,nothing"], "unknown method"),
    (["--parts", "dev,sweep"], "unknown part"),
])
def test_the_driver_refuses_bad_flags_in_one_line_before_any_model_loads(tmp_path, argv, message):
    proc = subprocess.run([sys.executable, str(REPO / "analyses" / "harness.py"), "--data-dir", str(tmp_path),
                           "--out-dir", str(tmp_path / "out"), *argv], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


USER_METHOD = '''
import math
from dataclasses import dataclass

import torch

from dysco_interp import Bias, Method, MethodParams, PassPlan, register_method


@register_method
class InstructionBoost(Method):
    name = "instruction-boost"
    description = "the task's instruction texts' attention times factor, in every head of every layer"

    @dataclass(frozen=True)
    class Params(MethodParams):
        factor: float = 4.0
        instruction: tuple = ()  # the harness binds each task's instruction texts here

    def __init__(self, config, heads, spec):
        super().__init__(config, heads, spec)
        self.boosted = PassPlan(bias=Bias(range(spec.n_layers)))

    def start(self, model, batch):
        span = torch.zeros(batch.ids.shape, dtype=torch.bool)
        for row, (prepared, pad) in enumerate(zip(batch.prepared, batch.pads)):
            for text in self.params.instruction:
                at = prepared.text.find(text)
                start, end = prepared.encoded.token_span(at, at + len(text))
                span[row, pad + start:pad + end] = True
        self.span = span.to(model.device)

    def step(self, run, n_keys):
        span = torch.nn.functional.pad(self.span, (0, n_keys - self.span.shape[-1]))
        values = torch.where(span, math.log(self.params.factor), 0.0)[:, None, None, :]
        return run(self.boosted.with_bias(values)).logits, None
'''


def test_the_device_out_of_memory_mid_study_is_one_line_naming_the_batch_flag(tmp_path, monkeypatch, capsys):
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("harness_driver", REPO / "analyses" / "harness.py")
    driver = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(driver)
    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "chosen_m.json").write_text(json.dumps({"model": "m", "choices": {}}))

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                                     "79.19 GiB of which 1.06 GiB is free. Including non-PyTorch memory, ...")

    monkeypatch.setattr(driver, "load_study_model", lambda *a, **k: (None, None))
    monkeypatch.setattr(harness, "run_harness", out_of_memory)
    monkeypatch.setattr(driver, "check_data", lambda s: None)
    argv = ["--model", "m", "--data-dir", str(tmp_path), "--out-dir", str(tmp_path), "--methods", "logn",
            "--parts", "test-tf", "--tokens-per-batch", "4096"]
    assert driver.main(argv) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line == ("harness: the device ran out of memory (CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has "
                    "a total capacity of 79.19 GiB of which 1.06 GiB is free); the stores keep every finished record "
                    "and the same command resumes: lower --tokens-per-batch (now 4,096) or run fewer processes on "
                    "the device")
    monkeypatch.setattr(harness, "run_harness", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="a bug"):  # any other error keeps its traceback
        driver.main(argv)


def test_a_method_of_one_s_own_gets_its_grid_choice_and_leaderboard_rows_on_the_default_model(tmp_path, real_model):
    from dysco_interp.tasks import make_dataset, save_dataset
    from dysco_interp.tasks.needle_qa.instance import INSTRUCTION

    data = tmp_path / "data"
    for split, seed in (("dev", 1), ("test", 2)):
        save_dataset(data / split / "needle_qa_1k.jsonl",
                     make_dataset("needle_qa", real_model.tokenizer, 1024, n=2, seed=seed, progress=False))
    (tmp_path / "my_methods.py").write_text(USER_METHOD)
    out = tmp_path / "out"
    common = ["--model", "smollm2-135m", "--out-dir", str(out), "--methods-from", str(tmp_path / "my_methods.py")]
    grid = 'instruction-boost=[{"factor": 2}, {"factor": 8}]'
    proc = subprocess.run([sys.executable, str(REPO / "analyses" / "harness.py"), *common, "--data-dir", str(data),
                           "--methods", "instruction-boost", "--grid", grid,
                           "--tasks", "needle_qa", "--lengths", "1k", "--device", "cpu", "--backend", "sdpa"],
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    choice = json.loads((out / "harness" / "chosen_smollm2-135m.json").read_text())["choices"]["instruction-boost"]
    assert choice["point"] in [{"factor": 2}, {"factor": 8}] and len(choice["ranking"]) == 2
    # the harness bound the task's instruction texts: the records ran with them
    from dysco_interp.analysis.records import read_records

    dev = read_records(out / "harness" / "dev" / "smollm2-135m_needle_qa_1k.jsonl")
    boosted = [r for r in dev if r["method"] != "vanilla"]
    assert len(boosted) == 4 and all(INSTRUCTION in r["params"]["instruction"] for r in boosted)
    proc = subprocess.run([sys.executable, str(REPO / "analyses" / "harness.py"), *common, "--figures-only"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((out / "harness" / "leaderboard.json").read_text())["rows"]
    assert {(r["mode"], r["method"], r["label"]) for r in rows} == {
        (mode, "instruction-boost", f"instruction-boost factor={choice['point']['factor']}") for mode in ("tf", "free")}
    assert all(r["n"] == 2 for r in rows)


def test_dysco_s_variants_are_set_against_exact_dysco_in_a_family_of_their_own():
    from dysco_interp.analysis.method_key import method_key
    from dysco_interp.analysis.records import read_records
    from dysco_interp.stores.archives import glob_stores
    from dysco_interp.studies import harness_report

    folder = REPO / "figures" / "harness"
    result = harness_report.variants(folder)
    board = harness_report.leaderboard(folder)
    assert result["rows"] and {r["method"] for r in result["rows"]} <= set(harness_report.VARIANTS)
    assert all(r["reference"].split()[0] == "dysco" for r in result["rows"])
    # one cell by hand: the 1.5B's lagged DySCO against DySCO, teacher forced, MRCR 8K
    [path] = glob_stores(folder / "test" / "qwen2.5-coder-1.5b_mrcr_8k_tf.jsonl")
    by = {}
    for r in read_records(path):
        by.setdefault(method_key(r).method, {})[r["instance"]] = r["tf_logprob"]
    diff = [by["dysco-lagged"][i] - by["dysco"][i] for i in by["dysco"]]
    [row] = [r for r in result["rows"] if (r["model"], r["mode"], r["task"], r["length"], r["method"]) == (
        "qwen2.5-coder-1.5b", "tf", "mrcr", 8192, "dysco-lagged")]
    assert row["n"] == len(diff) == 100
    assert abs(row["delta"]["mean"] - sum(diff) / len(diff)) < 1e-4  # rounded as the report writes it
    assert (row["delta"]["better"], row["delta"]["worse"]) == (sum(d > 0 for d in diff), sum(d < 0 for d in diff))
    # its own q family: the same cell's row in the leaderboard (against vanilla) has another q
    assert len(result["rows"]) < len(board["rows"]) and result["family"] != board["family"]
    # step times from the cost benchmark, over DySCO's and over vanilla's
    assert 0 < result["speed"]["dysco-lagged"]["step_over_dysco"] < 1 < result["speed"]["dysco-lagged"][
        "step_over_vanilla"]
    assert harness_report.render_variants(result) == (folder / "variants.md").read_text()


def test_a_table_s_rows_are_counted_up_down_and_the_same_per_method_model_and_mode():
    from dysco_interp.studies import harness_report

    def row(method, mode, mean, q, eq_q=None, label=None, at="own choice"):
        return {"model": "m", "mode": mode, "method": method, "label": label or method, "reference": "dysco beta=2.0",
                "at": at, "delta": {"mean": mean, "q": q, "margin": 0.03, "eq_q": eq_q, "eq_p": eq_q}}

    rows = [row("a", "tf", +0.1, 0.01), row("a", "tf", -0.1, 0.049), row("a", "tf", -0.01, 0.5, eq_q=0.01),
            row("a", "tf", +0.2, 0.06), row("a", "free", -0.002, 0.01, eq_q=0.001), row("b", "ff", 0.0, 1.0)]
    counts = harness_report.counted(rows, lambda r: r["method"])
    assert counts == {"a": {"m tf": {"up": 1, "down": 1, "same": 1, "of": 4},
                            # significant and equivalent at once: counted by its sign
                            "m free": {"up": 0, "down": 1, "same": 0, "of": 1}},
                      "b": {"m ff": {"up": 0, "down": 0, "same": 0, "of": 1}}}
    lines = harness_report.counts_section(counts, "method")
    assert "| a | 1↑ 1↓ 1≡ / 4 | 0↑ 1↓ 0≡ / 1 |  |" in lines[-1]  # columns: tf before free before ff
    assert harness_report.variant_name(row("dysco-sparse", "tf", 0, 1, label="dysco-sparse beta=2.0 sparse_layers=all",
                                           at="DySCO's point")) == "dysco-sparse sparse_layers=all at DySCO's point"
    assert harness_report.variant_name(row("dysco-lagged", "tf", 0, 1, label="dysco-lagged beta=2.0")) == "dysco-lagged"


def test_the_variants_part_runs_dysco_s_approximations_at_dysco_s_choice(tmp_path):
    from dysco_interp.analysis.records import read_records
    from dysco_interp.heads import HeadSet
    from dysco_interp.models.tiny import tiny_model
    from dysco_interp.studies import harness_report
    from dysco_interp.tasks import make_dataset, save_dataset

    model = tiny_model("llama", max_position_embeddings=4096)
    data = tmp_path / "data"
    save_dataset(data / "test" / "needle_qa_1950.jsonl",
                 make_dataset("needle_qa", model.tokenizer, 1950, n=2, seed=2, progress=False))
    s = harness.HarnessSettings("tiny-llama", data, tmp_path / "out", ("dysco",), parts=("test-variants",),
                                tasks=("needle_qa",), lengths=("1950",), backend="sdpa")
    s.folder.mkdir(parents=True)
    s.choice_path.write_text(json.dumps({"model": "tiny-llama", "choices": {
        "dysco": {"point": {"select_k": 32}, "label": "dysco select_k=32", "gains": {}}}}))
    heads = HeadSet([(1, 0), (2, 1)])
    # the store of a run made before the protocol added points: a later run keeps it and adds theirs
    earlier = {"dysco-sparse": AT_DYSCO_POINT["dysco-sparse"][:2]}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(harness, "AT_DYSCO_POINT", earlier)
        harness.run_harness(model, heads, s, log=lambda line: None)
    first = read_records(s.store("variants", "needle_qa", "1950", "tf"))
    assert len(first) == 6
    harness.run_harness(model, heads, s, log=lambda line: None)
    records = read_records(s.store("variants", "needle_qa", "1950", "tf"))
    assert records[:6] == first
    assert sorted({r["method"] for r in records}) == [
        "dysco select_k=32", "dysco-sparse fill_blocks=True select_k=32",
        "dysco-sparse fill_blocks=True select_k=32 sparse_layers=all", "dysco-sparse select_k=32",
        "dysco-sparse select_k=32 sparse_layers=all"]
    assert len(records) == 10 and all(r["params"]["select_k"] == 32 for r in records)
    result = harness_report.variants(s.folder)
    assert sorted((r["label"], r["at"], r["n"]) for r in result["rows"]) == [
        ("dysco-sparse fill_blocks=True select_k=32", "DySCO's point", 2),
        ("dysco-sparse fill_blocks=True select_k=32 sparse_layers=all", "DySCO's point", 2),
        ("dysco-sparse select_k=32", "DySCO's point", 2),
        ("dysco-sparse select_k=32 sparse_layers=all", "DySCO's point", 2)]
    assert "DySCO's point" in harness_report.render_variants(result)
    with pytest.raises(ConfigError, match="name dysco among the methods"):
        harness.check_settings(harness.HarnessSettings("m", data, tmp_path, ("pasta",), parts=("test-variants",)))
