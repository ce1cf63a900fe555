"""The first-error analysis: reading routes line by line, locating the token that went wrong,
its per-edge attention, and the figure and tables drawn from the stored record."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dysco_interp.analysis.route_lines import compare_route, first_error, route_lines
from dysco_interp.chat import encode_text
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet
from dysco_interp.models.tiny import tiny_model
from dysco_interp.stores.store import ResultStore
from dysco_interp.studies import first_error as analysis
from dysco_interp.studies.first_error_figures import draw
from dysco_interp.tasks import make_dataset, save_dataset
from dysco_interp.viz.render_html import opens_offline

LENGTH = 1980  # LongProc's prompt alone is ~1.9K tiny-tokenizer tokens
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", max_position_embeddings=4096)


@pytest.fixture(scope="module")
def instances(model):
    return make_dataset("path_traversal", model.tokenizer, LENGTH, n=2, seed=0)


def gold_lines(inst) -> list[str]:
    return inst.answer_nl.split("\n")


def with_line(inst, k: int, line: str, close: bool = True) -> str:
    lines = gold_lines(inst)
    lines[k] = line
    return "<Route>\n" + "\n".join(lines) + ("\n</Route>" if close else "")


def wrong_city_output(inst, k: int = 1) -> tuple[str, str]:
    """The gold route with step k's destination replaced by the question's destination."""
    step = inst.edges[inst.gold_edge_indices[k]]
    wrong = inst.edges[inst.gold_edge_indices[-1]].dst
    assert wrong != step.dst
    return with_line(inst, k, f"From {step.src}, take a {step.transit} to {wrong}."), wrong


# ---------------------------------------------------------------------------- route lines (pure)


def test_a_right_route_has_no_first_error(instances):
    inst = instances[0]
    out = inst.completion
    assert [line.text for line in route_lines(out)] == gold_lines(inst)
    assert first_error(inst, out) is None
    assert [r["verdict"] for r in compare_route(inst, out)] == ["right"] * 4
    assert all(r["edge"] == "a context edge" for r in compare_route(inst, out))


def test_a_wrong_city_is_located_by_character(instances):
    inst = instances[0]
    out, wrong = wrong_city_output(inst, 1)
    err = first_error(inst, out)
    assert err.step == 1 and err.written_city == wrong
    assert out[err.line.dst_start :].startswith(wrong + ".")
    gold = gold_lines(inst)[1]
    # the first differing character: inside the destination name
    same = next(j for j, (a, b) in enumerate(zip(err.line.text, gold)) if a != b)
    assert err.diverge_at == err.line.start + same >= err.line.dst_start
    rows = compare_route(inst, out)
    assert [r["verdict"] for r in rows] == ["right", "wrong", "right", "right"]


def test_a_wrong_transit_diverges_before_the_city(instances):
    inst = instances[0]
    step = inst.edges[inst.gold_edge_indices[0]]
    other = "ferry" if step.transit != "ferry" else "bus"
    out = with_line(inst, 0, f"From {step.src}, take a {other} to {step.dst}.", close=False)
    err = first_error(inst, out)
    assert err.step == 0 and err.written_city == step.dst
    assert out[err.diverge_at :].startswith(other[0]) and err.diverge_at < err.line.dst_start
    assert compare_route(inst, out)[0]["edge"] == "a context edge, wrong transit"


def test_routes_cut_short_or_unformatted(instances):
    inst = instances[0]
    lines = gold_lines(inst)
    cut = "<Route>\n" + lines[0] + "\n" + lines[1][:-6]  # the budget ran out inside a right line
    assert first_error(inst, cut) is None
    assert [r["verdict"] for r in compare_route(inst, cut)] == ["right", "wrong", "missing", "missing"]
    assert first_error(inst, "<Route>\n" + lines[0] + "\n</Route>") is None  # stops early: nothing wrong written
    junk = "[Route]\nManchester to Detroit by ferry"
    err = first_error(inst, junk)
    assert err.step == 0 and err.written_city is None and err.diverge_at == 0
    extra = inst.completion.replace("\n</Route>", "\nFrom A, take a bus to B.\n</Route>")
    assert compare_route(inst, extra)[-1] == {"step": 4, "gold": None, "written": "From A, take a bus to B.",
                                              "verdict": "extra", "edge": "not in the context"}


def test_generated_tokens_and_character_positions(model):
    tok = model.tokenizer
    text = "<Route>\nFrom Leeds, take a bus to London.\n"
    ids, _ = encode_text(tok, text)
    record = {"output": text}
    assert analysis.generated_ids(record, tok) == (ids, "re-encoded output")
    trace = {"steps": [{"phase": "intervention-warmup", "token": 1}]
             + [{"phase": "decode", "token": t} for t in ids[:-1]]}
    assert analysis.generated_ids({**record, "trace": trace}, tok) == (ids[:-1], "trace")
    at = text.index("London")
    k = analysis.token_at_char(ids, tok, at)
    assert len(tok.decode(ids[:k])) <= at < len(tok.decode(ids[: k + 1]))
    with pytest.raises(ConfigError):
        analysis.token_at_char(ids, tok, len(text) + 5)


# ---------------------------------------------------------------------------- the attention pass


def tiny_heads(model) -> HeadSet:
    spec = model.spec
    return HeadSet([(1, 0), (3, 2)], model=spec.name, n_layers=spec.n_layers, n_heads=spec.n_heads,
                   n_kv_heads=spec.n_kv_heads)


def test_attention_at_the_wrong_city_matches_a_full_forward(model, instances):
    inst = instances[1]
    out, wrong = wrong_city_output(inst, 1)
    vanilla = {"output": out, "first_error_step": 1}
    dysco = {"output": inst.completion}
    qr = tiny_heads(model)
    rec = analysis.analyse_instance(model, "tiny-llama", inst, vanilla, dysco, qr)
    assert rec["step"] == 1 and rec["written_city"] == wrong and rec["gold_edge"] == inst.gold_edge_indices[1]
    assert rec["followed_edges"] == [i for i, e in enumerate(inst.edges) if e.dst == wrong]
    assert rec["prefix_source"] == "re-encoded output"
    q = rec["queries"]["city"]
    gen, _ = encode_text(model.tokenizer, out)
    assert wrong.startswith(model.tokenizer.decode([gen[q["generated_index"]]]).strip()) and q["wrote"].strip()
    # the same numbers from one uncached forward over prompt + generated prefix
    prompt, _ = encode_text(model.tokenizer, inst.prompt_text)
    ids = prompt + gen[: q["generated_index"]]
    with torch.inference_mode():
        logits, acts = model.bridge.run_with_cache(torch.tensor([ids]))
    pos = len(ids) - 1
    assert q["position"] == pos
    pattern = torch.stack([acts[f"blocks.{layer}.attn.hook_pattern"][0, :, pos] for layer in range(4)])  # [L, H, keys]
    per_edge = torch.stack([pattern[..., a:b].sum(-1) for a, b in inst.edge_token_spans], -1)  # [L, H, E]
    expected_qr = torch.stack([per_edge[layer, h] for layer, h in qr]).mean(0)
    torch.testing.assert_close(torch.tensor(q["qrheads"]), expected_qr, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(torch.tensor(q["all_heads"]), per_edge.mean((0, 1)), atol=1e-5, rtol=1e-4)
    assert q["reproduced"] == (int(logits[0, -1].argmax()) == gen[q["generated_index"]])
    s = q["summary"]["qrheads"]
    gold = rec["gold_edge"]
    assert s["gold_rank"] == 1 + int((expected_qr > expected_qr[gold] + 1e-6).sum())
    # the divergence query sits at or before the city query
    assert rec["queries"]["divergence"]["position"] <= pos
    assert [r["verdict"] for r in rec["routes"]["dysco"]["lines"]] == ["right"] * 4


def analyse_and_draw(model, heads, results, out, data_dir, **options) -> list[dict]:
    """What analyses/first_error.py does after loading the model: analyse the chosen failures
    (resumably), then draw the featured one, or the one asked for."""
    length, records = analysis.analyse_failures(model, "tiny-llama", heads, str(results), out, data=str(data_dir),
                                                progress=False, **options)
    for record in records if options.get("index") is not None else analysis.featured(records):
        draw(record, out, "test")
    if options.get("every"):
        analysis.write_overview(records, out, "tiny-llama", length, "test")
    return records


@pytest.mark.slow
def test_analysis_of_stored_records_resumes_and_draws(model, instances, tmp_path, monkeypatch):
    data_dir = tmp_path / "data"
    save_dataset(data_dir / f"path_traversal_{LENGTH}.jsonl", instances)
    heads = tiny_heads(model)
    results = ResultStore(tmp_path / "eval.jsonl", settings={})
    wrong, _ = wrong_city_output(instances[1], 2)
    base = {"model": "tiny-llama", "task": "path_traversal", "length": LENGTH, "seed": 0, "config": {}}
    results.append({**base, "method": "vanilla", "index": 0, "id": instances[0].id, "output": instances[0].completion})
    results.append({**base, "method": "vanilla", "index": 1, "id": instances[1].id, "output": wrong})
    results.append({**base, "method": "dysco", "index": 1, "id": instances[1].id, "output": instances[1].completion})
    results.close()
    out = tmp_path / "out"
    eval_path = tmp_path / "eval.jsonl"
    assert len(analyse_and_draw(model, heads, eval_path, out, data_dir)) == 1  # instance 0 is right: 1 is picked
    stem = out / f"tiny-llama_{LENGTH}_1"
    rec = json.loads(stem.with_suffix(".json").read_text())
    assert rec["index"] == 1 and rec["step"] == 2
    png = stem.with_suffix(".png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    html = stem.with_suffix(".html").read_text()
    assert opens_offline(stem.with_suffix(".html")) and "Plotly.newPlot" in html
    table = "".join(line for line in Path(str(stem) + "_routes.md").read_text().splitlines() if line.startswith("|"))
    assert table.count("✓") == 4 + 3 and table.count("✗") == 1  # DySCO all right, vanilla wrong at step 3
    routes = json.loads(Path(str(stem) + "_routes.json").read_text())
    assert routes["gold"] == gold_lines(instances[1]) and set(routes) >= {"vanilla", "dysco", "question"}
    assert "<table>" in Path(str(stem) + "_routes.html").read_text()

    # a second run reuses the stored record; the script's --figures-only needs no model
    monkeypatch.setattr(analysis, "analyse_instance", lambda *a: pytest.fail("recomputed"))
    analyse_and_draw(model, heads, eval_path, out, data_dir)
    stem.with_suffix(".png").unlink()
    proc = subprocess.run([sys.executable, str(REPO / "analyses/first_error.py"), "--figures-only",
                           "--out-dir", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert stem.with_suffix(".png").exists()
    analyse_and_draw(model, heads, eval_path, out, data_dir, every=True)  # one failure, already stored
    overview = json.loads((out / f"tiny-llama_{LENGTH}_all.json").read_text())
    assert overview["n"] == 1 and overview["rows"][0]["index"] == 1 and overview["rows"][0]["step"] == 2
    assert overview["wrote_question_destination"] == 1.0
    assert overview["means"]["qrheads"]["gold_rank"] == rec["queries"]["city"]["summary"]["qrheads"]["gold_rank"]

    with pytest.raises(ConfigError, match="no wrong line"):
        analyse_and_draw(model, heads, eval_path, out, data_dir, index=0)
    with pytest.raises(ConfigError, match="--seed"):
        analysis.analyse_failures(model, "tiny-llama", heads, str(eval_path), out, seed=5, progress=False)


@pytest.mark.slow
def test_the_script_is_a_cli():
    proc = subprocess.run([sys.executable, str(REPO / "analyses/first_error.py"), "--help"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "--figures-only" in proc.stdout
    proc = subprocess.run([sys.executable, str(REPO / "analyses/first_error.py")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2 and "give --results and --model" in proc.stderr


def test_gold_rank_ties_count_against_the_gold_edge():
    summary = analysis.edge_summary([0.2, 0.5, 0.2, 0.1], 0)
    assert summary["gold_rank"] == 3 and summary["top_edge"] == 1 and not summary["gold_in_top5pct"]
    assert analysis.edge_summary([0.2, 0.5, 0.2, 0.1], 1)["gold_in_top5pct"]
