"""dysco-sparse and the plan's keep (`plan.Keep`): the kept set (blocks, sinks, window) as pure
functions, the gathered attention against the masked dense one, a keep against its mask on every
backend, the method's tokens on every backend alone and in a padded batch, against an independent
implementation in TransformerLens hooks, its degenerate setting (dysco-lagged's tokens), and the
checks of its parameters and of a keep."""

import math

import pytest
import torch

import dysco_interp.decoding.baselines  # noqa: F401  (registers the baselines)
from dysco_interp import DecodingConfig, generate, generate_batch
from dysco_interp.decoding import backends, sparse_keys
from dysco_interp.decoding.backends import BackendSpec
from dysco_interp.decoding.backends.decode_attention import attend_one_query, gather_kept
from dysco_interp.decoding.backends.sdpa import AttentionControl, biased_decode_attention, kept_decode_attention
from dysco_interp.decoding.baselines.dysco_sparse import DyscoSparse
from dysco_interp.decoding.choices import BASELINE_NAMES
from dysco_interp.decoding.loop import compare_methods
from dysco_interp.decoding.observe import observe
from dysco_interp.decoding.passes import current_pass
from dysco_interp.decoding.plan import Bias, Keep, Mask, PassPlan, Read, keep_fault, keep_mask
from dysco_interp.decoding.prompts import prepare_prompt
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet, shipped_heads
from dysco_interp.hooks import layer_of, pattern_name, scores_name
from dysco_interp.models.loaded import split
from dysco_interp.models.tiny import STYLES, tiny_model

PROMPT = (
    "You can travel from Paris to Berlin by train. Rome is quiet. " * 6 + "Please give a route from Paris to Berlin."
)
OTHER = "Oslo has a harbour. Bergen is rainy. " * 3 + "Which city has a harbour?"
N_NEW = 10
STEERING = {"beta": 4.0, "select_p": 0.7}
# small enough that the keep hides most of these short prompts from the layers after L*
SPARSE = {**STEERING, "block": 4, "sinks": 2, "window": 6, "max_blocks": 2}


def heads_for(model, pairs=((1, 0), (1, 2))):
    """QRHeads in layer 1 of 4: layers 2 and 3 keep keys."""
    s = model.spec
    return HeadSet(list(pairs), model=s.name, n_layers=s.n_layers, n_heads=s.n_heads, n_kv_heads=s.n_kv_heads)


def config(method, n_new=N_NEW, **params):
    return DecodingConfig(method=method, params=params, max_new_tokens=n_new, record_positions=True)


def selections(result):
    return [(s.position, s.selected) for s in result.trace.steps]


# ------------------------------------------------------------------ the kept set, pure functions


def test_a_selected_key_keeps_its_block_counted_from_the_rows_first_real_token():
    # row 0 unpadded, row 1 with 3 pads: the same selected token (the 6th real one) keeps the same block
    selected = torch.zeros(2, 24, dtype=torch.bool)
    selected[0, 5], selected[1, 8] = True, True
    keep = sparse_keys.kept_keys(selected, torch.rand(2, 24), torch.tensor([0, 3]), block=4, sinks=0, window=1,
                                 max_blocks=4)
    assert keep[0].nonzero().flatten().tolist() == [4, 5, 6, 7, 23]
    assert keep[1].nonzero().flatten().tolist() == [7, 8, 9, 10, 23]


def test_sinks_and_window_are_kept_and_pads_never():
    selected = torch.zeros(2, 20, dtype=torch.bool)
    keep = sparse_keys.kept_keys(selected, torch.zeros(2, 20), torch.tensor([0, 5]), block=4, sinks=3, window=4,
                                 max_blocks=2)
    assert keep[0].nonzero().flatten().tolist() == [0, 1, 2, 16, 17, 18, 19]
    assert keep[1].nonzero().flatten().tolist() == [5, 6, 7, 16, 17, 18, 19]
    everything = sparse_keys.kept_keys(selected, torch.zeros(2, 20), torch.tensor([0, 5]), block=4, sinks=0,
                                       window=100, max_blocks=1)
    assert everything[0].all() and everything[1].tolist() == [False] * 5 + [True] * 15
    # a selected pad (no selection takes one, but the function does not trust it) keeps nothing
    selected[1, 2] = True
    assert sparse_keys.kept_keys(selected, torch.zeros(2, 20), torch.tensor([0, 5]), block=4, sinks=0, window=1,
                                 max_blocks=2)[1].nonzero().flatten().tolist() == [19]


