"""The flex backend (FlexAttention decoding steps) against the TransformerLens bridge: the same
tokens for every plan kind (vanilla, DySCO at the paper's preset and the small budget, a
temperature, a mask, a bias with one row per head on some heads, a temperature on some heads
with log-n growth, a rule's bias), on every tiny style and on the default model, in a padded batch
as alone; its reads as exact as the SDPA backend's; one compiled kernel for every step; and its
options and its fallback to the eager kernel."""

import warnings

import pytest
import torch

import dysco_interp.decoding.baselines.dysco_variants  # noqa: F401  (registers dysco-hard)
import dysco_interp.decoding.baselines.instaboost  # noqa: F401  (registers instaboost)
from dysco_interp import DecodingConfig, generate_batch, register_method
from dysco_interp.decoding import backends
from dysco_interp.decoding.backends.flex import FlexBackend, FlexKernel, FlexOptions
from dysco_interp.decoding.config import preset
from dysco_interp.decoding.methods import Method
from dysco_interp.decoding.plan import Bias, PassPlan, Read, Scale
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet, shipped_heads
from dysco_interp.models.tiny import STYLES, tiny_model

INSTRUCTION = "Answer with one short line."
PROMPT = f"{INSTRUCTION} " + "You can travel from Paris to Berlin by train. Rome is quiet. " * 5 + \
    "Please give a route from Paris to Berlin."
OTHER = f"{INSTRUCTION} " + "Oslo has a harbour. Bergen is rainy. " * 3 + "Which city has a harbour?"
N_NEW = 8
STRONG = {"beta": 4.0, "select_p": 0.7}  # strong enough that the tiny models' tokens change


class FlexHeadTemperature(Method):
    """Heads 0 and 3 of every layer but the first sharpened, with log-n growth past 24 keys, in
    the prefill and at every step: the flex backend's per-head `score_mod` factor."""

    name = "test-flex-head-temperature"
    description = "a temperature on two heads per layer, with log-n growth"

    @classmethod
    def prefill_scale(cls, config, n_layers):
        layers = range(1, n_layers)
        return Scale(layers, heads=[(layer, h) for layer in layers for h in (0, 3)], temperature=0.6, log_n=24)

    def __init__(self, config, heads, spec):
        super().__init__(config, heads, spec)
        self.plain = PassPlan(scale=self.prefill_scale(config, spec.n_layers))


class FlexPerHeadBias(Method):
    """A PASTA-like bias: every head of layer 1 and two heads of layer 2, each its own row (head h
    boosts the keys whose position is h modulo the head count, by log(1 + 2h))."""

    name = "test-flex-per-head-bias"
    description = "a bias with one row per head, on some heads"

    def __init__(self, config, heads, spec):
        super().__init__(config, heads, spec)
        self.n_heads = spec.n_heads
        self.biased = PassPlan(bias=Bias([1, 2], heads=[(1, h) for h in range(spec.n_heads)] + [(2, 0), (2, 1)],
                                         per_head=True))

    def start(self, model, batch):
        self.pads = torch.tensor(batch.pads, device=model.device)

    def step(self, run, n_keys):
        position = torch.arange(n_keys, device=self.pads.device)[None] - self.pads[:, None]
        head = torch.arange(self.n_heads, device=self.pads.device)[None, :, None]
        boost = (position[:, None, :] % self.n_heads == head) & (position[:, None, :] >= 0)
        values = torch.where(boost, torch.log1p(2 * head.float()), 0.0)[:, :, None, :]
        return run(self.biased.with_bias(values)).logits, None


for _cls in (FlexHeadTemperature, FlexPerHeadBias):
    register_method(_cls)


def configs(n_new: int = N_NEW) -> dict[str, DecodingConfig]:
    """Each plan kind: plain, DySCO's bias (two presets and a strong one), a rule's bias, a
    temperature, a mask, InstABoost's bias, a per-head bias and a per-head temperature."""
    return {
        "vanilla": DecodingConfig(method="vanilla", max_new_tokens=n_new),
        "dysco-paper": preset("paper", max_new_tokens=n_new),
        "dysco-small-budget": preset("small-budget", max_new_tokens=n_new),
        "dysco-strong": DecodingConfig(params=STRONG, max_new_tokens=n_new),
        "dysco-reuse": DecodingConfig(method="dysco-reuse", params=STRONG, max_new_tokens=n_new),
        "uniattns": DecodingConfig(method="uniattns", params={"tau": 0.5}, max_new_tokens=n_new),
        "dysco-hard": DecodingConfig(method="dysco-hard", params={"select_p": 0.7}, max_new_tokens=n_new),
        "instaboost": DecodingConfig(method="instaboost", params={"M": 20.0, "instruction": [INSTRUCTION]},
                                     max_new_tokens=n_new),
        "per-head-bias": DecodingConfig(method=FlexPerHeadBias.name, max_new_tokens=n_new),
        "head-temperature": DecodingConfig(method=FlexHeadTemperature.name, max_new_tokens=n_new),
    }


