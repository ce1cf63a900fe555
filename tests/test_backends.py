"""The fast backends (SDPA, static) against the TransformerLens bridge, and batches against single prompts."""

import dataclasses
import warnings

import pytest
import torch

from dysco_interp.decoding import backends, relevance
from dysco_interp.decoding.config import DecodingConfig
from dysco_interp.decoding.loop import compare_methods, generate_batch
from dysco_interp.decoding.plan import Bias, PassPlan, Read, Scale
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet
from dysco_interp.models.tiny import STYLES, tiny_model

PROMPT = (
    "You can travel from Paris to Berlin by train. Rome is quiet. " * 6 + "Please give a route from Paris to Berlin."
)
OTHERS = [
    "Oslo has a harbour. Bergen is rainy. " * 3 + "Which city has a harbour?",
    "Tokyo, Kyoto and Osaka are linked by fast trains; " * 8 + "Name the linked cities.",
]
N_NEW = 12


def heads_for(model, pairs=((1, 0), (2, 3), (1, 2))):
    s = model.spec
    return HeadSet(list(pairs), model=s.name, n_layers=s.n_layers, n_heads=s.n_heads, n_kv_heads=s.n_kv_heads)


def reading(heads):
    return PassPlan(reads=(Read(tuple(heads)),))


def partial(heads):
    read = Read(tuple(heads))
    return PassPlan(reads=(read,), stop_after=read.max_layer, write_cache=False)


def biased(model, bias):
    return PassPlan(bias=Bias(range(model.spec.n_layers))).with_bias(bias)


STRONG = {"beta": 4.0, "select_p": 0.7}  # DySCO and its ablations, stronger than the defaults
METHODS = {
    "vanilla": DecodingConfig(method="vanilla", max_new_tokens=N_NEW),
    "dysco": DecodingConfig(params=STRONG, max_new_tokens=N_NEW, record_positions=True),
    "static": DecodingConfig(method="dysco-static", params=STRONG, max_new_tokens=N_NEW, record_positions=True),
    "random": DecodingConfig(method="dysco-random", params={**STRONG, "head_seed": 1}, max_new_tokens=N_NEW),
    "reuse": DecodingConfig(method="dysco-reuse", params=STRONG, max_new_tokens=N_NEW, record_positions=True),
    "uniattns": DecodingConfig(method="uniattns", params={"tau": 0.5}, max_new_tokens=N_NEW),
    "gated": DecodingConfig(method="dysco-gated", params={**STRONG, "min_mass": 0.72}, max_new_tokens=N_NEW,
                            record_positions=True),
}


def selections(result):
    return [(s.position, s.selected, s.n_selected) for s in result.trace.steps]


