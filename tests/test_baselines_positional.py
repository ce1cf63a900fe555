"""Positional calibration as a plan program: the same tokens on bridge, sdpa and static, in a padded
batch as alone; the tokens of the calibration written directly as TransformerLens hooks on the bridge
(its own neutral document, its own read of the attention pattern, its own bias); vanilla's tokens at
strength 0; the bucket math (strength 1 flattens a row's profile, the calibrated keys keep their total
mass); and bad parameters refused in one line before any model loads."""

import math
import re

import pytest
import torch

import dysco_interp.decoding.baselines.positional as positional
from dysco_interp import DecodingConfig, generate, generate_batch, observe
from dysco_interp.decoding.baselines.positional import (
    FILLER,
    MIN_RATIO,
    PositionalCalibration,
    baseline_shares,
    bucket_bias,
    buckets_of,
    key_bias,
    key_shares,
    neutral_ids,
)
from dysco_interp.decoding.methods import REGISTRY
from dysco_interp.decoding.passes import current_pass
from dysco_interp.decoding.prompts import prepare_prompt
from dysco_interp.errors import ConfigError
from dysco_interp.hooks import pattern_name, scores_name
from dysco_interp.models.tiny import STYLES

PROMPT = "You can travel from Paris to Berlin by train. Rome is quiet. " * 4 + "Give a route from Paris to Berlin."
OTHER = "Oslo has a harbour. Rome is quiet. Bergen is rainy. " * 2 + "Which city has a harbour?"
N_NEW = 8
STRONG = {"strength": 3.0, "buckets": 4}  # strong enough that every tiny model's tokens change


def calibration(n_new: int = N_NEW, **params) -> DecodingConfig:
    return DecodingConfig(method="pos-calibration", params=params, max_new_tokens=n_new)


def vanilla(n_new: int = N_NEW) -> DecodingConfig:
    return DecodingConfig(method="vanilla", max_new_tokens=n_new)


@pytest.mark.parametrize("style", STYLES)
def test_pos_calibration_gives_the_same_tokens_on_every_backend_in_a_padded_batch_as_alone(style, tiny_of,
                                                                                         tokens_everywhere):
    model = tiny_of(style)
    assert len(prepare_prompt(model, PROMPT).ids) != len(prepare_prompt(model, OTHER).ids)  # the batch is padded
    chosen = {"strong": calibration(**STRONG), "default": calibration(), "vanilla": vanilla()}
    out = tokens_everywhere(model, chosen, (PROMPT, OTHER))
    for backend in ("sdpa", "static"):
        assert out[backend] == out["bridge"], backend
    assert out["bridge"]["strong"] != out["bridge"]["vanilla"]  # so that equality means something


def test_strength_0_gives_vanilla_s_tokens_on_every_backend(tiny_llama, tokens_everywhere):
    chosen = {"zero": calibration(strength=0.0, buckets=4), "vanilla": vanilla()}
    for backend, tokens in tokens_everywhere(tiny_llama, chosen, (PROMPT, OTHER)).items():
        assert tokens["zero"] == tokens["vanilla"], backend


def test_the_calibration_is_the_same_alone_as_in_a_padded_batch_and_made_once_per_neutral_document(
        tiny_llama, monkeypatch):
    calls = []
    real = positional.neutral_row
    monkeypatch.setattr(positional, "neutral_row", lambda *a: calls.append(1) or real(*a))

    def baselines(prompts):
        config = calibration(**STRONG)
        method = REGISTRY["pos-calibration"](config, None, tiny_llama.spec)
        from dysco_interp.decoding.prompts import PromptBatch, pad_id
        batch = PromptBatch.of([prepare_prompt(tiny_llama, p) for p in prompts], pad_id(tiny_llama))
        method.start(tiny_llama, batch)
        return method

    alone = [baselines([p]).baselines[0] for p in (PROMPT, OTHER)]
    calls.clear()
    together = baselines([PROMPT, OTHER, PROMPT])
    assert len(calls) == 2  # the repeated prompt's neutral document is calibrated once
    for a, b in zip(alone + alone[:1], together.baselines):
        assert torch.equal(a, b)
    # each row's bias sits on its own keys, after its pads; the last generation-prompt token's own key
    # is template, so unbiased
    values = together.values[:, 0, 0].cpu()
    pad = together.values.shape[-1] - len(prepare_prompt(tiny_llama, OTHER).ids)
    assert (values[1, :pad] == 0).all() and (values[1, pad:] != 0).any()
    assert torch.equal(values[0], values[2]) and (values[:, -1] == 0).all()


# the calibration written independently: its own neutral document, the bridge's full attention
# pattern, the bias formula in plain floats, and hooks on the scores