def heads_for(model, pairs=((1, 0), (2, 3), (1, 2))):
    s = model.spec
    return HeadSet(list(pairs), model=s.name, n_layers=s.n_layers, n_heads=s.n_heads, n_kv_heads=s.n_kv_heads)


def tokens(model, chosen, heads, backend, prompts, alone=False):
    """method -> each prompt's tokens: every prompt in one left-padded batch, or one at a time."""
    if not alone:
        return {name: [r.tokens for r in rows]
                for name, rows in generate_batch(model, list(prompts), chosen, heads, backend=backend).items()}
    out: dict[str, list[list[int]]] = {name: [] for name in chosen}
    for prompt in prompts:
        for name, rows in generate_batch(model, [prompt], chosen, heads, backend=backend).items():
            out[name] += [r.tokens for r in rows]
    return out


@pytest.mark.parametrize("style", STYLES)
def test_flex_gives_the_bridges_tokens_for_every_plan_kind_in_a_padded_batch_as_alone(style, tiny_of):
    model = tiny_of(style)
    heads, chosen = heads_for(model), configs()
    bridge = tokens(model, chosen, heads, "bridge", (PROMPT, OTHER), alone=True)
    batched = tokens(model, chosen, heads, "flex", (PROMPT, OTHER))
    alone = tokens(model, chosen, heads, "flex", (PROMPT, OTHER), alone=True)
    for name in chosen:
        assert batched[name] == bridge[name], name
        assert alone[name] == bridge[name], name
    # the plan kinds change the tokens, so equality means something
    changed = [name for name in chosen if bridge[name] != bridge["vanilla"]]
    assert {"dysco-strong", "uniattns", "instaboost", "per-head-bias"} <= set(changed), changed


@pytest.mark.real_model
def test_flex_gives_the_bridges_tokens_on_the_default_model(real_model):
    heads = shipped_heads("smollm2-135m", spec=real_model.spec)
    chosen = {name: config for name, config in configs(6).items()
              if name in ("vanilla", "dysco-paper", "dysco-small-budget", "uniattns", "dysco-hard", "instaboost",
                          "per-head-bias")}
    bridge = tokens(real_model, chosen, heads, "bridge", (PROMPT, OTHER), alone=True)
    batched = tokens(real_model, chosen, heads, "flex", (PROMPT, OTHER))
    for name in chosen:
        assert batched[name] == bridge[name], name


