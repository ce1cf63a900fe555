"""DySCO's TransformerLens hooks on tiny models of every style (Gemma-3 has sliding layers)."""

import pytest
import torch

from dysco_interp.decoding import runtime
from dysco_interp.decoding.backends.bridge_hooks import BiasWriter, LogitScale, RelevanceReader
from dysco_interp.decoding.relevance import aggregate_heads, scaling_bias
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet
from dysco_interp.hooks import is_sliding, pattern_name, scores_name

N = 30  # keys at the decode step: longer than the Gemma-style window (16)


def random_ids(model, n, seed=0, batch=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(20, len(model.tokenizer), (batch, n), generator=gen)


def prefilled(model, seed=0, batch=1):
    """Ids of N tokens and a cache holding the first N - 1."""
    ids = random_ids(model, N, seed, batch)
    cache, _ = runtime.prefill(model, ids[:, :-1])
    return ids, cache


@torch.inference_mode()
def frozen_logits(model, cache, token, hooks=()):
    """A full forward of the current token that does not write the cache."""
    out = model.bridge.run_with_hooks(token, past_key_values=runtime.FrozenCache(cache), fwd_hooks=list(hooks))
    return out[:, -1].float()


def recorder(store, tag):
    def fn(t, hook):
        store[(tag, int(hook.name.split(".")[1]))] = t.detach().clone()

    return fn


def visible(model, layer, n=N):
    return min(n, model.spec.sliding_window) if is_sliding(model.spec, layer) else n


def some_selection(seed=0):
    gen = torch.Generator().manual_seed(seed)
    selected = torch.rand(1, N, generator=gen) < 0.3
    selected[0, 0] = True  # outside every sliding window
    selected[0, N - 5] = True  # inside it
    return selected


# --------------------------------------------------------------------------- bias writer


def test_bias_gives_softmax_of_scores_plus_bias(tiny):
    ids, cache = prefilled(tiny)
    bias = scaling_bias(some_selection(), beta=3.0)
    writer = BiasWriter(tiny.spec)
    writer.set_bias(bias)
    seen: dict = {}
    layers = range(tiny.spec.n_layers)
    # a user's hooks on the same point, before and after ours: both run, in order
    hooks = [(scores_name(i), recorder(seen, "before")) for i in layers]
    hooks += writer.hooks()
    hooks += [(scores_name(i), recorder(seen, "after")) for i in layers]
    hooks += [(pattern_name(i), recorder(seen, "pattern")) for i in layers]
    frozen_logits(tiny, cache, ids[:, -1:], hooks)
    for i in layers:
        before, after, pattern = seen[("before", i)], seen[("after", i)], seen[("pattern", i)]
        width = visible(tiny, i)
        assert before.shape[-1] == width
        part = bias[..., N - width :]
        assert after.dtype == torch.float32
        assert torch.equal(after, before.float() + part)
        torch.testing.assert_close(pattern, torch.softmax(before.float() + part, dim=-1), atol=1e-6, rtol=1e-5)
    if tiny.spec.sliding_window is not None:
        # position N-5 is boosted in the window; position 0 only in full layers
        assert seen[("after", 0)][..., -5].sub(seen[("before", 0)][..., -5]).eq(bias[0, 0, 0, N - 5]).all()


def test_bias_matches_an_independent_computation(tiny):
    # Bias on the last layer only: earlier layers are untouched, so the last layer's
    # unbiased pattern p gives the expected biased one as softmax(log p + bias).
    ids, cache = prefilled(tiny, seed=1)
    last = tiny.spec.n_layers - 1
    plain: dict = {}
    frozen_logits(tiny, cache, ids[:, -1:], [(pattern_name(last), recorder(plain, "p"))])
    bias = scaling_bias(some_selection(1), beta=2.0)
    writer = BiasWriter(tiny.spec, layers=[last])
    writer.set_bias(bias)
    biased: dict = {}
    logits = frozen_logits(tiny, cache, ids[:, -1:], writer.hooks() + [(pattern_name(last), recorder(biased, "p"))])
    p = plain[("p", last)]
    expected = torch.softmax(p.double().log() + bias[..., N - p.shape[-1] :].double(), dim=-1)
    torch.testing.assert_close(biased[("p", last)].double(), expected, atol=1e-6, rtol=1e-5)
    assert (biased[("p", last)] - p).abs().max() > 1e-3  # the bias did something
    assert not torch.equal(logits, frozen_logits(tiny, cache, ids[:, -1:]))


def test_beta_one_changes_nothing(tiny):
    ids, cache = prefilled(tiny, seed=2)
    vanilla = frozen_logits(tiny, cache, ids[:, -1:])
    writer = BiasWriter(tiny.spec)
    writer.set_bias(scaling_bias(some_selection(), beta=1.0))
    assert torch.equal(frozen_logits(tiny, cache, ids[:, -1:], writer.hooks()), vanilla)
    writer.set_bias(None)
    assert torch.equal(frozen_logits(tiny, cache, ids[:, -1:], writer.hooks()), vanilla)


def test_bias_of_the_wrong_length_is_refused(tiny_llama):
    ids, cache = prefilled(tiny_llama)
    writer = BiasWriter(tiny_llama.spec)
    writer.set_bias(torch.zeros(1, 1, 1, N + 1))
    with pytest.raises(ValueError, match="announced"):
        frozen_logits(tiny_llama, cache, ids[:, -1:], writer.hooks())
    with pytest.raises(ValueError, match=r"batch, 1 or n_heads, 1, n_keys"):
        writer.set_bias(torch.zeros(1, N))


# --------------------------------------------------------------------------- reader

HEADS = HeadSet([(2, 1), (0, 3), (1, 0), (2, 2)])  # layers 0 and 1 slide on Gemma-style models


def test_reader_row_equals_mean_of_full_forward_rows(tiny):
    ids, cache = prefilled(tiny, seed=3)
    reader = RelevanceReader(HEADS, tiny.spec)
    user_calls = []
    reader.set_length(N)
    hooks = reader.hooks() + [(pattern_name(0), lambda t, hook: user_calls.append(t.shape))]
    runtime.partial_step(tiny, cache, ids[:, -1:], stop_at_layer=reader.max_layer + 1, hooks=hooks)
    assert len(user_calls) == 1  # a user's hook on the same point still runs
    got = reader.attention()
    with torch.inference_mode():
        _, full = tiny.bridge.run_with_cache(ids)
    rows = [full[pattern_name(layer)][0, head, -1, :] for layer, head in HEADS]
    expected = torch.stack(rows).mean(0)
    assert got.shape == (1, N) and got.dtype == torch.float32
    torch.testing.assert_close(got[0], expected.float(), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(got.sum(-1), torch.ones(1), atol=1e-5, rtol=0)
    # only the chosen heads and the last query row are kept
    assert {layer: tuple(r.shape) for layer, r in reader.rows.items()} == {
        0: (1, 1, visible(tiny, 0)),
        1: (1, 1, visible(tiny, 1)),
        2: (1, 2, N),
    }


def test_sliding_rows_land_on_absolute_positions(tiny_of):
    gemma = tiny_of("gemma3")
    window = gemma.spec.sliding_window
    ids, cache = prefilled(gemma, seed=4)
    reader = RelevanceReader(HeadSet([(0, 3), (1, 0)]), gemma.spec)  # both sliding layers
    reader.set_length(N)
    runtime.partial_step(gemma, cache, ids[:, -1:], stop_at_layer=2, hooks=reader.hooks())
    with torch.inference_mode():
        _, full = gemma.bridge.run_with_cache(ids)
    for layer, head in [(0, 3), (1, 0)]:
        row = reader.rows[layer]
        assert row.shape[-1] == window
        placed = aggregate_heads([row], N)[0]
        full_row = full[pattern_name(layer)][0, head, -1].float()
        assert full_row[: N - window].abs().max() < 1e-6  # the full pass agrees: outside the window
        torch.testing.assert_close(placed, full_row, atol=1e-5, rtol=1e-4)
        assert placed[: N - window].eq(0).all() and placed[N - window :].sum() == pytest.approx(1, abs=1e-5)


def test_reader_is_per_batch_row(tiny_llama):
    ids, cache = prefilled(tiny_llama, seed=5, batch=2)
    reader = RelevanceReader(HEADS, tiny_llama.spec)
    reader.set_length(N)
    runtime.partial_step(tiny_llama, cache, ids[:, -1:], stop_at_layer=3, hooks=reader.hooks())
    both = reader.attention()
    for b in range(2):
        one_ids, one_cache = ids[b : b + 1], runtime.prefill(tiny_llama, ids[b : b + 1, :-1])[0]
        reader.set_length(N)
        runtime.partial_step(tiny_llama, one_cache, one_ids[:, -1:], stop_at_layer=3, hooks=reader.hooks())
        torch.testing.assert_close(both[b : b + 1], reader.attention(), atol=1e-6, rtol=1e-5)
    assert not torch.allclose(both[0], both[1])


def test_reader_refuses_a_wrong_length_or_missing_call(tiny):
    ids, cache = prefilled(tiny, seed=6)
    reader = RelevanceReader(HEADS, tiny.spec)
    with pytest.raises(RuntimeError, match="set_length"):
        runtime.partial_step(tiny, cache, ids[:, -1:], stop_at_layer=3, hooks=reader.hooks())
    reader.set_length(N + 1)  # layer 2 is full attention: it must see every key
    with pytest.raises(ValueError, match="announced"):
        runtime.partial_step(tiny, cache, ids[:, -1:], stop_at_layer=3, hooks=reader.hooks())
    reader.set_length(N)
    runtime.partial_step(tiny, cache, ids[:, -1:], stop_at_layer=2, hooks=reader.hooks())
    with pytest.raises(RuntimeError, match="stop_at_layer=3"):
        reader.attention()


def test_reader_rejects_heads_outside_the_model(tiny_llama):
    with pytest.raises(ConfigError, match="outside the model"):
        RelevanceReader(HeadSet([(0, 4)]), tiny_llama.spec)
    with pytest.raises(ConfigError, match="outside the model"):
        RelevanceReader(HeadSet([(4, 0)]), tiny_llama.spec)


# --------------------------------------------------------------------------- temperature


def test_temperature_one_is_identity(tiny):
    ids, cache = prefilled(tiny, seed=7)
    temp = LogitScale.temperature(tiny.spec, 1.0)
    assert torch.equal(frozen_logits(tiny, cache, ids[:, -1:], temp.hooks()), frozen_logits(tiny, cache, ids[:, -1:]))


def test_temperature_divides_scores(tiny):
    ids, cache = prefilled(tiny, seed=8)
    temp = LogitScale.temperature(tiny.spec, 0.5)
    seen: dict = {}
    layers = range(tiny.spec.n_layers)
    hooks = [(scores_name(i), recorder(seen, "before")) for i in layers] + temp.hooks()
    hooks += [(pattern_name(i), recorder(seen, "pattern")) for i in layers]
    logits = frozen_logits(tiny, cache, ids[:, -1:], hooks)
    for i in layers:
        expected = torch.softmax(seen[("before", i)] / 0.5, dim=-1)
        torch.testing.assert_close(seen[("pattern", i)], expected, atol=1e-6, rtol=1e-5)
    assert not torch.allclose(logits, frozen_logits(tiny, cache, ids[:, -1:]), atol=1e-3)


def test_temperature_in_prefill_matches_a_full_forward(tiny):
    ids = random_ids(tiny, 40, seed=9)
    temp = LogitScale.temperature(tiny.spec, 1.7)
    # chunks shorter than the prompt: the hook also sees the masked (causal, sliding) scores
    _, last = runtime.prefill(tiny, ids, chunk_size=12, hooks=temp.hooks())
    with torch.inference_mode():
        full = tiny.bridge.run_with_hooks(ids, fwd_hooks=temp.hooks())[:, -1].float()
        vanilla = tiny.bridge(ids)[:, -1].float()
    torch.testing.assert_close(last, full, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(last, vanilla, atol=1e-3)


@pytest.mark.parametrize("tau", [0, -1.0, float("inf"), float("nan"), None])
def test_bad_temperature_is_refused(tiny_llama, tau):
    with pytest.raises(ConfigError, match="temperature"):
        LogitScale.temperature(tiny_llama.spec, tau)


def test_the_old_temperature_hook_still_works_for_one_release(tiny_llama):
    from dysco_interp.decoding.backends.bridge_hooks import AttentionTemperature

    with pytest.warns(DeprecationWarning, match="LogitScale"):
        temp = AttentionTemperature(tiny_llama.spec, 0.5)
    assert temp.scale.temperature == 0.5 and len(temp.hooks()) == tiny_llama.spec.n_layers
    with pytest.raises(ConfigError, match="tau"), pytest.warns(DeprecationWarning):
        AttentionTemperature(tiny_llama.spec, 0)


# --------------------------------------------------------------------------- together


def test_hooks_work_as_a_context_and_leave_nothing_behind(tiny_llama):
    ids, cache = prefilled(tiny_llama, seed=10)
    vanilla = frozen_logits(tiny_llama, cache, ids[:, -1:])
    writer = BiasWriter(tiny_llama.spec)
    writer.set_bias(scaling_bias(some_selection(), beta=4.0))
    with tiny_llama.bridge.hooks(fwd_hooks=writer.hooks()):
        calls = []
        boosted = frozen_logits(tiny_llama, cache, ids[:, -1:], [(scores_name(1), lambda t, hook: calls.append(1))])
    assert calls == [1] and not torch.allclose(boosted, vanilla, atol=1e-3)
    assert torch.equal(frozen_logits(tiny_llama, cache, ids[:, -1:]), vanilla)


def _mini_dysco(model, ids, n_steps, beta, top_p=0.5, top_k=4):
    """A few greedy DySCO steps on the public API (the decode loop's shape, simplified)."""
    from dysco_interp.decoding.relevance import select_keys, update_relevance

    cache, logits = runtime.prefill(model, ids[:, :-1])
    reader, writer = RelevanceReader(HEADS, model.spec), BiasWriter(model.spec)
    exclude = torch.zeros(1, ids.shape[1], dtype=torch.bool)
    exclude[0, :3] = True  # pretend the first three prompt tokens are template
    token, r, out = ids[:, -1:], None, []
    for _ in range(n_steps):
        n_keys = runtime.cache_length(cache) + 1
        reader.set_length(n_keys)
        runtime.partial_step(model, cache, token, stop_at_layer=reader.max_layer + 1, hooks=reader.hooks())
        r = update_relevance(reader.attention(), r, decay=0.75)
        torch.testing.assert_close(r.sum(-1), torch.ones(1), atol=1e-5, rtol=0)
        ex = torch.nn.functional.pad(exclude, (0, n_keys - exclude.shape[1]))
        sel = select_keys(r, top_p, top_k, exclude=ex)
        assert int(sel.count) <= top_k and not (sel.mask & ex).any()
        writer.set_bias(scaling_bias(sel.mask, beta))
        logits = runtime.step(model, cache, token, hooks=writer.hooks())
        token = logits.argmax(-1, keepdim=True)
        out.append(int(token))
    return out


def test_dysco_steps_compose_and_beta_one_is_vanilla(tiny):
    ids = random_ids(tiny, N, seed=11)
    vanilla_cache, _ = runtime.prefill(tiny, ids[:, :-1])
    token, vanilla = ids[:, -1:], []
    for _ in range(4):
        token = runtime.step(tiny, vanilla_cache, token).argmax(-1, keepdim=True)
        vanilla.append(int(token))
    assert _mini_dysco(tiny, ids, 4, beta=1.0) == vanilla
    _mini_dysco(tiny, ids, 4, beta=3.0)  # runs across a growing cache (and windows) without errors