def test_beyond_max_blocks_the_blocks_of_highest_relevance_are_kept_the_earlier_among_equals():
    selected = torch.zeros(1, 32, dtype=torch.bool)
    selected[0, [1, 9, 17, 25]] = True  # blocks 0, 2, 4, 6 of 4 tokens
    relevance = torch.zeros(1, 32)
    relevance[0, [1, 9, 17, 25]] = torch.tensor([0.1, 0.3, 0.3, 0.2])
    relevance[0, 18] = 0.05  # unselected, but its block's relevance counts: block 4 outranks block 2
    keep = sparse_keys.kept_keys(selected, relevance, torch.tensor([0]), block=4, sinks=0, window=1, max_blocks=2)
    assert keep[0].nonzero().flatten().tolist() == [8, 9, 10, 11, 16, 17, 18, 19, 31]
    relevance[0, 18] = 0.0  # blocks 2 and 4 tie: the earlier is first, then block 6 beats block 0
    keep = sparse_keys.kept_keys(selected, relevance, torch.tensor([0]), block=4, sinks=0, window=1, max_blocks=3)
    assert keep[0].nonzero().flatten().tolist() == [8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27, 31]
    keep = sparse_keys.kept_keys(selected, relevance, torch.tensor([0]), block=4, sinks=0, window=1, max_blocks=1)
    assert keep[0].nonzero().flatten().tolist() == [8, 9, 10, 11, 31]


def test_filled_blocks_go_to_the_most_relevant_ones_outside_the_sinks_and_the_window():
    selected = torch.zeros(2, 40, dtype=torch.bool)
    selected[0, 21] = selected[1, 25] = True  # block 5 of 4 tokens, counted from each row's first real token
    relevance = torch.zeros(2, 40)
    relevance[0, [2, 9, 13, 21, 38]] = torch.tensor([0.5, 0.1, 0.2, 0.05, 0.9])  # 2: a sink, 38: the window
    relevance[1, [6, 13, 17, 25]] = torch.tensor([0.5, 0.1, 0.2, 0.05])  # the same, 4 tokens later
    args = dict(block=4, sinks=4, window=4, max_blocks=3)
    bare = sparse_keys.kept_keys(selected, relevance, torch.tensor([0, 4]), **args)
    assert bare[0].nonzero().flatten().tolist() == [0, 1, 2, 3, 20, 21, 22, 23, 36, 37, 38, 39]
    filled = sparse_keys.kept_keys(selected, relevance, torch.tensor([0, 4]), **args, fill_blocks=True)
    # the selected key's block first, then block 3 (0.2) and block 2 (0.1): the sink's and the window's
    # relevance adds nothing, though the window's key is the most relevant one
    assert filled[0].nonzero().flatten().tolist() == [0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15, 20, 21, 22, 23,
                                                      36, 37, 38, 39]
    assert filled[1, 4:].nonzero().flatten().tolist() == [0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15, 20, 21, 22,
                                                          23, 32, 33, 34, 35] and not filled[1, :4].any()
    # the holding blocks come first, whatever the relevance of the others; equal ones in order
    relevance[0] = 0.0
    relevance[0, 5] = 1.0
    filled = sparse_keys.kept_keys(selected, relevance, torch.tensor([0, 4]), block=4, sinks=0, window=1,
                                   max_blocks=2, fill_blocks=True)
    assert filled[0].nonzero().flatten().tolist() == [4, 5, 6, 7, 20, 21, 22, 23, 39]
    relevance[0, 5] = 0.0
    filled = sparse_keys.kept_keys(selected, relevance, torch.tensor([0, 4]), block=4, sinks=0, window=1,
                                   max_blocks=2, fill_blocks=True)
    assert filled[0].nonzero().flatten().tolist() == [0, 1, 2, 3, 20, 21, 22, 23, 39]


def test_a_last_partial_block_and_a_block_of_one_token():
    selected = torch.zeros(1, 10, dtype=torch.bool)
    selected[0, 9] = True
    keep = sparse_keys.kept_keys(selected, torch.ones(1, 10), torch.tensor([0]), block=4, sinks=0, window=1,
                                 max_blocks=1)
    assert keep[0].nonzero().flatten().tolist() == [8, 9]
    selected[0, 3] = True
    keep = sparse_keys.kept_keys(selected, torch.ones(1, 10), torch.tensor([0]), block=1, sinks=0, window=1,
                                 max_blocks=5)
    assert keep[0].nonzero().flatten().tolist() == [3, 9]


def test_kept_positions_are_ascending_fixed_width_slots():
    keep = torch.tensor([[True, False, True, True, False], [False, False, False, False, True]])
    positions, valid = sparse_keys.kept_positions(keep, 4)
    assert positions.tolist() == [[0, 2, 3, 0], [4, 0, 0, 0]]
    assert valid.tolist() == [[True, True, True, False], [True, False, False, False]]
    assert torch.equal(keep_mask(positions, valid, 5), keep)
    assert sparse_keys.capacity(block=64, sinks=64, window=256, max_blocks=64) == 4416


def test_the_capacity_holds_every_kept_key():
    torch.manual_seed(0)
    for _ in range(20):
        n = int(torch.randint(1, 200, ()))
        block, sinks, window, cap = (int(torch.randint(1, 9, ())) for _ in range(4))
        selected = torch.rand(3, n) < 0.2
        first = torch.randint(0, n, (3,))
        fill = bool(torch.randint(0, 2, ()))
        keep = sparse_keys.kept_keys(selected, torch.rand(3, n), first, block=block, sinks=sinks, window=window,
                                     max_blocks=cap, fill_blocks=fill)
        assert int(keep.sum(-1).max()) <= sparse_keys.capacity(block, sinks, window, cap)
        positions, valid = sparse_keys.kept_positions(keep, sparse_keys.capacity(block, sinks, window, cap))
        assert torch.equal(keep_mask(positions, valid, n), keep)


