"""Per-edge attention under teacher forcing, and the metrics built on it."""

import pytest
import torch

from dysco_interp.analysis.edge_attention import EdgeAttention, teacher_forced_edge_attention
from dysco_interp.decoding.readout import span_sums
from dysco_interp.models.tiny import tiny_model
from dysco_interp.ranking import in_top_fraction
from dysco_interp.tasks import make_dataset
from dysco_interp.tasks.path_traversal import teacher_forced_inputs


def test_span_sums_by_hand():
    rows = torch.tensor([[0.1, 0.2, 0.3, 0.4], [1.0, 0.0, 0.0, 2.0]])
    out = span_sums(rows, [(0, 2), (1, 4), (3, 4)])
    torch.testing.assert_close(out, torch.tensor([[0.3, 0.9, 0.4], [1.0, 2.0, 2.0]]))
    for bad in ([(2, 2)], [(0, 5)], [(-1, 2)], []):
        with pytest.raises(ValueError):
            span_sums(rows, bad)


def test_top_fraction_by_hand():
    scores = torch.arange(40, dtype=torch.float32)[None].repeat(2, 1)  # edge 39 best, then 38
    # 5% of 40 edges = 2 edges
    assert in_top_fraction(scores, torch.tensor([38, 37]), 0.05).tolist() == [True, False]
    assert in_top_fraction(scores, torch.tensor([37, 0]), fraction=0.1).tolist() == [True, False]
    with pytest.raises(ValueError):
        in_top_fraction(scores, torch.tensor([0, 0]), fraction=0)


def test_head_set_metrics_by_hand():
    masses = torch.zeros(2, 2, 2, 3)
    masses[:, 0, 1] = torch.tensor([[0.6, 0.1, 0.0], [0.0, 0.2, 0.5]])
    masses[:, 1, 0] = torch.tensor([[0.2, 0.1, 0.3], [0.1, 0.4, 0.1]])
    att = EdgeAttention(masses, torch.tensor([0, 2]))
    torch.testing.assert_close(att.gold_mass([(0, 1), (1, 0)]), torch.tensor([0.4, 0.3]))
    assert att.gold_in_top([(0, 1)], fraction=0.3).tolist() == [True, True]
    assert att.gold_in_top([(1, 0)], fraction=0.3).tolist() == [False, False]


def test_matches_an_uncached_forward_on_a_tiny_model():
    model = tiny_model("llama", max_position_embeddings=4096)
    inst = make_dataset("path_traversal", model.tokenizer, 1950, n=1, seed=1, progress=False)[0]
    att = teacher_forced_edge_attention(model, inst)
    assert att.masses.shape == (inst.n_hops, 4, 4, inst.n_edges)
    inputs = teacher_forced_inputs(inst, model.tokenizer)
    with torch.inference_mode():
        _, acts = model.bridge.run_with_cache(torch.tensor([inputs.input_ids]))
    step = 2
    pos = inputs.first_token_positions[step]
    layer, head = 3, 1
    row = acts[f"blocks.{layer}.attn.hook_pattern"][0, head, pos]
    expected = torch.stack([row[a:b].sum() for a, b in inst.edge_token_spans])
    torch.testing.assert_close(att.masses[step, layer, head], expected, atol=1e-5, rtol=1e-4)
    assert att.gold.tolist() == inst.gold_edge_indices
    # every row sums to at most 1 over the edges
    assert (att.masses.sum(-1) <= 1 + 1e-5).all()


@pytest.mark.parametrize("backend", ["sdpa", "static"])
def test_read_outs_give_the_bridge_s_edge_attention_for_the_heads_read(backend):
    from dysco_interp.analysis.edge_attention import readout_edge_attention

    model = tiny_model("llama", max_position_embeddings=4096)
    inst = make_dataset("path_traversal", model.tokenizer, 1950, n=1, seed=1, progress=False)[0]
    heads = [(0, 1), (1, 0), (2, 3), (3, 2)]
    ref = teacher_forced_edge_attention(model, inst)
    ours = readout_edge_attention(model, inst, heads, backend)
    idx = torch.tensor(heads)
    torch.testing.assert_close(ours.masses[:, idx[:, 0], idx[:, 1]], ref.masses[:, idx[:, 0], idx[:, 1]],
                               atol=2e-5, rtol=1e-4)
    assert torch.equal(ours.gold_in_top(heads, 0.2), ref.gold_in_top(heads, 0.2))
    assert torch.isnan(ours.masses[:, 0, 0]).all()  # a head not read holds nothing


@pytest.mark.parametrize("backend", ["sdpa", "static"])
def test_read_outs_score_the_steps_as_the_bridge_does(backend):
    from dysco_interp.analysis.edge_attention import readout_edge_attention, span_attention_by_readout
    from dysco_interp.tasks.path_traversal import teacher_forced_inputs

    model = tiny_model("llama", max_position_embeddings=4096)
    inst = make_dataset("path_traversal", model.tokenizer, 1950, n=1, seed=3, progress=False)[0]
    inputs = teacher_forced_inputs(inst, model.tokenizer)
    ids = list(inputs.input_ids)
    rows = list(inputs.first_token_positions)
    end = len(ids) - 2
    _, _, argmax = span_attention_by_readout(model, ids, rows, [(0, 4)], [(1, 0)], backend, feed_to=end)
    with torch.inference_mode():
        logits = model.bridge(torch.tensor([ids], device=model.device))[0]
    assert argmax.tolist() == logits[rows[0]:end + 1].argmax(-1).tolist()  # the prediction made at each position
    ref = teacher_forced_edge_attention(model, inst, score_steps=True)
    ours = readout_edge_attention(model, inst, [(1, 0)], backend, score_steps=True)
    assert ours.correct == ref.correct and len(ours.correct) == len(inst.gold_edge_indices)
    assert readout_edge_attention(model, inst, [(1, 0)], backend).correct is None