def test_a_step_reads_and_scores_what_the_sdpa_backend_does(tiny_llama):
    """Reads in biased, per-head-biased and scaled layers: the rows and the logits of sdpa's."""
    model = tiny_llama
    n_layers, n_heads = model.spec.n_layers, model.spec.n_heads
    ids = torch.randint(20, 500, (2, 30), generator=torch.Generator().manual_seed(3))
    valid = torch.ones(2, 29, dtype=torch.bool)
    valid[1, :5] = False  # a left-padded row
    scale = Scale(range(1, n_layers), heads=[(layer, h) for layer in range(1, n_layers) for h in (0, 2)],
                  temperature=0.7, log_n=8)
    read = Read([(1, 0), (2, 1), (2, 3), (3, 2)], returns="rows")
    bias = torch.randn(2, n_heads, 1, 30, generator=torch.Generator().manual_seed(4))
    plan = PassPlan(reads=(read,), bias=Bias([2, 3], heads=[(2, 1), (3, 0), (3, 2)], per_head=True),
                    scale=scale).with_bias(bias)
    out = {}
    for name in ("sdpa", "flex"):
        b = backends.make_backend(model, name)
        state = b.prefill(ids[:, :-1], valid, scale=scale)
        step = b.run(state, ids[:, -1], plan)
        out[name] = step
    torch.testing.assert_close(out["flex"].logits, out["sdpa"].logits, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(out["flex"].reads[0].rows, out["sdpa"].reads[0].rows, atol=1e-6, rtol=1e-5)
    assert out["flex"].reads[0].rows[1, :, :5].abs().max() == 0  # the pads get nothing


def test_one_compiled_kernel_serves_every_step(tiny_llama):
    """The score_mod indexes the step's tensors: a new step is new inputs, not a new kernel."""
    counters = torch._dynamo.utils.counters
    b = backends.make_backend(tiny_llama, "flex", compile_kernels=True)
    ids = torch.randint(20, 500, (1, 40), generator=torch.Generator().manual_seed(1))
    state = b.prefill(ids[:, :20], None)
    plan = PassPlan(bias=Bias(range(tiny_llama.spec.n_layers)))
    compiles = []
    for i in range(20, 39):
        values = torch.randn(1, 1, 1, state.n_keys + 1, generator=torch.Generator().manual_seed(i))
        b.run(state, ids[:, i], plan.with_bias(values))
        compiles.append(counters["stats"]["unique_graphs"])
    assert b.kernel.compiled and not b.kernel.failed
    assert compiles[-1] == compiles[2], compiles  # the key count goes dynamic by the third step at the latest


def test_eager_and_compiled_kernels_give_the_same_tokens(tiny_llama):
    heads, chosen = heads_for(tiny_llama), {k: v for k, v in configs().items()
                                             if k in ("dysco-strong", "dysco-hard", "per-head-bias")}
    out = {c: tokens(tiny_llama, chosen, heads, backends.BackendSpec("flex", compile_kernels=c), (PROMPT, OTHER))
           for c in (True, False)}
    assert out[True] == out[False]


def test_the_compiled_kernel_gets_every_key_in_blocks_and_the_same_tokens(tiny_llama, monkeypatch):
    """FlexDecoding splits a query's keys by the block mask's blocks (without one, one program per
    KV head reads them all: 22 times slower at 100K on an H200). Here torch's eager kernel stands in
    for the compiled one, with the mask the compiled one gets: every key, in blocks of `KV_BLOCK`,
    the last one partial."""
    from torch.nn.attention.flex_attention import flex_attention

    from dysco_interp.decoding.backends.flex import KV_BLOCK, every_key

    masks = []

    def eager_with_the_mask(cls):
        def call(*args, block_mask, **kwargs):
            masks.append(block_mask)
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
                return flex_attention(*args, block_mask=block_mask, **kwargs)
        return call

    chosen = {k: v for k, v in configs().items() if k in ("dysco-strong", "per-head-bias")}
    heads = heads_for(tiny_llama)
    plain = tokens(tiny_llama, chosen, heads, backends.BackendSpec("flex", compile_kernels=False), (PROMPT, OTHER))
    monkeypatch.setattr(FlexKernel, "compiled_flex", classmethod(eager_with_the_mask))
    blocked = tokens(tiny_llama, chosen, heads, backends.BackendSpec("flex", compile_kernels=True), (PROMPT, OTHER))
    assert blocked == plain and masks
    for mask in masks:
        n = mask.seq_lengths[1]
        assert mask.seq_lengths[0] == 1 and mask.BLOCK_SIZE == (KV_BLOCK, KV_BLOCK)
        assert mask.kv_num_blocks.flatten().tolist() == [-(-n // KV_BLOCK)]
        assert mask.kv_indices.flatten().tolist() == list(range(-(-n // KV_BLOCK)))
    assert every_key(2 * KV_BLOCK + 1, torch.device("cpu")).kv_num_blocks.item() == 3


def test_a_kernel_the_compiler_fails_to_build_runs_eagerly_said_once(tiny_llama, monkeypatch):
    def broken(cls):
        raise RuntimeError("no compiler here\nmore detail")

    monkeypatch.setattr(FlexKernel, "compiled_flex", classmethod(broken))
    monkeypatch.setattr(FlexKernel, "_told", False)
    chosen = {"dysco-strong": configs()["dysco-strong"]}
    spec = backends.BackendSpec("flex", compile_kernels=True)
    with pytest.warns(RuntimeWarning, match="failed on cpu \\(RuntimeError: no compiler here\\); .* eagerly"):
        fell = tokens(tiny_llama, chosen, heads_for(tiny_llama), spec, (PROMPT,))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # said once
        b = spec.make(tiny_llama)
        state = b.prefill(torch.tensor([[30, 40, 50]]), None)
        b.run(state, torch.tensor([60]), PassPlan())
    assert b.kernel.compiled and b.kernel.fallback_reason == "RuntimeError: no compiler here"
    assert fell == tokens(tiny_llama, chosen, heads_for(tiny_llama), "sdpa", (PROMPT,))


def test_flex_options():
    assert backends.BackendSpec("flex").options == FlexOptions()
    assert backends.BackendSpec("flex", compile_kernels=False).options.compile_kernels is False
    assert backends.BackendSpec("flex").store_settings() == {"backend": "flex"}  # compiled or not: the same tokens
    with pytest.raises(ConfigError, match="compile_kernels is True, False or None"):
        FlexOptions(compile_kernels="yes")
    with pytest.raises(ConfigError, match="no option decode_attention"):
        backends.BackendSpec("flex", decode_attention="float32")
    assert backends.REGISTRY["flex"] is FlexBackend and not FlexBackend.supports_graphs
    model = tiny_model("llama")
    assert not backends.make_backend(model, "flex").kernel.compiled  # None: compiled on CUDA devices only
    assert backends.BackendSpec("flex").described(model) == {"decode_attention": "flex", "compiled_kernels": False,
                                                             "fallback": None}
