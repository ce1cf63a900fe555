"""DySCO's invariants and a hand-computed step, on tiny random models of every style."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dysco_interp.decoding import runtime
from dysco_interp.decoding.backends import DecodeState, make_backend
from dysco_interp.decoding.backends.bridge_hooks import BiasWriter
from dysco_interp.decoding.config import PRESETS, SHARED_FIELDS, DecodingConfig, preset
from dysco_interp.decoding.loop import Stepper, compare_methods, dysco_generate, generate, generate_batch
from dysco_interp.decoding.prompts import PromptBatch, prepare_prompt
from dysco_interp.decoding.reference import reference_generate
from dysco_interp.decoding.relevance import scaling_bias
from dysco_interp.errors import ConfigError, ContextLengthError
from dysco_interp.heads import HeadSet, HeadSetError
from dysco_interp.models.tiny import tiny_model

PROMPT = (
    "You can travel from Paris to Berlin by train. Rome is quiet. " * 6 + "Please give a route from Paris to Berlin."
)
N_NEW = 16


def heads_for(model, pairs=((1, 0), (2, 3), (1, 2))):
    s = model.spec
    return HeadSet(list(pairs), model=s.name, n_layers=s.n_layers, n_heads=s.n_heads, n_kv_heads=s.n_kv_heads)


def stepper_for(model, config, heads, prepared, backend="bridge"):
    return Stepper(make_backend(model, backend), config, PromptBatch.of([prepared], 0), heads=heads)


def cfg(method="dysco", **kw):
    # these tests pin the paper's algorithm: its preset, not the package's default budget;
    # `kw` are shared settings and the method's parameters (by their Python names)
    kw.setdefault("max_new_tokens", N_NEW)
    shared = {name: kw.pop(name) for name in list(kw) if name in SHARED_FIELDS}
    return preset("paper", method=method, params=kw, **shared)


def test_beta_one_reproduces_vanilla_and_vanilla_equals_plain_greedy(tiny):
    heads = heads_for(tiny)
    out = compare_methods(
        tiny, PROMPT, {"vanilla": cfg("vanilla"), "beta1": cfg(beta=1.0), "static1": cfg("dysco-static", beta=1.0),
                      "reuse1": cfg("dysco-reuse", beta=1.0)}, heads
    )
    plain = reference_generate(tiny, PROMPT, max_new_tokens=N_NEW)
    ref = tiny.load_reference_hf("eager")
    with torch.inference_mode():
        hf = ref.generate(
            torch.tensor([plain.prompt_ids]), do_sample=False, max_new_tokens=N_NEW,
            pad_token_id=tiny.tokenizer.pad_token_id,
        )[0, len(plain.prompt_ids) :].tolist()
    assert out["vanilla"].tokens == plain.tokens == hf
    assert out["beta1"].tokens == out["vanilla"].tokens
    assert out["static1"].tokens == out["vanilla"].tokens
    assert out["reuse1"].tokens == out["vanilla"].tokens
    assert len(set(plain.tokens)) > 1  # the model is not degenerate, so equality means something


def test_strong_scaling_changes_the_output(tiny_llama):
    heads = heads_for(tiny_llama)
    out = compare_methods(tiny_llama, PROMPT, {"vanilla": cfg("vanilla"), "dysco": cfg(beta=20.0, select_p=0.5)}, heads)
    assert out["dysco"].tokens != out["vanilla"].tokens


def test_selection_invariants_along_a_run(tiny):
    heads = heads_for(tiny)
    prepared = prepare_prompt(tiny, PROMPT)
    res = generate(tiny, PROMPT, cfg(select_k=5, select_p=0.99, record_positions=True), prepared=prepared, heads=heads)
    template = prepared.template()
    steps = [s for s in res.trace.steps if s.n_selected is not None]
    assert steps and len(steps) == len(res.trace.steps) - 7  # all but the T_w - 1 context warm-up tokens
    for s in steps:
        assert 0 < s.n_selected <= 5 and len(s.selected) == s.n_selected
        assert not any(template[p] for p in s.selected if p < len(template))
        assert all(p <= s.position for p in s.selected)


def test_relevance_sums_to_one_and_cache_equals_one_biased_pass(tiny):
    heads = heads_for(tiny)
    prepared = prepare_prompt(tiny, PROMPT)
    ids = prepared.ids
    cache, _ = runtime.prefill(tiny, ids[:-3])
    state = DecodeState(cache, len(ids) - 3)
    stepper = stepper_for(tiny, cfg(beta=3.0, select_p=0.6), heads, prepared)
    for pos in range(len(ids) - 3, len(ids) - 1):
        before = runtime.clone_cache(cache)
        logits, _ = stepper.step(state, torch.tensor([ids[pos]]), "intervention-warmup")
        assert stepper.relevance.dtype == torch.float32
        assert math.isclose(float(stepper.relevance.sum()), 1.0, abs_tol=1e-5)
        assert stepper.relevance.shape[-1] == pos + 1
        # one biased pass with the same selection, on the cache as it was, gives the same cache and logits
        mask = stepper.select(pos + 1).mask
        writer = BiasWriter(tiny.spec)
        writer.set_bias(scaling_bias(mask, 3.0))
        again = runtime.step(tiny, before, torch.tensor([[ids[pos]]]), writer.hooks())
        torch.testing.assert_close(again, logits, atol=0, rtol=0)
        for a, b in zip(before.layers, cache.layers):
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_static_mode_keeps_its_set(tiny_llama):
    heads = heads_for(tiny_llama)
    res = generate(tiny_llama, PROMPT, cfg("dysco-static", beta=3.0, select_p=0.7, record_positions=True), heads=heads)
    sets = [tuple(s.selected) for s in res.trace.steps if s.selected is not None]
    assert len(sets) > 5 and len(set(sets)) == 1
    first_warm = min(s.position for s in res.trace.steps)
    assert max(sets[0]) < first_warm + 8  # chosen from relevance after the context warm-up


def test_random_heads_are_seeded_and_differ_from_the_qrheads(tiny_llama):
    heads = heads_for(tiny_llama)
    a = generate(tiny_llama, PROMPT, cfg("dysco-random", head_seed=3), heads=heads)
    b = generate(tiny_llama, PROMPT, cfg("dysco-random", head_seed=3), heads=heads)
    c = generate(tiny_llama, PROMPT, cfg("dysco-random", head_seed=4), heads=heads)
    assert a.trace.heads == b.trace.heads and a.tokens == b.tokens
    assert a.trace.heads != c.trace.heads and len(a.trace.heads) == len(heads)
    assert set(a.trace.heads) != set(heads)


def test_uniattns_tau_one_is_vanilla_and_other_tau_changes_prefill(tiny_llama):
    out = compare_methods(
        tiny_llama, PROMPT,
        {"vanilla": cfg("vanilla"), "uni1": cfg("uniattns", tau=1.0), "uni": cfg("uniattns", tau=0.3)},
    )
    assert out["uni1"].tokens == out["vanilla"].tokens
    assert out["uni"].tokens != out["vanilla"].tokens


def test_trace_reports_named_spans(tiny_llama):
    heads = heads_for(tiny_llama)
    res = generate(tiny_llama, PROMPT, cfg(), spans={"a": (10, 20), "b": (30, 40)}, heads=heads)
    tops = [s.top_spans for s in res.trace.steps]
    assert all(t is not None and {n for n, _ in t} == {"a", "b"} for t in tops)
    assert all(t[0][1] >= t[1][1] >= 0 for t in tops)


def test_hand_computed_step_on_a_two_layer_model():
    """Selection and biased logits of one step, recomputed independently in numpy and plain HF."""
    model = tiny_model("llama", seed=5, num_hidden_layers=2)
    heads = heads_for(model, ((0, 1), (1, 3)))
    ids = torch.randint(20, 500, (1, 24), generator=torch.Generator().manual_seed(1))
    n = ids.shape[1]
    beta, decay, top_p, top_k = 2.5, 0.75, 0.5, 4
    r_prev = np.zeros(n - 1, dtype=np.float64)
    r_prev[[2, 7, 11]] = [0.5, 0.3, 0.2]

    # independent: the known attention pattern from an uncached full forward
    with torch.inference_mode():
        _, acts = model.bridge.run_with_cache(ids)
    rows = [acts[f"blocks.{layer}.attn.hook_pattern"][0, h, -1].double().numpy() for layer, h in heads]
    a = np.mean(rows, axis=0)
    r = (a + decay * np.append(r_prev, 0.0)) / (1 + decay)
    order = sorted(range(n), key=lambda i: (-r[i], i))
    chosen, mass = [], 0.0
    for i in order:
        if chosen and mass + r[i] > top_p + 1e-7:
            break
        chosen.append(i)
        mass += r[i]
    chosen = sorted(chosen[:top_k])

    # ours: prefill, then one full DySCO step from that relevance
    cache, _ = runtime.prefill(model, ids[:, :-1])
    config = cfg(beta=beta, decay=decay, select_p=top_p, select_k=top_k, record_positions=True, template_masking="off")
    prepared = SimpleNamespace(ids=tuple(ids[0].tolist()), template=lambda mode: torch.zeros(n, dtype=torch.bool),
                               encoded=SimpleNamespace(n_generation_prompt=0))
    stepper = stepper_for(model, config, heads, prepared)
    stepper.relevance = torch.tensor(r_prev, dtype=torch.float32)[None]
    logits, (record,) = stepper.step(DecodeState(cache, n - 1), ids[0, -1:], "decode")
    assert record.selected == chosen and record.position == n - 1
    np.testing.assert_allclose(stepper.relevance[0].numpy(), r, atol=1e-6)

    # independent biased logits: a separately loaded HF model with an additive 4D mask
    ref = model.load_reference_hf("eager")
    mask = torch.full((n, n), float("-inf")).triu(1)
    boosted = chosen + [n - 1]
    mask[-1, boosted] += math.log(beta)
    with torch.inference_mode():
        expected = ref(ids, attention_mask=mask[None, None]).logits[0, -1]
    torch.testing.assert_close(logits[0], expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(params={"select_p": 0.0}), r"method 'dysco': select_p must be in \(0, 1\]"),
        (dict(params={"select_p": 1.2}), r"method 'dysco': select_p must be in \(0, 1\]"),
        (dict(params={"select_k": 0}), "method 'dysco': select_k must be an integer >= 1"),
        (dict(params={"beta": 0.0}), "method 'dysco': strength beta must be a finite number > 0"),
        (dict(params={"beta": -2.0}), "method 'dysco': strength beta must be a finite number > 0"),
        (dict(params={"decay": -0.1}), "method 'dysco': decay must be a finite number >= 0"),
        (dict(warmup=-1), "warmup"),
        (dict(method="fancy"), "unknown method"),
        (dict(method="uniattns", params={"tau": 0.0}), "method 'uniattns': tau must be a finite number > 0"),
        (dict(max_new_tokens=0), "max_new_tokens"),
    ],
)
def test_bad_parameters_are_refused(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        DecodingConfig(**kwargs)


def test_presets_carry_the_papers_values():
    paper = PRESETS["paper"].params
    assert (paper.select_p, paper.select_k, paper.beta) == (0.975, 4096, 2.0)
    assert (paper.decay, PRESETS["paper"].warmup) == (0.75, 8)
    strong = PRESETS["paper-strong"].params
    assert (strong.select_p, strong.select_k, strong.beta) == (0.95, 8192, 2.5)
    q = preset("quick-check")
    assert (q.params.select_p, q.params.select_k, q.params.beta, q.max_new_tokens) == (1.0, 1024, 2.5, 128)
    with pytest.raises(ConfigError):
        preset("nope")


def test_missing_or_foreign_heads_and_long_prompts_are_refused(tiny_llama):
    with pytest.raises(ConfigError, match="head set"):
        generate(tiny_llama, PROMPT, cfg(), heads=None)
    foreign = HeadSet([(20, 3)], model="qwen2.5-coder-0.5b", n_layers=24, n_heads=14, n_kv_heads=2)
    with pytest.raises(HeadSetError):
        generate(tiny_llama, PROMPT, cfg(), heads=foreign)
    small = tiny_model("llama", max_position_embeddings=64)
    with pytest.raises(ContextLengthError):
        generate(small, PROMPT, cfg(), heads=heads_for(small))


def test_yarn_comes_from_the_config_and_combines_with_dysco():
    plain = tiny_model("qwen2", seed=2)
    yarn = tiny_model("qwen2", seed=2, yarn_factor=4.0)
    assert yarn.spec.context_length == 4 * plain.spec.context_length
    assert yarn.hf_config.rope_parameters["rope_type"] == "yarn"
    ids = torch.randint(20, 500, (1, 60), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        assert not torch.allclose(plain.bridge(ids), yarn.bridge(ids), atol=1e-4)
    heads = heads_for(yarn)
    out = compare_methods(yarn, PROMPT, {"vanilla": cfg("vanilla"), "beta1": cfg(beta=1.0)}, heads)
    assert out["beta1"].tokens == out["vanilla"].tokens == reference_generate(yarn, PROMPT, max_new_tokens=N_NEW).tokens
    ref = yarn.load_reference_hf("eager")
    with torch.inference_mode():
        hf = ref.generate(torch.tensor([out["vanilla"].prompt_ids]), do_sample=False, max_new_tokens=N_NEW,
                          pad_token_id=yarn.tokenizer.pad_token_id)
    assert out["vanilla"].tokens == hf[0, len(out["vanilla"].prompt_ids):].tolist()


@pytest.mark.parametrize("bad", [1.0, 0.5, "4", True])
def test_bad_yarn_factor_is_refused(bad):
    with pytest.raises(ConfigError, match="YaRN"):
        tiny_model("llama", yarn_factor=bad)


def test_a_prepared_prompt_serves_one_thinking_setting(tiny):
    prepared = prepare_prompt(tiny, PROMPT)
    same = compare_methods(tiny, PROMPT, {"v": cfg("vanilla")}, prepared=prepared)
    assert same["v"].tokens == compare_methods(tiny, PROMPT, {"v": cfg("vanilla")})["v"].tokens
    with pytest.raises(ConfigError, match="one enable_thinking"):
        compare_methods(tiny, PROMPT, {"a": cfg("vanilla"), "b": cfg("vanilla", enable_thinking=False)},
                        prepared=prepared)


def test_each_generated_token_is_paired_with_the_step_that_chose_it(tiny_llama):
    heads = heads_for(tiny_llama)
    res = generate(tiny_llama, PROMPT, cfg(beta=3.0, record_positions=True), heads=heads)
    pairs = res.token_steps(tiny_llama.tokenizer)
    assert [p.token for p in pairs] == res.tokens and len(res.trace.decode_steps()) == len(res.tokens) - 1
    assert pairs[0].step.phase == "intervention-warmup" and pairs[0].step.position == len(res.prompt_ids) - 1
    for previous, pair in zip(res.tokens, pairs[1:]):  # the step that fed the token before chose this one
        assert pair.step.phase == "decode" and pair.step.token == previous
    assert "".join(p.text for p in pairs) == tiny_llama.tokenizer.decode(res.tokens)
    assert all(p.step.n_selected is not None for p in pairs)


def test_python_and_the_command_line_default_to_one_preset():
    from dysco_interp.cli.app import build_parser
    from dysco_interp.cli.prepare import decoding_config
    from dysco_interp.decoding.choices import DEFAULT_PRESET

    assert DEFAULT_PRESET == "small-budget" and PRESETS[DEFAULT_PRESET] == DecodingConfig()
    for command in (["generate", "--prompt", "x"], ["evaluate", "--data", "d", "--out", "r.jsonl"]):
        args = build_parser().parse_args(command)
        assert args.preset == DEFAULT_PRESET
        assert decoding_config(args, "dysco") == DecodingConfig(max_new_tokens=args.max_new_tokens)
    assert preset("paper") != DecodingConfig()  # the paper's values are one argument away


def test_dysco_generate_and_loose_backend_options_still_work_for_one_release_with_a_notice(tiny_llama):
    heads = heads_for(tiny_llama)
    with pytest.warns(DeprecationWarning, match="dysco_generate"):
        old = dysco_generate(tiny_llama, PROMPT, heads, cfg())
    assert old.tokens == generate(tiny_llama, PROMPT, cfg(), heads=heads).tokens
    with pytest.warns(DeprecationWarning, match="BackendSpec"):
        loose = generate(tiny_llama, PROMPT, cfg(), heads=heads, backend="static", graphs=False)
    assert loose.tokens == old.tokens


def test_a_steps_record_reads_its_values_from_the_device_in_one_transfer():
    """Tokens, counts and float32 masses come back exactly as their own `tolist` gives them; None
    stays None; CPU tensors are read where they are; later writes to the tensors do not reach a
    read already made."""
    from dysco_interp.decoding.stepper import HostRead

    tokens = torch.tensor([151_935, 3])
    counts = torch.tensor([4096, 0])
    masses = torch.tensor([0.1234567, 1.0], dtype=torch.float32)
    fault = torch.tensor(5, dtype=torch.int32)
    expected = [[5.0], [151935.0, 3.0], None, [4096.0, 0.0], masses.tolist()]
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        on = [t.to(device, copy=True) for t in (fault, tokens, counts, masses)]
        read = HostRead(on[0], on[1], None, on[2], on[3])
        for t in on:
            t.add_(1)
        assert read.values() == expected, device


def free_and_forced(model, heads, prompts):
    """Vanilla and DySCO (positions and spans recorded) on a left-padded batch, free and forced."""
    configs = {"vanilla": cfg("vanilla"), "dysco": cfg(beta=3.0, record_positions=True)}
    spans = [{"a": (10, 20), "b": (30, 40)}, {"a": (5, 15)}]
    free = generate_batch(model, prompts, configs, heads, spans=spans, backend="static")
    forced = generate_batch(model, prompts, configs, heads, spans=spans, backend="static",
                            forced=[free["vanilla"][0].tokens, free["dysco"][1].tokens[:5]])
    return free, forced


def test_a_loop_that_runs_ahead_gives_what_one_that_waits_gives(tiny_llama, monkeypatch):
    """Queuing the next step before reading a token (a GPU's decode loop) changes no token, record or
    score: free decoding with rows ending on EOS at different steps, and on the budget; teacher
    forcing. Only the step after a token that ends every row on EOS is run and thrown away."""
    from dysco_interp.decoding.backends.base import Backend

    heads = heads_for(tiny_llama)
    prompts = [PROMPT, "Rome is quiet. Please give a route from Rome to Paris by train."]
    own = free_and_forced(tiny_llama, heads, prompts)[0]["vanilla"]
    # tokens that end the rows at different steps (each row's first new token from its 3rd / 7th on)
    eos = frozenset(next(t for j, t in enumerate(r.tokens) if j >= k and t not in r.tokens[:j])
                    for r, k in zip(own, (3, 7)))
    monkeypatch.setattr(type(tiny_llama), "eos_token_ids", property(lambda self: eos))
    launched = Stepper.launch
    cases = []
    for ahead in (False, True):
        monkeypatch.setattr(Backend, "runs_ahead", property(lambda self, a=ahead: a))
        runs = []

        def counted(self, *args, runs=runs, **kwargs):
            runs.append(1)
            return launched(self, *args, **kwargs)

        monkeypatch.setattr(Stepper, "launch", counted)
        cases.append((free_and_forced(tiny_llama, heads, prompts), len(runs)))
    (waited, waited_runs), (ahead, ahead_runs) = cases
    for name in ("vanilla", "dysco"):
        for kind in (0, 1):
            for a, b in zip(waited[kind][name], ahead[kind][name], strict=True):
                assert a.tokens == b.tokens and a.finished == b.finished and a.forced == b.forced
                assert [vars(s) for s in a.trace.steps] == [vars(s) for s in b.trace.steps]
    ended = [all(r.finished for r in waited[0][name]) for name in ("vanilla", "dysco")]
    assert ended[0] and len({len(r.tokens) for r in waited[0]["vanilla"]}) == 2  # by the choice of EOS
    assert ahead_runs - waited_runs == sum(ended)


def test_only_a_gpu_loop_that_no_hook_or_on_read_watches_runs_ahead(tiny_llama, monkeypatch):
    """A step thrown away at EOS must not reach the user: hooks and `on_read` would see it."""
    from dysco_interp.decoding.backends.base import Backend

    heads = heads_for(tiny_llama)
    batch = PromptBatch.of([prepare_prompt(tiny_llama, PROMPT)], 0)
    hook = ("blocks.0.attn.hook_pattern", lambda t, hook: None)

    def ahead(device: str, hooks=(), on_read=None) -> tuple[bool, bool]:
        backend: Backend = make_backend(tiny_llama, "bridge", hooks=hooks)
        stepper = Stepper(backend, cfg(), batch, heads=heads, on_read=on_read)
        with monkeypatch.context() as m:  # the model as if on a GPU, once the stepper is made
            m.setattr(type(tiny_llama), "device", property(lambda self: torch.device(device)))
            return backend.runs_ahead, stepper.runs_ahead

    assert ahead("cpu") == (False, False)
    assert ahead("cuda") == (True, True)
    assert ahead("cuda", hooks=[hook]) == (False, False)
    assert ahead("cuda", on_read=lambda step, read: None) == (True, False)