def test_one_step_of_each_operation_matches_the_bridge(tiny):
    heads = heads_for(tiny)
    ids = torch.randint(20, 500, (1, 40), generator=torch.Generator().manual_seed(1))
    out = {}
    # the static backend's two decoding attentions: fused SDPA (its default) and the float32 reference
    runs = {name: (name, None) for name in backends.BACKENDS} | {"static-float32": ("static", "float32")}
    for name, (backend, decode_attention) in runs.items():
        b = backends.make_backend(tiny, backend, decode_attention=decode_attention)
        state = b.prefill(ids[:, :-2], None)
        early = b.run(state, ids[:, -2], partial(heads)).attention
        step = b.run(state, ids[:, -2], reading(heads))
        logits, read = step.logits, step.attention
        bias = relevance.scaling_bias(torch.nn.functional.pad(read > read.mean(), (0, 1)), 3.0)
        late = b.run(state, ids[:, -1], biased(tiny, bias)).logits
        out[name] = (early, read, logits, late)
    for fast in ("sdpa", "static", "static-float32"):
        for ours, ref in zip(out[fast], out["bridge"]):
            torch.testing.assert_close(ours, ref, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(out[fast][0], out[fast][1])  # the partial pass reads what the full one does
        assert not torch.allclose(out[fast][3], out[fast][2], atol=1e-3)  # the bias did something


@pytest.mark.parametrize("backend", ["sdpa", "static"])
def test_every_method_gives_the_same_tokens_and_selections_as_the_bridge(tiny, backend):
    heads = heads_for(tiny)
    bridge = compare_methods(tiny, PROMPT, METHODS, heads, backend="bridge")
    fast = compare_methods(tiny, PROMPT, METHODS, heads, backend=backend)
    for name in METHODS:
        assert fast[name].tokens == bridge[name].tokens, name
        assert selections(fast[name]) == selections(bridge[name]), name
    assert fast["dysco"].tokens != fast["vanilla"].tokens or fast["uniattns"].tokens != fast["vanilla"].tokens


@pytest.mark.parametrize("backend", ["sdpa", "static"])
def test_a_padded_batch_gives_each_row_its_own_result(tiny, backend):
    heads = heads_for(tiny)
    prompts = [PROMPT, *OTHERS]
    batched = generate_batch(tiny, prompts, METHODS, heads, backend=backend)
    for i, prompt in enumerate(prompts):
        alone = compare_methods(tiny, prompt, METHODS, heads, backend=backend)
        for name in METHODS:
            row = batched[name][i]
            assert row.tokens == alone[name].tokens, (i, name)
            assert row.prompt_ids == alone[name].prompt_ids
            assert selections(row) == selections(alone[name]), (i, name)
            assert row.timings.batch_size == 3


def test_rows_stop_on_their_own_end_of_sequence(tiny_llama, monkeypatch):
    prompts = [PROMPT, *OTHERS]
    config = DecodingConfig(method="vanilla", max_new_tokens=N_NEW)
    alone = [compare_methods(tiny_llama, p, {"v": config}, backend="sdpa")["v"] for p in prompts]
    eos = alone[1].tokens[3]  # pretend this token ends a sequence
    # the model is shared by every test: monkeypatch puts back whatever value it had
    monkeypatch.setattr(tiny_llama.prefill_model.generation_config, "eos_token_id", eos)
    batched = generate_batch(tiny_llama, prompts, {"v": config}, backend="sdpa")["v"]
    for row, ref in zip(batched, alone):
        cut = ref.tokens.index(eos) + 1 if eos in ref.tokens else len(ref.tokens)
        assert row.tokens == ref.tokens[:cut] and row.finished == (eos in ref.tokens)
    assert batched[1].finished and len(batched[1].tokens) <= 4


def test_the_bridge_refuses_batches_and_unknown_backends_are_refused(tiny_llama):
    with pytest.raises(ConfigError, match="one prompt at a time"):
        generate_batch(tiny_llama, [PROMPT, OTHERS[0]], {"v": METHODS["vanilla"]}, backend="bridge")
    with pytest.raises(ConfigError, match="unknown backend"):
        compare_methods(tiny_llama, PROMPT, {"v": METHODS["vanilla"]}, backend="flash")


def test_the_sdpa_backend_leaves_the_loaded_model_as_it_was(tiny_llama):
    from dysco_interp.decoding import runtime

    ids = torch.randint(20, 500, (1, 30), generator=torch.Generator().manual_seed(2))
    _, before = runtime.prefill(tiny_llama, ids)
    backend = backends.make_backend(tiny_llama, "sdpa")
    assert tiny_llama.prefill_model.config._attn_implementation == "sdpa"
    assert backend.hf is not tiny_llama.prefill_model
    assert backend.hf is backends.make_backend(tiny_llama, "sdpa").hf
    shared = {p.data_ptr() for p in tiny_llama.prefill_model.parameters()}
    assert {p.data_ptr() for p in backend.hf.parameters()} == shared  # no copy of the weights
    _, after = runtime.prefill(tiny_llama, ids)
    torch.testing.assert_close(after, before, atol=0, rtol=0)


def test_static_buffers_grow_when_decoding_outlives_them(tiny_of):
    from dysco_interp.decoding.backends.decode_attention import GRANULE

    tiny_qwen3 = tiny_of("qwen3")
    heads = heads_for(tiny_qwen3)
    ids = torch.randint(20, 500, (1, GRANULE + 6), generator=torch.Generator().manual_seed(3))
    out = {}
    for name in ("sdpa", "static"):
        b = backends.make_backend(tiny_qwen3, name)
        state = b.prefill(ids[:, :GRANULE - 2], None)  # reserve 0: room for 2 more keys
        logits = []
        for col in range(GRANULE - 2, ids.shape[1]):
            read = b.run(state, ids[:, col], partial(heads)).attention
            bias = relevance.scaling_bias(read > read.mean(), 2.0)
            logits.append(b.run(state, ids[:, col], biased(tiny_qwen3, bias)).logits)
        out[name] = (torch.stack(logits), state)
    torch.testing.assert_close(out["static"][0], out["sdpa"][0], atol=2e-5, rtol=1e-4)
    assert out["static"][1].cache.capacity > GRANULE and out["static"][1].n_keys == GRANULE + 6


def test_a_static_step_sets_the_next_steps_slot_position_and_mask_behind_its_pass(tiny_of):
    """The slot, mask column and position ids of step n+1 are set right after step n's pass; a
    pass that writes no cache (a read before the biased one) opens nothing; grown buffers
    open the slot again."""
    from dysco_interp.decoding.backends.decode_attention import GRANULE

    model = tiny_of("llama")
    b = backends.make_backend(model, "static")
    ids = torch.randint(20, 500, (1, GRANULE + 2), generator=torch.Generator().manual_seed(4))
    n = GRANULE - 2
    state = b.prefill(ids[:, :n], None)
    assert state.opened is None
    b.run(state, ids[:, n], partial(heads_for(model)))
    assert state.opened == n and state.n_keys == n  # the read opened the step's own slot only
    b.run(state, ids[:, n], PassPlan())
    assert state.opened == n + 1 and int(state.slot) == n + 1
    assert state.position.tolist() == [[n + 1]] == state.next_position[:, None].tolist()
    assert (state.mask[0, 0, 0, : n + 2] == 0).all() and (state.mask[0, 0, 0, n + 2:] == -torch.inf).all()
    b.run(state, ids[:, n + 1], PassPlan())  # the last slot: nothing left to open
    assert state.n_keys == GRANULE == state.cache.capacity and state.opened == n + 1
    logits = b.run(state, ids[:, n + 2], PassPlan()).logits  # grows the buffers, opens the slot itself
    assert state.cache.capacity > GRANULE and state.opened == GRANULE + 1
    reference = backends.make_backend(model, "sdpa")
    ref_state = reference.prefill(ids[:, :n], None)
    for col in range(n, n + 3):
        ref_logits = reference.run(ref_state, ids[:, col], PassPlan()).logits
    torch.testing.assert_close(logits, ref_logits, atol=2e-5, rtol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("style", STYLES)
def test_replayed_graphs_give_the_eager_tokens_and_selections(style):
    model = tiny_model(style, device="cuda")
    heads = heads_for(model)
    prompts = [PROMPT, *OTHERS]
    replayed = generate_batch(model, prompts, METHODS, heads, backend=backends.BackendSpec("static", graphs=True))
    eager = generate_batch(model, prompts, METHODS, heads, backend=backends.BackendSpec("static", graphs=False))
    sdpa = generate_batch(model, prompts, METHODS, heads, backend="sdpa")
    for name in METHODS:
        for ours, ref, other in zip(replayed[name], eager[name], sdpa[name]):
            assert ours.tokens == ref.tokens == other.tokens, name
            assert selections(ours) == selections(ref) == selections(other), name


def test_the_static_decoding_attentions_give_the_same_tokens_and_selections(tiny, monkeypatch):
    from dysco_interp.decoding.backends import decode_attention, fused_decoder, static

    kinds = set()

    def spy(*args, **kwargs):
        kinds.add(args[6])
        return decode_attention.attend_one_query(*args, **kwargs)

    for module in (static, fused_decoder):  # the written-out decoder and the HF-forward path
        monkeypatch.setattr(module, "attend_one_query", spy)
    heads = heads_for(tiny)
    prompts = [PROMPT, *OTHERS]
    out = {}
    for mode in ("sdpa", "float32"):
        kinds.clear()
        out[mode] = generate_batch(tiny, prompts, METHODS, heads,
                                   backend=backends.BackendSpec("static", decode_attention=mode))
        assert kinds == {mode}  # the choice reaches every decoding step
    for name in METHODS:
        for ours, ref in zip(out["sdpa"][name], out["float32"][name]):
            assert ours.tokens == ref.tokens, name
            assert selections(ours) == selections(ref), name
    with pytest.raises(ConfigError, match="the sdpa backend has no option decode_attention"):
        backends.make_backend(tiny, "sdpa", decode_attention="float32")
    with pytest.raises(ConfigError, match="the sdpa backend has no option decode_attention"):
        generate_batch(tiny, prompts, METHODS, heads, backend=backends.BackendSpec("sdpa", decode_attention="float32"))
    with pytest.raises(ConfigError, match="decode_attention must be one of"):
        backends.make_backend(tiny, "static", decode_attention="flash")


def test_a_backend_owns_its_typed_options():
    spec = backends.BackendSpec("static", options=backends.StaticOptions(decode_attention="float32"))
    assert spec == backends.BackendSpec("static", decode_attention="float32")  # the keywords build the same
    assert spec.decode_attention == "float32" and spec.store_settings() == {"backend": "static",
                                                                           "decode_attention": "float32"}
    assert backends.BackendSpec("static").store_settings() == {"backend": "static"}  # the default is no setting
    assert backends.BackendSpec("sdpa").options == backends.BackendOptions()
    with pytest.raises(ConfigError, match="takes options of StaticOptions"):
        backends.BackendSpec("static", options=backends.BackendOptions())
    with pytest.raises(ConfigError, match="inside the options"):
        backends.BackendSpec("static", options=backends.StaticOptions(), compile_kernels=False)
    with pytest.raises(ConfigError, match="compile_kernels is True, False or None"):
        backends.StaticOptions(compile_kernels="yes")
    with pytest.raises(AttributeError):
        backends.BackendSpec("sdpa").decode_attention  # noqa: B018 (an option another backend has)
    # the command line's table of options is the classes' own
    from dysco_interp.decoding.choices import BACKEND_OPTIONS

    for name, cls in backends.REGISTRY.items():
        if name in BACKEND_OPTIONS:
            assert BACKEND_OPTIONS[name] == tuple(f.name for f in dataclasses.fields(cls.Options)), name


def test_every_backend_has_one_interface_and_refuses_the_same_things(tiny_llama):
    heads = heads_for(tiny_llama)
    n_layers, n_heads = tiny_llama.spec.n_layers, tiny_llama.spec.n_heads
    ids = torch.randint(20, 500, (1, 12), generator=torch.Generator().manual_seed(5))
    for name in backends.BACKENDS:
        b = backends.make_backend(tiny_llama, name)
        assert isinstance(b, backends.Backend) and b.name == name
        state = b.prefill(ids[:, :-1], None)
        out = b.run(state, ids[:, -1], reading(heads))
        assert isinstance(out, backends.StepOutput) and out.logits is not None and out.attention is not None
        bad = {
            "outside the model": PassPlan(reads=(Read(((n_layers, 0),)),)),
            "outside the model (": PassPlan(reads=(Read(((0, n_heads),)),)),
            "no values": PassPlan(bias=Bias(range(n_layers))),
            "must be": biased(tiny_llama, torch.zeros(1, 1, 1, 3)),
            "PassPlan": "plain",
        }
        for message, plan in bad.items():
            with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
                b.run(state, ids[:, -1], plan)
        assert state.n_keys == 12  # a refused pass leaves the state as it was
        # a NaN bias is found where the caller waits for the device anyway (the decode loop: its records)
        b.run(state, ids[:, -1], biased(tiny_llama, torch.full((1, 1, 1, state.n_keys + 1), float("nan"))))
        with pytest.raises(ConfigError, match="NaN"):
            b.check_faults()
        b.check_faults()  # reported once
        # checked behind the pass, a broken bias is still found after later passes with good ones
        b.run(state, ids[:, -1], biased(tiny_llama, torch.full((1, 1, 1, state.n_keys + 1), float("inf"))))
        for _ in range(2):
            b.run(state, ids[:, -1], biased(tiny_llama, torch.zeros(1, 1, 1, state.n_keys + 1)))
        with pytest.raises(ConfigError, match="NaN or \\+inf"):
            b.check_faults()
    with pytest.raises(ConfigError, match="empty"):
        Bias(())
    for name in ("bridge", "sdpa"):
        with pytest.raises(ConfigError, match="CUDA graphs"):
            backends.make_backend(tiny_llama, name, graphs=True)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="CUDA device"):
            backends.make_backend(tiny_llama, "static", graphs=True)


@pytest.mark.parametrize("style", STYLES)
def test_the_llama_family_prefills_in_chunks_through_the_written_out_layers(style):
    model = tiny_model(style)
    ids = torch.randint(20, 500, (2, 50), generator=torch.Generator().manual_seed(3))
    layers = range(model.spec.n_layers)
    # none; a temperature (UniAttnS); one on some heads of some layers with log-n growth past 20 keys
    for scale in (None, Scale(layers, temperature=0.5), Scale([1, 2], heads=[(1, 0), (2, 3)], temperature=0.8,
                                                               log_n=20)):
        plan = PassPlan(scale=scale)
        static = backends.make_backend(model, "static")
        assert (static.decoder is None) == (style == "gemma3")  # sliding windows take the transformers forward
        ours = static.prefill(ids, None, chunk_size=7, scale=scale)  # seven chunks, the last one short
        ref = backends.make_backend(model, "sdpa").prefill(ids, None, chunk_size=50, scale=scale)
        assert ours.n_keys == ref.n_keys == 50
        for layer in range(model.spec.n_layers):
            if ref.cache.layers[layer].keys.shape[2] < 50:  # a sliding layer's cache keeps its window only
                continue
            keys, values = ours.cache.buffers[layer]
            torch.testing.assert_close(keys[:, :, :50], ref.cache.layers[layer].keys, atol=2e-5, rtol=1e-4)
            torch.testing.assert_close(values[:, :, :50], ref.cache.layers[layer].values, atol=2e-5, rtol=1e-4)
        # the first decoding step reads those buffers: its logits are the SDPA backend's
        token = torch.tensor([77, 78])
        torch.testing.assert_close(static.run(ours, token, plan).logits,
                                   backends.make_backend(model, "sdpa").run(ref, token, plan).logits,
                                   atol=2e-5, rtol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("style", ["llama", "qwen2", "qwen3"])
def test_on_a_gpu_the_split_prefill_is_as_close_to_float32_as_the_single_call(style, monkeypatch):
    """In half precision (compiled pieces, fused kernels): each layer's keys and values are as near
    a float32 prefill's as those of one lower-right causal call per chunk."""
    from dysco_interp.decoding.backends import fused_decoder, prefill_attention

    ids = torch.randint(20, 500, (2, 50), generator=torch.Generator().manual_seed(3)).cuda()
    exact = backends.make_backend(tiny_model(style, device="cuda"), "sdpa").prefill(ids, None, chunk_size=50)
    half = backends.make_backend(tiny_model(style, device="cuda", dtype=torch.float16), "static")
    half.prefill(ids, None, chunk_size=7)  # prefill compiles its pieces from a shape's second prefill on
    split = half.prefill(ids, None, chunk_size=7)
    monkeypatch.setattr(fused_decoder, "chunk_attention", prefill_attention.single_call)
    single = half.prefill(ids, None, chunk_size=7)
    for layer in range(1, len(exact.cache.layers)):
        for i, ref in enumerate((exact.cache.layers[layer].keys, exact.cache.layers[layer].values)):
            errors = [(state.cache.buffers[layer][i][:, :, :50].float() - ref).abs().max().item()
                      for state in (split, single)]
            assert errors[0] <= 1.5 * errors[1] + 2e-3, (layer, i, errors)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("method", ["dysco", "dysco-reuse", "dysco-lagged", "dysco-sparse"])
def test_a_dysco_step_on_the_static_backend_never_waits_for_the_device(method):
    import dysco_interp.decoding.baselines  # noqa: F401  (registers dysco-lagged and dysco-sparse)
    from dysco_interp.decoding.loop import Stepper
    from dysco_interp.decoding.prompts import PromptBatch

    model = tiny_model("qwen3", device="cuda")
    ids = torch.randint(20, 500, (1, 64), generator=torch.Generator().manual_seed(5))
    backend = backends.make_backend(model, "static")
    state = backend.prefill(ids[:, :60].cuda(), None, reserve=8)
    stepper = Stepper(backend, DecodingConfig(method=method, params={"select_p": 0.7}),
                      PromptBatch.from_ids(ids[:, :60]), heads=heads_for(model))
    stepper.relevance = torch.full((1, 60), 1 / 60, device="cuda")
    for i in range(3):  # the first steps capture their graphs; the last one replays them
        tokens = ids[:, 60 + i].cuda()
        if i == 2:
            torch.cuda.set_sync_debug_mode("error")  # any host synchronisation raises
        try:
            stepper.method.step(lambda plan, tokens=tokens: backend.run(state, tokens, plan), state.n_keys + 1)
        finally:
            torch.cuda.set_sync_debug_mode("default")


def test_a_qrhead_in_the_last_layer_leaves_the_one_pass_variant_only_the_final_norm(tiny_of):
    model = tiny_of("qwen3")
    heads = heads_for(model, pairs=((model.spec.n_layers - 1, 1), (1, 0)))
    configs = {"reuse": METHODS["reuse"], "dysco": METHODS["dysco"]}
    out = {b: generate_batch(model, [PROMPT], configs, heads, backend=b) for b in ("sdpa", "static")}
    for name in configs:
        assert out["static"][name][0].tokens == out["sdpa"][name][0].tokens, name
        assert selections(out["static"][name][0]) == selections(out["sdpa"][name][0]), name


def test_a_backend_spec_carries_the_backend_and_its_options_as_one_value(tiny_llama):
    spec = backends.BackendSpec("static", decode_attention="float32")
    assert backends.BackendSpec.of(spec) is spec
    assert backends.BackendSpec.of("static", decode_attention="float32") == spec
    assert spec.store_settings() == {"backend": "static", "decode_attention": "float32"}
    assert backends.BackendSpec("static", decode_attention="sdpa").store_settings() == {"backend": "static"}
    assert backends.BackendSpec("sdpa").max_batch is None and backends.BackendSpec().runs_hooks
    by_spec = generate_batch(tiny_llama, [PROMPT], METHODS, heads_for(tiny_llama), backend=spec)
    by_name = generate_batch(tiny_llama, [PROMPT], METHODS, heads_for(tiny_llama), backend="static",
                             decode_attention="float32")
    for name in METHODS:
        assert by_spec[name][0].tokens == by_name[name][0].tokens
    for bad, message in [(lambda: backends.BackendSpec("flash"), "unknown backend"),
                         (lambda: backends.BackendSpec("sdpa", decode_attention="float32"), "decode_attention"),
                         (lambda: backends.BackendSpec("sdpa", compile_kernels=True), "compile_kernels"),
                         (lambda: backends.BackendSpec("bridge", graphs=True), "CUDA graphs"),
                         (lambda: backends.BackendSpec.of(spec, decode_attention="sdpa"), "inside the BackendSpec")]:
        with pytest.raises(ConfigError, match=message):
            bad()


def test_a_piece_the_compiler_refuses_to_compile_again_runs_as_written(monkeypatch):
    """Past torch's limit of compiled variants of a function, a fused piece runs uncompiled (said
    once) instead of failing the step."""
    from torch._dynamo.exc import FailOnRecompileLimitHit

    from dysco_interp.decoding.backends import fused_decoder

    monkeypatch.setattr(fused_decoder, "REFUSED", set())
    calls = []

    def refusing(*args):
        calls.append("compiled")
        raise FailOnRecompileLimitHit("recompile_limit reached with fullgraph=True\nmore")

    def silu_mul(gate, up):
        calls.append("eager")
        return fused_decoder.silu_mul(gate, up)

    piece = fused_decoder.past_recompiles(refusing, silu_mul)
    gate, up = torch.randn(3, 5), torch.randn(3, 5)
    with pytest.warns(RuntimeWarning, match=r"compiled silu_mul for as many .*recompile_limit"):
        torch.testing.assert_close(piece(gate, up), fused_decoder.silu_mul(gate, up), rtol=0, atol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        piece(gate, up)
    assert calls == ["compiled", "eager", "compiled", "eager"]
    ok = fused_decoder.past_recompiles(lambda *args: "compiled", silu_mul)
    assert ok(gate, up) == "compiled"
