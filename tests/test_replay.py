"""Attention replay: the span math by hand, and the one-pass replay against an uncached forward."""

import math

import pytest
import torch

from dysco_interp.analysis.replay import (
    named_spans,
    query_positions,
    replay_attention,
    replay_path_traversal,
    route_steps,
    selected_fractions,
    selection_per_token,
    token_pieces,
)
from dysco_interp.decoding.config import DecodingConfig
from dysco_interp.decoding.loop import compare_methods, dysco_generate
from dysco_interp.decoding.results import StepRecord, Trace
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet
from dysco_interp.models.tiny import tiny_model
from dysco_interp.tasks.path_traversal import generate_instance

PROMPT = "Rome is quiet. You can travel from Paris to Berlin by train. Oslo is cold. " * 4 + "Where does the train go?"


def test_named_spans_and_query_positions():
    assert named_spans({"a": (0, 2), "b": (3, 4)}) == (["a", "b"], [(0, 2), (3, 4)])
    assert named_spans([(1, 2)]) == (["0"], [(1, 2)])
    for bad in ({}, [(2, 2)], [(-1, 3)], [(1, 2, 3)]):
        with pytest.raises(ConfigError):
            named_spans(bad)
    # token j sits at 10 + j and is produced by the row before it
    assert query_positions(10, 3) == [9, 10, 11]


def test_selected_fractions_by_hand():
    out = selected_fractions([[0, 3], [], None, [1, 2, 3, 4, 5]], [(0, 2), (2, 5)], n_keys=6)
    torch.testing.assert_close(out[[0, 1, 3]], torch.tensor([[0.5, 1 / 3], [0.0, 0.0], [0.5, 1.0]]))
    assert torch.isnan(out[2]).all()
    with pytest.raises(ValueError):
        selected_fractions([[6]], [(0, 2)], n_keys=6)


def test_route_steps_by_hand():
    pieces = ["<Route>", "\n", "From", " A", ".\n", "From", " B", ".\n", "</Route>", "x"]
    # the tag line belongs to step 0; a third step is past a 2-hop route; nothing counts after </Route>
    assert route_steps(pieces, 2) == [0, 0, 0, 0, 0, 1, 1, 1, None, None]
    # a header variant and a non-route line do not advance the step
    assert route_steps(["[Route]\n", "From a", "\n", "note\n", "From b", "\n", "c"], 3) == [0, 0, 0, 1, 1, 1, 2]


def test_selection_per_token_reads_the_producing_steps():
    steps = [
        StepRecord("context-warmup", 8, 1),
        StepRecord("intervention-warmup", 9, 2, n_selected=2, selected=[0, 1]),
        StepRecord("decode", 10, 3, n_selected=1, selected=[4]),
    ]
    trace = Trace("dysco", 10, [(0, 0)], steps)
    # 3 generated tokens: produced at positions 9, 10 and 11 (11 was never fed: last token)
    assert selection_per_token(trace, 10, 2) == [[0, 1], [4]]
    assert selection_per_token(trace, 10, 3) == [[0, 1], [4], None]
    assert selection_per_token(Trace("vanilla", 10, [], [StepRecord("decode", 10, 3)]), 10, 2) is None
    assert selection_per_token(None, 10, 2) is None
    steps[2].selected = None  # recorded without record_positions
    with pytest.raises(ConfigError, match="record_positions"):
        selection_per_token(trace, 10, 2)


def test_token_pieces_rebuild_the_text(tiny_llama):
    ids = tiny_llama.tokenizer("Paris to Berlin, by train.", add_special_tokens=False)["input_ids"]
    pieces = token_pieces(tiny_llama.tokenizer, ids)
    assert len(pieces) == len(ids)
    assert "".join(pieces) == tiny_llama.tokenizer.decode(ids)


def _heads(model, pairs):
    s = model.spec
    return HeadSet(list(pairs), model=s.name, n_layers=s.n_layers, n_heads=s.n_heads, n_kv_heads=s.n_kv_heads)


def _uncached_rows(model, ids):
    with torch.inference_mode():
        _, acts = model.bridge.run_with_cache(torch.tensor([ids]))
    return torch.stack([acts[f"blocks.{layer}.attn.hook_pattern"][0] for layer in range(model.spec.n_layers)])