def direct_neutral(model, prompt: str) -> tuple[list[int], list[bool]]:
    """The prompt's ids with every content token (not chat template, not special) replaced by the
    filler's tokens in order, and which positions those are."""
    prepared = prepare_prompt(model, prompt)
    special = set(model.tokenizer.all_special_ids)
    filler = model.tokenizer(FILLER, add_special_tokens=False)["input_ids"]
    content = [not t and i not in special for i, t in zip(prepared.ids, prepared.template("skeleton").tolist())]
    out, k = [], 0
    for i, c in zip(prepared.ids, content):
        out.append(filler[k % len(filler)] if c else i)
        k += c
    return out, content


def direct_bias(model, prompt: str, strength: float, buckets: int, first_layer: int) -> list[float]:
    """Each prompt key's bias, from the bridge's attention pattern of the neutral document's last
    position (the mean over every head of the biased layers)."""
    neutral, content = direct_neutral(model, prompt)
    layers = range(first_layer, model.spec.n_layers)
    with torch.inference_mode():
        _, acts = model.bridge.run_with_cache(torch.tensor([neutral]))
    row = torch.stack([acts[pattern_name(layer)][0, :, -1].double() for layer in layers]).mean(dim=(0, 1)).tolist()
    positions = [p for p, c in enumerate(content) if c]
    m = len(positions)
    bucket = {p: r * buckets // m for r, p in enumerate(positions)}
    mass, count = [0.0] * buckets, [0] * buckets
    for p in positions:
        mass[bucket[p]] += row[p]
        count[bucket[p]] += 1
    b = [x / sum(mass) for x in mass]
    u = [c / m for c in count]
    assert all(bj / uj > MIN_RATIO for bj, uj in zip(b, u))  # no floor in this reference
    norm = math.log(sum(bj * (uj / bj) ** strength for bj, uj in zip(b, u)))
    per_bucket = [strength * math.log(uj / bj) - norm for bj, uj in zip(b, u)]
    return [per_bucket[bucket[p]] if c else 0.0 for p, c in enumerate(content)]


def direct_hooks(model, bias: list[float], first_layer: int):
    """The bias on the prompt keys' scores in the biased layers, in the steps vanilla's schedule runs
    as the method's own (the last prompt tokens and the generated ones)."""
    values = torch.tensor(bias)

    def hook(scores, hook):
        p = current_pass()
        if p is None or p.phase not in ("intervention-warmup", "decode"):
            return scores
        out = scores.float().clone()
        n = min(out.shape[-1], len(values))
        out[..., :n] += values[:n].to(out.device)
        return out

    return [(scores_name(layer), hook) for layer in range(first_layer, model.spec.n_layers)]


def plan_and_hooks(model, config: DecodingConfig):
    """(the plan program's tokens, the direct hooks' tokens, vanilla's tokens) on the bridge."""
    params = config.params
    first = math.floor(params.depth_from * model.spec.n_layers)
    ours = generate(model, PROMPT, config, backend="bridge").tokens
    plain = vanilla(config.max_new_tokens)
    bias = direct_bias(model, PROMPT, params.strength, params.buckets, first)
    with observe(model, hooks=direct_hooks(model, bias, first)):
        direct = generate(model, PROMPT, plain, backend="bridge").tokens
    return ours, direct, generate(model, PROMPT, plain, backend="bridge").tokens


@pytest.mark.parametrize("style", ["llama", "qwen2"])
def test_pos_calibration_as_a_plan_equals_calibration_written_as_bridge_hooks(style, tiny_of):
    model = tiny_of(style)
    for params in (STRONG, {"strength": 2.0, "buckets": 3, "depth_from": 0.0}):
        ours, direct, plain = plan_and_hooks(model, calibration(**params))
        assert ours == direct, params
        assert ours != plain, params


@pytest.mark.real_model
def test_pos_calibration_as_a_plan_equals_bridge_hooks_on_the_default_model(real_model):
    ours, direct, plain = plan_and_hooks(real_model, calibration(n_new=12, strength=2.0, buckets=8))
    assert ours == direct
    assert ours != plain


def test_the_neutral_document_keeps_the_template_and_fills_the_content(tiny_llama):
    prepared = prepare_prompt(tiny_llama, PROMPT)
    ids = torch.tensor(prepared.ids)
    content = ~prepared.template("skeleton") & ~torch.isin(ids, torch.tensor(tiny_llama.tokenizer.all_special_ids))
    filler = torch.tensor(tiny_llama.tokenizer(FILLER, add_special_tokens=False)["input_ids"])
    neutral = neutral_ids(ids, content, filler)
    assert len(neutral) == len(ids) and torch.equal(neutral[~content], ids[~content])
    assert neutral[content][: len(filler)].tolist() == filler.tolist()  # the filler's tokens, in order
    assert neutral[content][len(filler):2 * len(filler)].tolist() == filler[:len(neutral[content]) - len(filler)] \
        .tolist()
    assert neutral.tolist() == direct_neutral(tiny_llama, PROMPT)[0]
    assert "Paris" not in tiny_llama.tokenizer.decode(neutral)


def test_strength_1_flattens_a_row_s_profile_and_the_calibrated_keys_keep_their_mass():
    gen = torch.Generator().manual_seed(0)
    n, buckets = 50, 6
    content = torch.ones(n, dtype=torch.bool)
    content[[0, 1, 2, 47, 48, 49]] = False  # template keys: never biased
    scores = torch.randn(n, generator=gen, dtype=torch.float64) * 2
    scores[torch.arange(3, 47)] += torch.linspace(1.5, -1.5, 44, dtype=torch.float64) ** 2  # a U shape
    row = scores.softmax(-1)
    which = buckets_of(content, buckets)
    counts = torch.bincount(which[content], minlength=buckets)
    assert counts.max() - counts.min() <= 1 and (which[~content] == -1).all()
    assert (which[content].diff() >= 0).all()  # in order
    baseline, keys = baseline_shares(row.float(), content, buckets), key_shares(content, buckets)
    assert torch.allclose(baseline.sum(), torch.tensor(1.0)) and torch.allclose(keys, counts / counts.sum())
    for strength in (0.0, 0.5, 1.0, 2.0):
        bias = key_bias(content, bucket_bias(baseline, keys, strength))
        assert (bias[~content] == 0).all()
        after = (scores + bias.double()).softmax(-1)
        assert torch.allclose(after[content].sum(), row[content].sum(), atol=1e-5)  # the mass stays
        if strength == 0:
            assert (bias == 0).all()
        if strength == 1:
            assert torch.allclose(baseline_shares(after.float(), content, buckets), keys, atol=1e-5)  # flat
    # an empty bucket (fewer keys than buckets) has no bias and moves nothing; a bucket the row
    # nearly ignores is floored
    few = torch.tensor([False, True, True, False])
    assert torch.equal(buckets_of(few, 4), torch.tensor([-1, 0, 2, -1]))
    assert bucket_bias(torch.tensor([0.5, 0, 0.5, 0]), key_shares(few, 4), 1.0).tolist() == [0.0, 0.0, 0.0, 0.0]
    floored = bucket_bias(torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.5]), 1.0)
    assert floored[1] - floored[0] == pytest.approx(math.log(2 / MIN_RATIO), rel=1e-4)  # b/u: 2 and the floor


