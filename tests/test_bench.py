"""The decode-step benchmark on a tiny model: both methods step, rows hold what the JSON reports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dysco_interp.analysis import bench, bench_decoder
from dysco_interp.decoding.config import DecodingConfig
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet
from dysco_interp.models.tiny import tiny_model

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def tiny_heads(model) -> HeadSet:
    spec = model.spec
    return HeadSet([(1, 0), (2, 1)], model=spec.name, n_layers=spec.n_layers, n_heads=spec.n_heads,
                   n_kv_heads=spec.n_kv_heads)


@pytest.mark.parametrize("method", ["dysco", "dysco-reuse"])
def test_rows_time_both_methods(model, method):
    heads = tiny_heads(model)
    config = DecodingConfig(method=method)
    rows = list(bench.bench_rows(model, heads, config, "sdpa", [48, 64], 3, 1, bench.copy_bandwidth(model.device),
                                 batch=2))
    assert [r["context"] for r in rows] == [48, 64]
    for r in rows:
        assert r["batch_size"] == 2 and r["steps"] == 3
        assert r["vanilla_step_ms"] > 0 and r["dysco_step_ms"] > 0
        assert r["ratio"] == pytest.approx(r["dysco_step_ms"] / r["vanilla_step_ms"], rel=1e-2)
        assert r["vanilla_ahead_step_ms"] > 0 and r["dysco_ahead_step_ms"] > 0
        assert r["ahead_ratio"] == pytest.approx(r["dysco_ahead_step_ms"] / r["vanilla_ahead_step_ms"], rel=1e-2)
        floor = bench.layer_floor(model, heads, method)
        assert r["ratio_over_layer_floor"] == pytest.approx(r["ratio"] / floor, rel=1e-3)
    assert bench.layer_floor(model, heads, "dysco") == 1 + 3 / model.spec.n_layers
    assert bench.layer_floor(model, heads, "dysco-reuse") == 1.0
    doc = bench.bench_result(model, "tiny", heads, "test", config, "sdpa", False, None, "cmd", rows)
    assert doc["heads"]["deepest_layer"] == 2 and doc["rows"] == rows and doc["copy_bandwidth_gb_per_s"] is None


def test_each_method_steps_on_its_own_copy_of_the_prefix(model):
    import torch

    context = torch.randint(10, 100, (1, 40))
    decoder = bench_decoder.BenchDecoder(model, tiny_heads(model), DecodingConfig(), "sdpa")
    prefix = decoder.prefill(context, reserve=4)
    assert prefix.n_keys == 40
    for queue in decoder.steps(context, prefix, 1).values():
        bench_decoder.waited(queue)(torch.tensor([5]))
    assert prefix.n_keys == 41  # DySCO steps on the prefix itself, vanilla on a clone


def test_methods_sharing_dysco_s_context_fit_all_of_its_growth(model):
    from dysco_interp.decoding.config import preset

    # each of the six steps every selecting method takes 3 times on the one context: 18 keys, more
    # than the 4 new tokens each config is made for; a method that sizes its masks by its own
    # steps alone would find the context longer than its masks
    config = DecodingConfig(max_new_tokens=4)
    also = [preset("paper", method=m, max_new_tokens=4) for m in ("dysco-hard", "dysco-lagged", "dysco-middle",
                                                                   "dysco-sparse", "uniattns")]
    extra = bench_decoder.extra_steps(config, model, False, 0, methods=also)
    [row] = bench.bench_rows(model, tiny_heads(model), config, "sdpa", [48], 2, 0, None, extra=extra)
    assert all(row[f"{name}_step_ms"] > 0 and row[f"{name}_ahead_step_ms"] > 0 for name in extra)


def test_a_profiled_run_fits_the_profiled_steps_too(model, tmp_path):
    from dysco_interp.decoding.config import preset

    config = DecodingConfig(max_new_tokens=4)
    also = [preset("paper", method=m, max_new_tokens=4) for m in ("dysco-lagged", "dysco-sparse", "dysco-hard")]
    extra = bench_decoder.extra_steps(config, model, False, 0, methods=also)
    [row] = bench.bench_rows(model, tiny_heads(model), config, "sdpa", [48], 2, 0, None, extra=extra,
                             profile_dir=str(tmp_path))
    assert all(row[f"{name}_step_ms"] > 0 for name in extra)
    assert {p.name for p in tmp_path.iterdir()} == {f"48_{m}.txt" for m in ("vanilla", "dysco", *extra)}


def test_any_registered_method_is_timed_beside_dysco_in_the_same_run(model):
    from dysco_interp.decoding.config import preset

    also = [preset("paper", method="uniattns", params={"tau": 0.9}), preset("paper", method="dysco-lagged"),
            preset("paper", method="logn", params={"train_length": 16})]
    extra = bench_decoder.extra_steps(DecodingConfig(), model, False, 0, methods=also)
    assert list(extra) == ["uniattns", "dysco-lagged", "logn"]
    [row] = bench.bench_rows(model, tiny_heads(model), DecodingConfig(), "sdpa", [48], 2, 1, None, extra=extra)
    for name in extra:  # methods with and without relevance step on DySCO's context
        assert row[f"{name}_step_ms"] > 0 and row[f"{name}_over_dysco"] > 0


def test_one_method_at_two_settings_is_timed_under_two_labels(model):
    from dysco_interp.decoding.config import preset

    two = [preset("paper", method="dysco-sparse"), preset("paper", method="dysco-sparse",
                                                          params={"sparse_layers": "all"})]
    with pytest.raises(ConfigError, match="dysco-sparse is timed twice under one name"):
        bench_decoder.extra_steps(DecodingConfig(), model, False, 0, methods=two)
    with pytest.raises(ConfigError, match="one of the benchmark's own steps"):
        bench_decoder.extra_steps(DecodingConfig(), model, False, 0, methods={"dysco": two[1]})
    extra = bench_decoder.extra_steps(DecodingConfig(), model, False, 0,
                                      methods=dict(zip(("dysco-sparse", "all"), two)))
    assert list(extra) == ["dysco-sparse", "all"] and extra["all"][0].params.sparse_layers == "all"
    [row] = bench.bench_rows(model, tiny_heads(model), DecodingConfig(), "static", [48], 2, 0, None, extra=extra)
    assert row["dysco-sparse_step_ms"] > 0 and row["all_step_ms"] > 0


def test_the_driver_refuses_a_step_named_twice_before_any_model_loads(capsys):
    sys.path.insert(0, str(REPO / "analyses"))
    try:
        import bench_decode
    finally:
        sys.path.pop(0)
    with pytest.raises(SystemExit) as caught:
        bench_decode.main(["--also", "dysco-sparse", "--also", 'dysco-sparse={"sparse_layers": "all"}',
                           "--model", "no-such-model"])
    assert caught.value.code == 2 and "names the step dysco-sparse twice" in capsys.readouterr().err
    # a label that names one of the benchmark's own steps would replace its timings
    for also in ("vanilla", 'dysco-lagged:dysco={"beta": 2.0}', "dysco-sparse:user", "dysco-lagged:dysco_read4"):
        with pytest.raises(SystemExit) as caught:
            bench_decode.main(["--also", also, "--model", "no-such-model"])
        err = capsys.readouterr().err
        assert caught.value.code == 2 and "one of the benchmark's own steps" in err and "Traceback" not in err


def test_methods_that_find_spans_in_the_text_are_timed_on_a_task_s_instance(model):
    from dysco_interp.decoding.config import preset
    from dysco_interp.studies.harness_protocol import bind

    points = {"instaboost": {}, "pasta": {"heads": "L1H0 L2H1"}, "qr-pasta": {"heads": "L1H0"}, "pos-calibration": {}}
    also = [preset("paper", method=m, params=bind(m, p, "needle_qa").params) for m, p in points.items()]
    extra = bench_decoder.extra_steps(DecodingConfig(), model, False, 0, methods=also)
    [row] = bench.bench_rows(model, tiny_heads(model), DecodingConfig(), "sdpa", [800], 2, 1, None, extra=extra,
                             task="needle_qa")
    assert row["task_context"] == "needle_qa" and abs(row["context"] - 800) <= 80  # the instance's own length
    for name in extra:
        assert row[f"{name}_step_ms"] > 0
    with pytest.raises(Exception, match="token ids"):  # on random ids, a text method is refused, not run on nothing
        extra = bench_decoder.extra_steps(DecodingConfig(), model, False, 0, methods=also[:1])
        bench.bench_rows(model, tiny_heads(model), DecodingConfig(), "sdpa", [48], 2, 1, None, extra=extra).__next__()


@pytest.mark.slow
def test_the_scripts_are_clis():
    for name in ("bench_decode", "bench_prefill", "bench_matvec"):
        proc = subprocess.run([sys.executable, str(REPO / "analyses" / f"{name}.py"), "--help"],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0 and "--out" in proc.stdout, proc.stderr[-2000:]


def test_list_and_yarn_flags_are_refused_in_one_line_while_parsing():
    import argparse

    from dysco_interp.cli import args as cli_args

    assert cli_args.positive_ints("32768, 65536") == [32768, 65536]
    for text in ("1,x", "0", "4,-2", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="integer >= 1"):
            cli_args.positive_ints(text)
    assert cli_args.yarn_factor("4") == 4.0
    with pytest.raises(argparse.ArgumentTypeError, match="> 1"):
        cli_args.yarn_factor("1")


def test_also_takes_a_name_or_a_name_and_a_json_object_in_one_line():
    import argparse

    sys.path.insert(0, str(REPO / "analyses"))
    try:
        import bench_decode
    finally:
        sys.path.pop(0)
    assert bench_decode.also_method("dysco-lagged") == ("dysco-lagged", "dysco-lagged", {})
    assert bench_decode.also_method('uniattns={"tau": 0.9}') == ("uniattns", "uniattns", {"tau": 0.9})
    assert bench_decode.also_method('dysco-sparse:all={"sparse_layers": "all"}') == (
        "all", "dysco-sparse", {"sparse_layers": "all"})
    assert bench_decode.also_method("dysco-lagged:lag") == ("lag", "dysco-lagged", {})
    for text, words in (("uniattns={tau: 1}", "not valid JSON"), ("uniattns=[1]", "must be a JSON object"),
                        ("dysco-sparse:=" + "{}", "give a label"), ("dysco-sparse: ", "give a label"),
                        ("uniattns=" + "[" * 100_000 + "]" * 100_000, "nested too deeply")):
        with pytest.raises(argparse.ArgumentTypeError, match=words):
            bench_decode.also_method(text)


def test_the_peer_decodes_the_benchmark_context_and_its_speed_divides_ours(model):
    import torch

    from dysco_interp.analysis import bench_peer

    n, steps, warmup = 40, 3, 1
    ids = bench.bench_ids(model, n, steps, warmup, batch=1)
    row, logits = bench_peer.peer_row(model, ids, n, steps, warmup, compile=False, chunk_size=16)
    assert row["context"] == n and row["peer_step_ms"] > 0 and row["compiled"] is False
    # the peer's last step saw the context and every token fed after it: a full forward's last logits
    with torch.inference_mode():
        full = model.prefill_model(input_ids=ids[:, : n + steps + warmup]).logits[:, -1].float()
    torch.testing.assert_close(logits, full, atol=1e-4, rtol=1e-4)
    heads = tiny_heads(model)
    ours = list(bench.bench_rows(model, heads, DecodingConfig(), "sdpa", [n], steps, warmup, None))
    doc = bench.bench_result(model, "tiny", heads, "test", DecodingConfig(), "sdpa", False, None, "cmd", ours,
                             peer={"method": bench_peer.PEER, "rows": [row]})
    assert doc["peer"]["rows"] == [row]
    assert doc["rows"][0]["vanilla_over_peer"] == pytest.approx(
        doc["rows"][0]["vanilla_tok_per_s"] / row["peer_tok_per_s"], rel=1e-2)


def test_another_backend_is_timed_step_by_step_in_the_same_run(model):
    from dysco_interp.decoding.config import preset

    extra = bench_decoder.extra_steps(DecodingConfig(), model, False, 0, methods=[preset("paper", method="dysco-hard")])
    [row] = bench.bench_rows(model, tiny_heads(model), DecodingConfig(), "sdpa", [48], 2, 1, None, extra=extra,
                             versus="flex")
    for name in ("dysco-hard", "flex_vanilla", "flex_dysco", "flex_dysco-hard"):
        assert row[f"{name}_step_ms"] > 0 and row[f"{name}_over_dysco"] > 0, name


def test_the_floor_divides_by_the_card_s_fixed_bandwidth_not_the_run_s_probe(monkeypatch):
    import torch

    monkeypatch.setattr(bench.torch.cuda, "get_device_name", lambda d: "NVIDIA H200")
    gpus = [torch.device("cuda", 0), torch.device("cuda", 1)]
    assert bench.floor_bandwidth(gpus, 3.9e12) == (4136e9, bench.FIXED_FLOOR)  # the probe moves; the floor not
    monkeypatch.setattr(bench.torch.cuda, "get_device_name", lambda d: "a card we never measured")
    assert bench.floor_bandwidth(gpus, 3.9e12) == (3.9e12, bench.PROBED_FLOOR)
    assert bench.floor_bandwidth([torch.device("cpu")], None) == (None, None)