def test_replay_matches_an_uncached_forward(tiny_llama):
    model = tiny_llama
    heads = _heads(model, [(1, 0), (2, 3), (3, 1)])
    config = DecodingConfig(max_new_tokens=10, params={"beta": 4.0}, record_positions=True)
    res = dysco_generate(model, PROMPT, heads, config)
    n_prompt = len(res.prompt_ids)
    spans = {"first": (5, 20), "middle": (30, 47), "end": (n_prompt - 12, n_prompt)}
    rep = replay_attention(model, res.prompt_ids, res.tokens, spans, heads, trace=res.trace)
    n_gen = len(res.tokens)
    assert rep.qr_heads.shape == rep.all_heads.shape == rep.selected.shape == (n_gen, 3)
    assert rep.names == ["first", "middle", "end"] and rep.method == "dysco"

    patterns = _uncached_rows(model, res.prompt_ids + res.tokens[:-1])  # [L, H, q, k]
    rows = patterns[:, :, rep.query_positions]  # [L, H, n_gen, k]
    expected = torch.stack([rows[..., a:b].sum(-1) for a, b in spans.values()], -1)  # [L, H, n_gen, 3]
    qr = torch.stack([expected[layer, head] for layer, head in heads]).mean(0)
    torch.testing.assert_close(rep.qr_heads, qr, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(rep.all_heads, expected.mean((0, 1)), atol=1e-5, rtol=1e-4)

    # the selection fractions are the trace's selected positions counted per span
    by_pos = {s.position: s.selected for s in res.trace.steps}
    for j, pos in enumerate(rep.query_positions):
        chosen = set(by_pos[pos])
        want = [sum(p in chosen for p in range(a, b)) / (b - a) for a, b in spans.values()]
        torch.testing.assert_close(rep.selected[j], torch.tensor(want))
    d = rep.to_dict()
    assert len(d["qr_heads"]) == n_gen and d["heads"] == [[1, 0], [2, 3], [3, 1]]
    # through read-outs (the long-context path), on any backend, the same replay
    for backend in ("sdpa", "static"):
        ours = replay_attention(model, res.prompt_ids, res.tokens, spans, heads, trace=res.trace, backend=backend)
        torch.testing.assert_close(ours.qr_heads, rep.qr_heads, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(ours.all_heads, rep.all_heads, atol=2e-5, rtol=1e-4)
        assert torch.equal(ours.selected, rep.selected)


def test_replay_validates_its_inputs(tiny_llama):
    model = tiny_llama
    heads = _heads(model, [(1, 0)])
    with pytest.raises(ConfigError, match="record_positions"):
        res = dysco_generate(model, PROMPT, heads, DecodingConfig(max_new_tokens=3))
        replay_attention(model, res.prompt_ids, res.tokens, [(0, 4)], heads, trace=res.trace)
    with pytest.raises(ConfigError, match="inside the prompt"):
        replay_attention(model, [1, 2, 3], [4], [(0, 9)], heads)
    with pytest.raises(ConfigError, match="outside"):
        replay_attention(model, [1, 2, 3], [4], [(0, 2)], [(9, 0)])
    with pytest.raises(ConfigError, match="gold"):
        replay_attention(model, [1, 2, 3], [4, 5], [(0, 2)], heads, gold=[0])
    gemma = tiny_model("gemma3")  # sliding-window layers: rows are not over absolute positions
    with pytest.raises(ConfigError, match="sliding-window"):
        replay_attention(gemma, [1, 2, 3], [4], [(0, 2)], [(0, 0)])


def test_path_traversal_replay_on_a_tiny_model():
    model = tiny_model("llama", max_position_embeddings=4096)
    inst = generate_instance(model.tokenizer, 1950, seed=1, hops=2)
    heads = _heads(model, [(1, 0), (2, 3)])
    configs = {"vanilla": DecodingConfig(method="vanilla", max_new_tokens=6),
               "dysco": DecodingConfig(max_new_tokens=6, record_positions=True)}
    out = compare_methods(model, inst.prompt, configs, heads)
    vanilla = replay_path_traversal(model, inst, out["vanilla"], heads)
    dysco = replay_path_traversal(model, inst, out["dysco"], heads)
    assert vanilla.selected is None and dysco.selected is not None
    assert dysco.qr_heads.shape == (len(out["dysco"].tokens), inst.n_edges)
    assert vanilla.names[inst.gold_edge_indices[0]] == f"{inst.edges[inst.gold_edge_indices[0]].src} → " \
        f"{inst.edges[inst.gold_edge_indices[0]].dst}"
    assert vanilla.details == inst.edge_lines
    # a random model writes no newline at once: its first token belongs to step 0
    assert vanilla.gold[0] == inst.gold_edge_indices[0]
    # attention summed over edges never exceeds a row's total
    assert (dysco.all_heads.sum(-1) <= 1 + 1e-5).all() and not math.isnan(float(dysco.selected.sum()))