@pytest.mark.parametrize("params, words", [
    ({"strength": -1.0}, "strength must be a finite number >= 0"),
    ({"strength": float("nan")}, "'strength' must be float"),
    ({"strength": "1"}, "'strength' must be float"),
    ({"buckets": 0}, "buckets must be an integer"),
    ({"buckets": 2.5}, "'buckets' must be int"),
    ({"buckets": True}, "'buckets' must be int"),
    ({"depth_from": 1.0}, "depth_from must be a finite number"),
    ({"depth_from": -0.1}, "depth_from must be a finite number"),
    ({"beta": 2.0}, "has no parameter 'beta'"),
])
def test_bad_parameters_are_one_line_before_any_model_loads(params, words, no_model):
    with pytest.raises(ConfigError, match=re.escape(words)) as caught:
        DecodingConfig(method="pos-calibration", params=params)
    assert "\n" not in str(caught.value) and str(caught.value).startswith("method 'pos-calibration'")


def test_pos_calibration_is_one_biased_pass_in_the_last_half_that_reads_no_heads(tiny_llama):
    config = calibration()
    method = REGISTRY["pos-calibration"](config, None, tiny_llama.spec)
    n_layers = tiny_llama.spec.n_layers
    assert not method.uses_heads and method.heads_for(config, tiny_llama, None) is None
    assert method.calibrated.bias is not None and method.calibrated.reads == ()
    assert method.calibrated.bias.layers == tuple(range(n_layers // 2, n_layers))
    assert method.warmup_plan.bias is None and not config.changes_prefill  # it shares vanilla's prefill
    assert PositionalCalibration.Params().strength == 1.0
    # prompts given as token ids have no template: every token but the special ones is content
    ids = prepare_prompt(tiny_llama, PROMPT).ids
    out = generate_batch(tiny_llama, [list(ids)], {"c": calibration(**STRONG)}, backend="sdpa")["c"][0]
    assert len(out.tokens) == N_NEW