def test_the_kept_set_and_its_checks_never_read_a_value_on_the_host(monkeypatch):
    # what would wait for the device at every step on a GPU (and break a CUDA-graph capture)
    selected = torch.rand(2, 300, generator=torch.Generator().manual_seed(4)) < 0.05
    relevance, first = torch.rand(2, 300), torch.tensor([0, 40])

    def refuse(*args, **kwargs):
        raise AssertionError("a tensor's value was read on the host")

    for name in ("item", "tolist", "nonzero", "__bool__", "__int__", "__float__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, refuse)
    keep = sparse_keys.kept_keys(selected, relevance, first, block=8, sinks=4, window=16, max_blocks=3)
    assert sparse_keys.kept_keys(selected, relevance, first, block=8, sinks=4, window=16, max_blocks=3,
                                 fill_blocks=True).shape == keep.shape
    positions, valid = sparse_keys.kept_positions(keep, sparse_keys.capacity(8, 4, 16, 3))
    fault = keep_fault(positions, valid, 300)
    mask = keep_mask(positions, valid, 300)
    monkeypatch.undo()
    assert int(fault) == 0 and torch.equal(mask, keep)


# ------------------------------------------------------------------ gathered attention = masked dense attention


def random_keep(batch, n_keys, width, generator):
    keep = torch.rand(batch, n_keys, generator=generator) < 0.3
    keep[:, -1] = True
    return sparse_keys.kept_positions(keep, width)


@pytest.mark.parametrize("kind", ["sdpa", "float32"])
@pytest.mark.parametrize("per_head", [False, True])
def test_the_gathered_attention_is_the_masked_dense_attention(kind, per_head):
    g = torch.Generator().manual_seed(1)
    batch, n_heads, n_kv, dim, capacity, n_keys, width = 2, 4, 2, 8, 256, 200, 96
    query = torch.randn(batch, n_heads, 1, dim, generator=g)
    key, value = (torch.randn(batch, n_kv, capacity, dim, generator=g) for _ in range(2))
    mask = torch.randn(batch, n_heads if per_head else 1, 1, capacity, generator=g)  # a bias, as float32
    mask[..., n_keys:] = -math.inf  # empty slots
    mask[1, ..., :7] = -math.inf  # row 1's pads
    positions, valid = random_keep(batch, n_keys, width, g)
    valid[1] &= positions[1] >= 7
    dense = mask.masked_fill(~torch.nn.functional.pad(keep_mask(positions, valid, n_keys),
                                                      (0, capacity - n_keys))[:, None, None, :], -math.inf)
    hidden = torch.zeros(batch, 1, 1, width).masked_fill_(~valid[:, None, None, :], -math.inf)
    k, v, kept = gather_kept(key, value, mask, positions, hidden)
    assert k.shape == (batch, n_kv, width, dim) and kept.shape == (batch, mask.shape[1], 1, width)
    out, rows = attend_one_query(query, k, v, kept, dim ** -0.5, n_heads // n_kv, kind, heads=[0, 3])
    ref, ref_rows = attend_one_query(query, key, value, dense, dim ** -0.5, n_heads // n_kv, kind, heads=[0, 3])
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    scattered = torch.zeros_like(ref_rows).scatter_add_(-1, positions[:, None, :].expand(-1, 2, -1),
                                                        rows * valid[:, None, :])
    torch.testing.assert_close(scattered, ref_rows, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("sliding", [False, True])
def test_the_sdpa_backends_kept_attention_is_its_masked_biased_attention(sliding):
    g = torch.Generator().manual_seed(2)
    batch, n_heads, n_kv, dim, n_keys, width = 2, 4, 2, 8, 60, 24
    n_visible = 40 if sliding else n_keys  # a sliding layer's cache holds its last keys only
    query = torch.randn(batch, n_heads, 1, dim, generator=g)
    key, value = (torch.randn(batch, n_kv, n_visible, dim, generator=g) for _ in range(2))
    pads = torch.ones(batch, 1, 1, n_visible, dtype=torch.bool)
    pads[1, ..., :3] = False
    bias = torch.randn(batch, 1, 1, n_keys, generator=g)
    positions, valid = random_keep(batch, n_keys, width, g)
    for heads in (None, torch.tensor([1, 2])):
        ctl = AttentionControl(bias=bias, bias_layers=frozenset({0}), keep=(positions, valid),
                               keep_layers=frozenset({0}), n_keys=n_keys,
                               bias_heads={} if heads is None else {0: heads})
        out, _ = kept_decode_attention(query, key, value, pads, ctl, 0, dim ** -0.5, n_heads // n_kv)
        kept = keep_mask(positions, valid, n_keys)[:, None, None, -n_visible:]
        ref, _ = biased_decode_attention(query, key, value, pads & kept, bias, dim ** -0.5, n_heads // n_kv, heads)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ a keep is its mask, on every backend


@pytest.mark.parametrize("style", STYLES)
def test_a_keep_gives_the_logits_of_its_mask_on_every_backend(style):
    model = tiny_model(style)
    n_layers = model.spec.n_layers
    rows = [model.tokenizer(p)["input_ids"] for p in (PROMPT, OTHER)]
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    valid = torch.tensor([[False] * (width - len(r)) + [True] * len(r) for r in rows])
    layers = range(2, n_layers)
    bias_values = torch.zeros(2, 1, 1, width)
    bias_values[:, ..., 20:30] = math.log(3.0)
    for name in ("bridge", "sdpa", "static", "flex"):
        backend = backends.make_backend(model, name)
        batch = [0, 1] if name != "bridge" else [1]  # the bridge: the padded row alone, unpadded
        trim = 0 if name != "bridge" else width - len(rows[1])
        state = backend.prefill(ids[batch, trim:-1], None if name == "bridge" else valid[:, :-1])
        other = state.clone()
        n_keys = width - trim
        g = torch.Generator().manual_seed(3)
        keep = (torch.rand(len(batch), n_keys, generator=g) < 0.3) & (valid[batch, trim:] if trim == 0 else True)
        keep[:, -1] = True
        positions, slots = sparse_keys.kept_positions(keep, n_keys // 2 + 8)  # a few slots spare, invalid
        assert not slots.all(-1).any()
        bias = bias_values[batch][..., trim:]
        kept = PassPlan(bias=Bias(layers), keep=Keep(layers)).with_bias(bias).with_keep(positions, slots)
        masked = PassPlan(bias=Bias(layers), mask=Mask(layers)).with_bias(bias).with_mask(keep[:, None, None, :])
        token = ids[batch, -1]
        a = backend.run(state, token, kept).logits
        b = backend.run(other, token, masked).logits
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)
        backend.check_faults()


def test_a_backend_that_does_not_carry_out_a_keep_refuses_it(tiny_llama):
    class Unaware(backends.SdpaBackend):
        runs_keep = False

    assert all(cls.runs_keep for cls in backends.REGISTRY.values())
    backend = Unaware(tiny_llama)
    state = backend.prefill(torch.tensor([[5, 6, 7, 8]]), None)
    plan = PassPlan(keep=Keep([1])).with_keep(torch.tensor([[4]]), torch.tensor([[True]]))
    with pytest.raises(ConfigError, match="does not carry out a plan's keep"):
        backend.run(state, torch.tensor([9]), plan)


@pytest.mark.parametrize("style", STYLES)
def test_a_read_in_a_kept_layer_covers_every_key_on_every_backend(style):
    # the kept pass's logits are its mask's, and its read (layer 1, kept) is the read without the keep
    model = tiny_model(style)
    n_layers = model.spec.n_layers
    ids = torch.tensor([model.tokenizer(PROMPT)["input_ids"]])
    n_keys = ids.shape[1]
    layers = range(1, n_layers)
    bias = torch.zeros(1, 1, 1, n_keys)
    bias[..., 10:20] = math.log(3.0)
    keep = torch.rand(1, n_keys, generator=torch.Generator().manual_seed(5)) < 0.3
    keep[:, -1] = True
    positions, slots = sparse_keys.kept_positions(keep, n_keys // 2 + 8)
    read = Read([(1, 0), (1, 3), (2, 1)], returns="rows")
    plans = {"kept": PassPlan(reads=(read,), bias=Bias(layers), keep=Keep(layers)).with_bias(bias).with_keep(
                 positions, slots),
             "masked": PassPlan(reads=(read,), bias=Bias(layers), mask=Mask(layers)).with_bias(bias).with_mask(
                 keep[:, None, None, :]),
             "open": PassPlan(reads=(read,), bias=Bias(layers)).with_bias(bias)}
    for name in ("bridge", "sdpa", "static", "flex"):
        backend = backends.make_backend(model, name)
        state = backend.prefill(ids[:, :-1], None)
        out = {key: backend.run(state.clone(), ids[:, -1], plan) for key, plan in plans.items()}
        torch.testing.assert_close(out["kept"].logits, out["masked"].logits, rtol=1e-4, atol=1e-5, msg=name)
        kept_rows, open_rows = out["kept"].reads[0].rows, out["open"].reads[0].rows
        # layer 1's rows are the open pass's (layer 0 is not kept); layer 2's follow a kept layer 1
        torch.testing.assert_close(kept_rows[:, :2], open_rows[:, :2], rtol=1e-4, atol=1e-6, msg=name)
        assert (kept_rows[:, 2] > 0).all() and not torch.allclose(kept_rows[:, 2], open_rows[:, 2]), name
        assert kept_rows[:, :2][..., ~keep[0]].sum() > 0.1, name  # on keys the keep hides from the outputs
        torch.testing.assert_close(kept_rows.sum(-1), torch.ones(1, 3), msg=name)
        backend.check_faults()


def test_a_keep_is_checked():
    PassPlan(reads=(Read([(2, 0)]),), keep=Keep([2, 3]))  # a read in a kept layer covers every key
    with pytest.raises(ConfigError, match="not a rule"):
        PassPlan(reads=(Read([(1, 0)]),), bias=Bias([2], source="rule"), keep=Keep([3]))
    with pytest.raises(ConfigError, match="keep layer 7 is outside"):
        PassPlan(keep=Keep([7])).check(4, 4)
    with pytest.raises(ConfigError, match="a keep needs at least one layer"):
        Keep([])
    with pytest.raises(ConfigError, match="no keep"):
        PassPlan().with_keep(torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 2, dtype=torch.bool))
    plan = PassPlan(keep=Keep([1]))
    assert plan.kind == "biased" and plan.with_keep(torch.zeros(1, 1, dtype=torch.long),
                                                    torch.ones(1, 1, dtype=torch.bool)) == plan
    model = tiny_model("llama")
    sdpa = backends.make_backend(model, "sdpa")
    state = sdpa.prefill(torch.tensor([[5, 6, 7, 8]]), None)
    with pytest.raises(ConfigError, match="no positions"):
        sdpa.run(state.clone(), torch.tensor([9]), plan)
    with pytest.raises(ConfigError, match="long and its valid slots bool"):
        sdpa.run(state.clone(), torch.tensor([9]), plan.with_keep(torch.zeros(1, 2),
                                                                  torch.ones(1, 2, dtype=torch.bool)))
    with pytest.raises(ConfigError, match=r"\[batch, capacity\]"):
        sdpa.run(state.clone(), torch.tensor([9]), plan.with_keep(torch.zeros(2, 2, dtype=torch.long),
                                                                  torch.ones(2, 2, dtype=torch.bool)))
    for positions, slots, what in (([[4, 9]], [True, True], "outside the step's keys"),
                                   ([[4, 4]], [True, True], "twice"),
                                   ([[4, 1]], [False, False], "no finite key")):
        sdpa.run(state.clone(), torch.tensor([9]), plan.with_keep(torch.tensor(positions), torch.tensor([slots])))
        with pytest.raises(ConfigError, match=what):
            sdpa.check_faults()


# ------------------------------------------------------------------ the method on every backend


def test_dysco_sparse_is_registered_after_the_other_variants():
    assert BASELINE_NAMES[:4] == ("dysco-lagged", "dysco-hard", "dysco-middle", "dysco-sparse")


@pytest.mark.parametrize("style", STYLES)
def test_every_backend_gives_the_bridges_tokens_alone_and_in_a_padded_batch(style, tokens_everywhere):
    model = tiny_model(style)
    heads = heads_for(model)
    configs = {"lagged": config("dysco-lagged", **STEERING), "sparse": config("dysco-sparse", **SPARSE),
               "sparse-one-block": config("dysco-sparse", **SPARSE | {"max_blocks": 1, "sinks": 0}),
               "sparse-filled": config("dysco-sparse", **SPARSE | {"max_blocks": 4, "select_k": 1}, fill_blocks=True)}
    out = tokens_everywhere(model, configs, [PROMPT, OTHER], heads)
    assert out["bridge"]["sparse"] != out["bridge"]["lagged"]  # the keep hides keys that matter here
    for backend in ("sdpa", "static"):
        assert out[backend] == out["bridge"], backend
    flex = generate_batch(model, [PROMPT, OTHER], configs, heads, backend="flex")
    assert {name: [r.tokens for r in rows] for name, rows in flex.items()} == out["bridge"]
    alone = compare_methods(model, OTHER, configs, heads, backend="static")  # the padded row, alone
    assert {name: r.tokens for name, r in alone.items()} == {name: t[1] for name, t in out["bridge"].items()}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("style", STYLES)
def test_dysco_sparse_replays_as_cuda_graphs_with_the_eager_tokens(style):
    model = tiny_model(style, device="cuda")
    heads = heads_for(model)
    configs = {"sparse": config("dysco-sparse", **SPARSE), "lagged": config("dysco-lagged", **STEERING),
               "all": config("dysco-sparse", **SPARSE, sparse_layers="all"),
               "filled": config("dysco-sparse", **SPARSE, sparse_layers="all", fill_blocks=True)}
    replayed = generate_batch(model, [PROMPT, OTHER], configs, heads, backend=BackendSpec("static", graphs=True))
    eager = generate_batch(model, [PROMPT, OTHER], configs, heads, backend=BackendSpec("static", graphs=False))
    for name in configs:
        assert [r.tokens for r in replayed[name]] == [r.tokens for r in eager[name]], name
        assert [selections(r) for r in replayed[name]] == [selections(r) for r in eager[name]], name


def test_a_window_over_the_whole_context_gives_dysco_lagged_s_tokens_and_selections(tiny):
    heads = heads_for(tiny)
    for backend in ("bridge", "static"):
        out = compare_methods(tiny, PROMPT, {
            "lagged": config("dysco-lagged", **STEERING),
            "sparse-window": config("dysco-sparse", **STEERING, window=1024, max_blocks=1),
            "sparse-blocks": config("dysco-sparse", **STEERING, block=1024, sinks=0, window=1),
            "sparse": config("dysco-sparse", **SPARSE),
        }, heads, backend=backend)
        for name in ("sparse-window", "sparse-blocks"):
            assert out[name].tokens == out["lagged"].tokens, (backend, name)
            assert selections(out[name]) == selections(out["lagged"]), (backend, name)
        assert out["sparse"].tokens != out["lagged"].tokens, backend


@pytest.mark.filterwarnings("ignore::dysco_interp.decoding.template.TemplateMaskingFallbackWarning")  # gemma3's
@pytest.mark.parametrize("backend", ["sdpa", "static"])
def test_a_model_split_over_two_devices_gives_the_one_device_tokens(backend):
    # layers (0, 0 | 1, 1): the kept layers on the second device, whose fixed copies of the kept keys
    # the static backend refreshes at every step
    prompts = [PROMPT, OTHER]
    configs = {"sparse": config("dysco-sparse", **SPARSE)}
    for style in ("llama", "gemma3"):  # the written-out decoder, and the transformers forward
        whole = tiny_model(style)
        halves = split(tiny_model(style), ("cpu", "cpu"))
        one = generate_batch(whole, prompts, configs, heads_for(whole), backend=backend)["sparse"]
        two = generate_batch(halves, prompts, configs, heads_for(halves), backend=backend)["sparse"]
        assert [r.tokens for r in two] == [r.tokens for r in one], style
        assert [selections(r) for r in two] == [selections(r) for r in one], style


def test_a_short_run_gathers_no_more_slots_than_it_has_keys(tiny_llama, monkeypatch):
    widths = []
    original = sparse_keys.kept_positions

    def spy(keep, width):
        widths.append(width)
        return original(keep, width)

    monkeypatch.setattr(sparse_keys, "kept_positions", spy)
    heads = heads_for(tiny_llama)
    short = generate_batch(tiny_llama, [PROMPT, OTHER], {"s": config("dysco-sparse", **STEERING)}, heads,
                           backend="static")["s"]
    width = len(prepare_prompt(tiny_llama, PROMPT).ids) + N_NEW  # the longer prompt's keys and the new tokens
    assert set(widths) == {width} and width < 4416
    widths.clear()
    assert generate_batch(tiny_llama, [PROMPT, OTHER], {"s": config("dysco-sparse", **STEERING, window=width)}, heads,
                          backend="static")["s"][0].tokens == short[0].tokens
    assert set(widths) == {width}


def test_a_qrhead_in_the_last_layer_leaves_dysco_lagged_s_plan(tiny_llama):
    n_layers = tiny_llama.spec.n_layers
    deep = heads_for(tiny_llama, ((1, 0), (n_layers - 1, 1)))
    method = DyscoSparse(config("dysco-sparse"), deep, tiny_llama.spec)
    assert method.steering.keep is None
    method = DyscoSparse(config("dysco-sparse"), heads_for(tiny_llama), tiny_llama.spec)
    assert method.steering.keep == Keep(range(2, n_layers)) and method.capacity == 4416
    for heads in (deep, heads_for(tiny_llama)):
        method = DyscoSparse(config("dysco-sparse", sparse_layers="all"), heads, tiny_llama.spec)
        assert method.steering.keep == Keep(range(n_layers))


@pytest.mark.parametrize("style", STYLES)
def test_every_layer_sparse_gives_the_bridges_tokens_on_every_backend(style, tokens_everywhere):
    model = tiny_model(style)
    heads = heads_for(model)
    configs = {"after": config("dysco-sparse", **SPARSE), "all": config("dysco-sparse", **SPARSE, sparse_layers="all")}
    out = tokens_everywhere(model, configs, [PROMPT, OTHER], heads)
    assert out["bridge"]["all"] != out["bridge"]["after"]  # layers 0..L* see the kept keys only
    for backend in ("sdpa", "static"):
        assert out[backend] == out["bridge"], backend
    flex = generate_batch(model, [PROMPT, OTHER], configs, heads, backend="flex")
    assert {name: [r.tokens for r in rows] for name, rows in flex.items()} == out["bridge"]


def test_every_layer_sparse_with_a_window_over_the_context_gives_dysco_lagged_s_tokens(tiny):
    heads = heads_for(tiny)
    for backend in ("bridge", "static"):
        out = compare_methods(tiny, PROMPT, {
            "lagged": config("dysco-lagged", **STEERING),
            "all-window": config("dysco-sparse", **STEERING, window=1024, max_blocks=1, sparse_layers="all"),
        }, heads, backend=backend)
        assert out["all-window"].tokens == out["lagged"].tokens, backend
        assert selections(out["all-window"]) == selections(out["lagged"]), backend


# ------------------------------------------------------------------ an independent implementation in TL hooks


class HookSparse:
    """dysco-sparse written again as TransformerLens hooks on the bridge, sharing nothing with the
    method: the QRHeads' rows (hook_pattern), the running relevance, the nucleus-then-K selection,
    the blocks, sinks and window, and the edit of the scores (hook_attn_scores: log(beta) on the
    selected keys and the own key in every layer; -inf outside the kept keys after the deepest
    QRHead, or with `every_layer` in every layer, the QRHeads' rows then read from the scores
    before that -inf). It rides on vanilla's passes (one plain pass per token); one prompt, no
    pads: key j is the j-th token."""

    def __init__(self, model, heads, template, *, select_p, beta, block, sinks, window, max_blocks, select_k=8,
                 decay=0.75, every_layer=False, fill_blocks=False):
        self.n_layers = model.spec.n_layers
        self.heads = sorted(tuple(h) for h in heads)
        self.deepest = self.heads[-1][0]
        self.template = template.bool()
        self.select_p, self.select_k, self.decay, self.log_beta = select_p, select_k, decay, math.log(beta)
        self.block, self.sinks, self.window, self.max_blocks = block, sinks, window, max_blocks
        self.relevance, self.rows, self.edit, self.hidden = None, {}, None, None
        self.selected = []
        self.every_layer, self.fill_blocks = every_layer, fill_blocks

    def hooks(self):
        read = [] if self.every_layer else [
            (pattern_name(layer), self.read) for layer in sorted({layer for layer, _ in self.heads})]
        return read + [(scores_name(layer), self.steer) for layer in range(self.n_layers)]

    def read(self, pattern, hook, layer=None):
        now = current_pass()
        if now is None or now.kind == "prefill":
            return None
        layer = layer_of(hook) if layer is None else layer
        self.rows[layer] = pattern[0, [h for l_, h in self.heads if l_ == layer], -1, :].float()
        if layer == self.deepest:
            a = torch.cat([self.rows[x] for x in sorted(self.rows)]).mean(dim=0)
            if self.relevance is not None:
                previous = torch.cat([self.relevance, torch.zeros(len(a) - len(self.relevance))])
                a = (a + self.decay * previous) / (1.0 + self.decay)
            self.relevance, self.rows = a, {}
        return None

    def select(self, n):
        r = torch.cat([self.relevance, torch.zeros(n - len(self.relevance))])
        order = sorted(range(n), key=lambda i: (-float(r[i]), i))
        mass = torch.cumsum(r[order], dim=0)
        picked = []
        for rank, i in enumerate(order):
            if rank >= self.select_k or (rank > 0 and mass[rank] > self.select_p):
                break
            picked.append(i)
        template = torch.zeros(n, dtype=torch.bool)
        template[: min(n, len(self.template))] = self.template[:n]
        chosen = sorted(i for i in picked if not template[i])
        self.selected.append(chosen)
        self.edit = torch.zeros(n)
        self.edit[chosen + [n - 1]] = self.log_beta
        always = set(range(min(self.sinks, n))) | set(range(max(0, n - self.window), n))

        def keys(b):
            return range(b * self.block, min((b + 1) * self.block, n))

        holding = {i // self.block for i in chosen}
        blocks = sorted(holding, key=lambda b: (-float(r[list(keys(b))].sum()), b))
        if self.fill_blocks:  # then the others, by their relevance outside the sinks and the window
            others = [b for b in range(-(-n // self.block)) if b not in holding]
            blocks += sorted(others, key=lambda b: (-sum(float(r[j]) for j in keys(b) if j not in always), b))
        kept = {j for b in blocks[: self.max_blocks] for j in keys(b)} | always
        self.hidden = torch.full((n,), -math.inf)
        self.hidden[sorted(kept)] = 0.0

    def steer(self, scores, hook):
        now = current_pass()
        if now is None or now.phase == "prefill":
            return None
        layer = layer_of(hook)
        reads_here = self.every_layer and any(layer == l_ for l_, _ in self.heads)
        if now.phase == "context-warmup":  # vanilla's reads, every key
            if reads_here:
                self.read(scores.float().softmax(dim=-1), hook, layer)
            return None
        if layer == 0:  # once per token, from the reads before it
            self.select(scores.shape[-1])
        edited = scores + self.edit
        if not self.every_layer:
            return edited + (self.hidden if layer > self.deepest else 0.0)
        if reads_here:  # the read sees every key
            self.read(edited.float().softmax(dim=-1), hook, layer)
        return edited + self.hidden


def test_the_hook_implementation_gives_dysco_sparse_s_tokens_and_selections(tiny_llama):
    heads = heads_for(tiny_llama)
    template = prepare_prompt(tiny_llama, PROMPT).template("reference")
    ours = HookSparse(tiny_llama, heads, template, **SPARSE)
    with observe(tiny_llama, hooks=ours.hooks()):
        reference = generate(tiny_llama, PROMPT, config("vanilla"), heads=heads).tokens
    # a hook that changes nothing, so that the prefill runs through the bridge as the reference's does
    with observe(tiny_llama, hooks=[(pattern_name(0), lambda pattern, hook: None)]):
        result = generate(tiny_llama, PROMPT, config("dysco-sparse", **SPARSE), heads=heads)
        lagged = generate(tiny_llama, PROMPT, config("dysco-lagged", **STEERING), heads=heads)
    assert result.tokens == reference
    assert [s.selected for s in result.trace.steps if s.selected is not None] == ours.selected
    assert result.tokens != lagged.tokens


def test_the_hook_implementation_gives_every_layer_sparse_s_tokens_and_selections(tiny_llama):
    heads = heads_for(tiny_llama)
    template = prepare_prompt(tiny_llama, PROMPT).template("reference")
    ours = HookSparse(tiny_llama, heads, template, **SPARSE, every_layer=True)
    with observe(tiny_llama, hooks=ours.hooks()):
        reference = generate(tiny_llama, PROMPT, config("vanilla"), heads=heads).tokens
    with observe(tiny_llama, hooks=[(pattern_name(0), lambda pattern, hook: None)]):
        result = generate(tiny_llama, PROMPT, config("dysco-sparse", **SPARSE, sparse_layers="all"), heads=heads)
        after = generate(tiny_llama, PROMPT, config("dysco-sparse", **SPARSE), heads=heads)
    assert result.tokens == reference
    assert [s.selected for s in result.trace.steps if s.selected is not None] == ours.selected
    assert result.tokens != after.tokens


@pytest.mark.parametrize("every_layer", [False, True])
def test_the_hook_implementation_gives_filled_dysco_sparse_s_tokens_and_selections(tiny_llama, every_layer):
    heads = heads_for(tiny_llama)
    template = prepare_prompt(tiny_llama, PROMPT).template("reference")
    params = SPARSE | {"max_blocks": 4, "select_k": 1}  # one selected key claims one of the four blocks
    ours = HookSparse(tiny_llama, heads, template, **params, every_layer=every_layer, fill_blocks=True)
    with observe(tiny_llama, hooks=ours.hooks()):
        reference = generate(tiny_llama, PROMPT, config("vanilla"), heads=heads).tokens
    layers = "all" if every_layer else "after-reads"
    with observe(tiny_llama, hooks=[(pattern_name(0), lambda pattern, hook: None)]):
        result = generate(tiny_llama, PROMPT, config("dysco-sparse", **params, sparse_layers=layers, fill_blocks=True),
                          heads=heads)
        bare = generate(tiny_llama, PROMPT, config("dysco-sparse", **params, sparse_layers=layers), heads=heads)
    assert result.tokens == reference
    assert [s.selected for s in result.trace.steps if s.selected is not None] == ours.selected
    assert result.tokens != bare.tokens  # the filled blocks show keys the bare keep hides


@pytest.mark.real_model
def test_the_hook_implementation_gives_dysco_sparse_s_tokens_on_the_real_model(real_model):
    heads = shipped_heads("smollm2-135m", spec=real_model.spec)
    # a keep small enough to change the answer of this prompt (with a window of 16 and two blocks of 8 it does not)
    params = {"beta": 8.0, "select_p": 0.9, "select_k": 32, "block": 2, "sinks": 1, "window": 2, "max_blocks": 1}
    template = prepare_prompt(real_model, PROMPT).template("reference")
    ours = HookSparse(real_model, heads, template, **params)
    with observe(real_model, hooks=ours.hooks()):
        reference = generate(real_model, PROMPT, config("vanilla", 8), heads=heads).tokens
    with observe(real_model, hooks=[(pattern_name(0), lambda pattern, hook: None)]):
        result = generate(real_model, PROMPT, config("dysco-sparse", 8, **params), heads=heads)
    assert result.tokens == reference
    assert [s.selected for s in result.trace.steps if s.selected is not None] == ours.selected
    static = generate(real_model, PROMPT, config("dysco-sparse", 8, **params), heads=heads, backend="static")
    assert static.tokens == reference
    ours = HookSparse(real_model, heads, template, **params, every_layer=True)
    with observe(real_model, hooks=ours.hooks()):
        every = generate(real_model, PROMPT, config("vanilla", 8), heads=heads).tokens
    for backend in ("bridge", "static"):
        result = generate(real_model, PROMPT, config("dysco-sparse", 8, **params, sparse_layers="all"), heads=heads,
                          backend=backend)
        assert result.tokens == every, backend
    filled = params | {"select_k": 2, "max_blocks": 4}
    ours = HookSparse(real_model, heads, template, **filled, every_layer=True, fill_blocks=True)
    with observe(real_model, hooks=ours.hooks()):
        reference = generate(real_model, PROMPT, config("vanilla", 8), heads=heads).tokens
    for backend in ("bridge", "static"):
        result = generate(real_model, PROMPT, config("dysco-sparse", 8, **filled, sparse_layers="all",
                                                     fill_blocks=True), heads=heads, backend=backend)
        assert result.tokens == reference, backend
    lagged = {k: v for k, v in params.items() if k not in ("block", "sinks", "window", "max_blocks")}
    assert generate(real_model, PROMPT, config("dysco-lagged", 8, **lagged), heads=heads).tokens != reference


# ------------------------------------------------------------------ bad parameters


@pytest.mark.parametrize("params,match", [
    ({"block": 0}, "block"),
    ({"block": 2.5}, "block"),
    ({"block": "64"}, "block"),
    ({"sinks": -1}, "sinks"),
    ({"window": 0}, "window"),
    ({"max_blocks": 0}, "max_blocks"),
    ({"max_blocks": True}, "max_blocks"),
    ({"beta": 0.0}, "beta"),
    ({"blocks": 4}, "no parameter 'blocks'"),
    ({"sparse_layers": "every"}, "sparse_layers"),
    ({"fill_blocks": 1}, "fill_blocks"),
])
def test_bad_parameters_are_one_config_error_line_before_any_model_loads(no_model, params, match):
    with pytest.raises(ConfigError, match=match) as caught:
        DecodingConfig(method="dysco-sparse", params=params)
    assert "\n" not in str(caught.value) and "dysco-sparse" in str(caught.value)
