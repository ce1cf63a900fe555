"""The shared KV-cache runtime, on tiny random models of every style."""

import pytest
import torch

from dysco_interp.decoding import runtime
from dysco_interp.decoding.reference import reference_generate
from dysco_interp.decoding.sampling import Sampler, SamplingConfig
from dysco_interp.errors import ConfigError, ContextLengthError


def random_ids(model, n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(20, len(model.tokenizer), (1, n), generator=gen)


def full_logits(model, ids):
    with torch.inference_mode():
        return model.bridge(ids).float()


def snapshot(cache):
    return [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]


def assert_cache_equal(cache, snap):
    assert len(cache.layers) == len(snap)
    for layer, (k, v) in zip(cache.layers, snap):
        assert torch.equal(layer.keys, k) and torch.equal(layer.values, v)


def test_cached_steps_equal_uncached_forward(tiny):
    # Guards the transformers 5.24 cache rename: an ignored cache would attend only to itself.
    ids = random_ids(tiny, 40)
    full = full_logits(tiny, ids)
    cache, last = runtime.prefill(tiny, ids[:, :36])
    torch.testing.assert_close(last, full[:, 35], atol=1e-4, rtol=1e-4)
    for pos in range(36, 40):
        logits = runtime.step(tiny, cache, ids[:, pos : pos + 1])
        torch.testing.assert_close(logits, full[:, pos], atol=1e-4, rtol=1e-4)
    assert runtime.cache_length(cache) == 40


@pytest.mark.parametrize("with_hooks", [False, True], ids=["sdpa-twin", "bridge-chunked"])
def test_chunked_prefill_matches_full_forward(tiny, with_hooks):
    # Chunks (48) are longer than the Gemma-style sliding window (16), so windows cross chunks.
    ids = random_ids(tiny, 200, seed=1)
    full = full_logits(tiny, ids)
    seen = []
    hooks = [("blocks.0.attn.hook_pattern", lambda t, hook: seen.append(t.shape))] if with_hooks else []
    cache, last = runtime.prefill(tiny, ids, chunk_size=48, hooks=hooks)
    torch.testing.assert_close(last, full[:, -1], atol=1e-4, rtol=1e-4)
    assert last.argmax() == full[0, -1].argmax()
    if with_hooks:
        # never an n x n score matrix: at most chunk x (cached + chunk)
        assert [s[-2] for s in seen] == [48, 48, 48, 48, 8]
    # the cache continues correctly
    nxt = random_ids(tiny, 1, seed=2)
    logits = runtime.step(tiny, cache, nxt)
    torch.testing.assert_close(logits, full_logits(tiny, torch.cat([ids, nxt], 1))[:, -1], atol=1e-4, rtol=1e-4)


def test_partial_step_leaves_cache_and_next_logits_unchanged(tiny):
    ids = random_ids(tiny, 30, seed=3)
    cache, _ = runtime.prefill(tiny, ids[:, :-1])
    snap = snapshot(cache)
    patterns = {}
    hooks = [
        (f"blocks.{i}.attn.hook_pattern", lambda t, hook: patterns.__setitem__(hook.name, t.clone()))
        for i in range(tiny.spec.n_layers)
    ]
    resid = runtime.partial_step(tiny, cache, ids[:, -1:], stop_at_layer=2, hooks=hooks)
    assert_cache_equal(cache, snap)
    assert runtime.cache_length(cache) == 29
    # only layers before stop_at_layer ran, and they attended to all cached keys plus the new one
    assert sorted(patterns) == ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"]
    with torch.inference_mode():
        _, full_cache = tiny.bridge.run_with_cache(ids)
    torch.testing.assert_close(resid[:, -1], full_cache["blocks.2.hook_resid_pre"][:, -1], atol=1e-5, rtol=1e-4)
    full_row = full_cache["blocks.1.attn.hook_pattern"][:, :, -1:]
    partial_row = patterns["blocks.1.attn.hook_pattern"]
    # sliding-window layers see only their window's keys at decode time
    width = partial_row.shape[-1]
    assert width == (29 + 1 if tiny.spec.sliding_window is None else tiny.spec.sliding_window)
    torch.testing.assert_close(partial_row, full_row[..., -width:], atol=1e-5, rtol=1e-4)
    assert full_row[..., :-width].abs().max() < 1e-6 if width < 30 else True
    # the full step afterwards sees exactly the old cache
    logits = runtime.step(tiny, cache, ids[:, -1:])
    torch.testing.assert_close(logits, full_logits(tiny, ids)[:, -1], atol=1e-4, rtol=1e-4)


def test_partial_step_rejects_bad_layer(tiny_llama):
    cache, _ = runtime.prefill(tiny_llama, [30, 31, 32])
    for bad in (0, tiny_llama.spec.n_layers + 1):
        with pytest.raises(ValueError, match="stop_at_layer"):
            runtime.partial_step(tiny_llama, cache, [33], stop_at_layer=bad)


def test_greedy_generation_equals_hf_generate(tiny):
    prompt = "Please give a route from Paris to Berlin by train."
    ours = reference_generate(tiny, prompt, max_new_tokens=12)
    ref = tiny.load_reference_hf("eager")
    with torch.inference_mode():
        out = ref.generate(
            torch.tensor([ours.prompt_ids]), do_sample=False, max_new_tokens=12,
            pad_token_id=tiny.tokenizer.pad_token_id,
        )
    assert ours.tokens == out[0, len(ours.prompt_ids) :].tolist()


def test_prompt_longer_than_context_is_refused():
    from dysco_interp.models.tiny import tiny_model

    small = tiny_model("qwen2", max_position_embeddings=64)
    with pytest.raises(ContextLengthError, match="exceeds the context"):
        runtime.prefill(small, list(range(30, 100)))
    with pytest.raises(ContextLengthError):
        reference_generate(small, list(range(30, 90)), max_new_tokens=10)


def test_seeded_sampling_is_reproducible(tiny_llama):
    cfg = SamplingConfig(temperature=1.5, seed=7)
    a = reference_generate(tiny_llama, "write a short poem about the sea", max_new_tokens=10, sampling=cfg)
    b = reference_generate(tiny_llama, "write a short poem about the sea", max_new_tokens=10, sampling=cfg)
    assert a.tokens == b.tokens
    others = {
        tuple(reference_generate(tiny_llama, "write a short poem about the sea", max_new_tokens=10,
                       sampling=SamplingConfig(1.5, seed=s)).tokens)
        for s in range(8, 12)
    }
    assert len(others | {tuple(a.tokens)}) > 1


def test_sampler_rules():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
    assert Sampler()(logits).item() == 1
    assert Sampler(SamplingConfig(temperature=5.0, top_k=1, seed=0))(logits).item() == 1
    # top_p keeps the smallest prefix reaching the mass: here only the top token
    assert Sampler(SamplingConfig(temperature=1.0, top_p=0.5, seed=0))(logits).item() == 1
    picks = {Sampler(SamplingConfig(temperature=1.0, top_k=2, seed=s))(logits).item() for s in range(40)}
    assert picks == {1, 3}


@pytest.mark.parametrize(
    "kwargs", [dict(temperature=-1), dict(top_p=0), dict(top_p=1.5), dict(top_k=-2), dict(temperature=float("inf"))]
)
def test_invalid_sampling_is_refused(kwargs):
    with pytest.raises(ConfigError):
        SamplingConfig(**kwargs)


def test_generate_rejects_empty_budget(tiny_llama):
    with pytest.raises(ConfigError, match="max_new_tokens"):
        reference_generate(tiny_llama, "hi", max_new_tokens=0)
