"""The wider pass plan: a logit scale (a temperature on some heads, log-n growth), a bias with one
row per head, and a mask, each written as a plain method and run on bridge, sdpa and static with
the same tokens; UniAttnS as such a plan program; and the plan's checks."""

import dataclasses
import math

import pytest
import torch

from dysco_interp import DecodingConfig, generate_batch, register_method
from dysco_interp.decoding import backends
from dysco_interp.decoding.methods import REGISTRY, Method, UniAttnS
from dysco_interp.decoding.plan import Bias, Mask, PassPlan, Scale, logn_factor
from dysco_interp.errors import ConfigError
from dysco_interp.models.tiny import STYLES, tiny_model

PROMPTS = ["You can travel from Paris to Berlin by train. Rome is quiet. " * 3 + "Give a route from Paris to Berlin.",
           "Oslo has a harbour. Bergen is rainy. " * 2 + "Which city has a harbour?"]
N_NEW = 8


class HeadTemperature(Method):
    """Two heads of every layer but the first sharpened, with log-n growth past a short training
    length, in the prefill and at every step: what a temperature method can now say."""

    name = "test-head-temperature"
    description = "a temperature on two heads per layer, with log-n growth"
    options = {"tau": 0.6, "log_n": 24}

    @classmethod
    def prefill_scale(cls, config, n_layers):
        o = dict(config.options)
        layers = range(1, n_layers)
        return Scale(layers, heads=[(layer, h) for layer in layers for h in (0, 3)], temperature=o["tau"],
                     log_n=o["log_n"])

    def __init__(self, config, heads, spec):
        super().__init__(config, heads, spec)
        self.plain = PassPlan(scale=self.prefill_scale(config, spec.n_layers))


class PerHeadBias(Method):
    """Each head of layers 1-2 its own bias: head h boosts the keys whose position is h modulo the
    head count, by log(1 + h); only the heads of one KV group in layer 2."""

    name = "test-per-head-bias"
    description = "a bias with one row per head"

    def __init__(self, config, heads, spec):
        super().__init__(config, heads, spec)
        self.n_heads = spec.n_heads
        self.biased = PassPlan(bias=Bias([1, 2], heads=[(1, h) for h in range(spec.n_heads)] + [(2, 0), (2, 1)],
                                         per_head=True))

    def start(self, model, batch):
        self.pads = torch.tensor(batch.pads, device=model.device)

    def step(self, run, n_keys):
        position = torch.arange(n_keys, device=self.pads.device)[None] - self.pads[:, None]  # [B, n]
        head = torch.arange(self.n_heads, device=self.pads.device)[None, :, None]
        boost = (position[:, None, :] % self.n_heads == head) & (position[:, None, :] >= 0)
        values = torch.where(boost, torch.log1p(head.float()), 0.0)[:, :, None, :]  # [B, heads, 1, n]
        return run(self.biased.with_bias(values)).logits, None


class RecentWindow(Method):
    """Hard attention in layers 1-3: each row sees its first 4 keys and its last 12, nothing else."""

    name = "test-recent-window"
    description = "a mask: sinks and a recent window"

    def __init__(self, config, heads, spec):
        super().__init__(config, heads, spec)
        self.masked = PassPlan(mask=Mask(range(1, spec.n_layers)))

    def start(self, model, batch):
        self.pads = torch.tensor(batch.pads, device=model.device)

    def step(self, run, n_keys):
        position = torch.arange(n_keys, device=self.pads.device)[None] - self.pads[:, None]
        keep = (position < 4) | (position >= n_keys - self.pads[:, None] - 12)
        return run(self.masked.with_mask(keep[:, None, None, :])).logits, None


for cls in (HeadTemperature, PerHeadBias, RecentWindow):
    register_method(cls)


def run_all(model, configs, backend):
    if backend == "bridge":  # one prompt at a time
        out = {name: [] for name in configs}
        for prompt in PROMPTS:
            for name, results in generate_batch(model, [prompt], configs, None, backend=backend).items():
                out[name] += results
        return out
    return generate_batch(model, PROMPTS, configs, None, backend=backend)


@pytest.mark.parametrize("style", STYLES)
def test_temperature_per_head_bias_and_mask_methods_give_the_bridges_tokens_on_every_backend(style):
    model = tiny_model(style)
    configs = {m: DecodingConfig(method=m, max_new_tokens=N_NEW)
               for m in ("vanilla", HeadTemperature.name, PerHeadBias.name, RecentWindow.name)}
    ref = run_all(model, configs, "bridge")
    for name in configs:  # each method changes the tokens: the test can tell them apart
        assert name == "vanilla" or any(a.tokens != b.tokens for a, b in zip(ref[name], ref["vanilla"])), name
    for backend in ("sdpa", "static"):
        ours = run_all(model, configs, backend)
        for name in configs:
            assert [r.tokens for r in ours[name]] == [r.tokens for r in ref[name]], (backend, name)


def greedy(backend, ids, scale=None, plan=PassPlan(), n=3):
    """`n` greedy tokens from the bare prompt `ids` `[1, n]` through plain passes."""
    state, token, out = backend.prefill(ids[:, :-1], None, scale=scale), ids[:, -1], []
    for _ in range(n):
        token = backend.run(state, token, plan).logits.argmax(-1)
        out.append(int(token))
    return out


def test_uniattns_is_a_plan_program_that_gives_the_tokens_of_a_temperature_backend():
    model = tiny_model("llama")
    config = DecodingConfig(method="uniattns", params={"tau": 0.7}, max_new_tokens=N_NEW)
    every = Scale(range(model.spec.n_layers), temperature=0.7)
    method = REGISTRY["uniattns"](config, None, model.spec)
    assert method.plain.scale == every and every.uniform and method.warmup_plan is method.plain
    assert UniAttnS.prefill_scale(config, model.spec.n_layers) == every and config.changes_prefill
    one = config.with_params(tau=1.0)
    assert UniAttnS.prefill_scale(one, 4) is None and not one.changes_prefill
    ids = torch.tensor([model.tokenizer(PROMPTS[0])["input_ids"]])
    for name in ("bridge", "sdpa", "static"):
        with pytest.warns(DeprecationWarning, match="tau"):
            old = backends.make_backend(model, name, tau=0.7)  # how a temperature reached the backends before
        assert greedy(old, ids) == greedy(backends.make_backend(model, name), ids, every, PassPlan(scale=every))
    ours = {b: run_all(model, {"u": config}, b)["u"] for b in ("bridge", "sdpa", "static")}
    assert [r.tokens for r in ours["sdpa"]] == [r.tokens for r in ours["bridge"]] == [r.tokens for r in ours["static"]]


def test_log_n_grows_past_the_training_length_only():
    factors = logn_factor(torch.tensor([1, 16, 32, 64, 1024]), 32)
    assert factors.tolist() == pytest.approx([1.0, 1.0, 1.0, math.log(64) / math.log(32), 2.0])


def test_the_plans_new_parts_are_checked():
    with pytest.raises(ConfigError, match="temperature"):
        Scale([0], temperature=0.0)
    with pytest.raises(ConfigError, match="log_n"):
        Scale([0], log_n=1)
    with pytest.raises(ConfigError, match="scale heads"):
        Scale([0], heads=[(1, 0)])
    with pytest.raises(ConfigError, match="same layers and heads"):
        PassPlan(bias=Bias([0, 1]), mask=Mask([1]))
    with pytest.raises(ConfigError, match="not a rule"):
        PassPlan(reads=(), bias=Bias([1], source="rule"), mask=Mask([1]))
    with pytest.raises(ConfigError, match="plan.Scale"):
        PassPlan(scale=0.5)
    with pytest.raises(ConfigError, match="outside the model"):
        PassPlan(scale=Scale([7])).check(4, 4)
    plan = PassPlan(mask=Mask([1]))
    assert plan.kind == "biased" and plan.additive == Bias([1])
    assert PassPlan(scale=Scale([1], temperature=2.0)).kind == "plain"
    with pytest.raises(ConfigError, match="no mask"):
        PassPlan().with_mask(torch.ones(1, 1, 1, 3, dtype=torch.bool))
    model = tiny_model("llama")
    sdpa = backends.make_backend(model, "sdpa")
    state = sdpa.prefill(torch.tensor([[5, 6, 7, 8]]), None)
    with pytest.raises(ConfigError, match="bool tensor"):
        sdpa.run(state, torch.tensor([9]), plan.with_mask(torch.ones(1, 1, 1, 5)))
    with pytest.raises(ConfigError, match=r"\[batch, n_heads, 1, n_keys\]"):
        sdpa.run(state, torch.tensor([9]), PassPlan(bias=Bias([1], per_head=True)).with_bias(torch.zeros(1, 1, 1, 5)))
    # a mask that leaves a row nothing to attend to is refused like any broken bias
    sdpa.run(state, torch.tensor([9]), plan.with_mask(torch.zeros(1, 1, 1, 5, dtype=torch.bool)))
    with pytest.raises(ConfigError, match="no finite key"):
        sdpa.check_faults()
    assert dataclasses.replace(plan, mask=Mask([1], values=torch.ones(1))) == plan  # values are data, not structure
