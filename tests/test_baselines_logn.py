"""Log-n scaling as a plan program: the same tokens on bridge, sdpa and static, in a padded batch as
alone; the tokens of log-n scaling written directly as TransformerLens hooks on the bridge; vanilla's
tokens while no query sees more keys than the training length; a prefill of its own; and bad
parameters refused in one line before any model loads."""

import math
import re

import pytest
import torch

import dysco_interp.decoding.baselines.logn  # noqa: F401  (registers the method)
from dysco_interp import DecodingConfig, generate, observe
from dysco_interp.decoding.baselines.logn import LogN
from dysco_interp.decoding.methods import REGISTRY
from dysco_interp.decoding.plan import Scale
from dysco_interp.decoding.prompts import prepare_prompt
from dysco_interp.errors import ConfigError
from dysco_interp.hooks import scores_name
from dysco_interp.models.tiny import STYLES

PROMPT = "You can travel from Paris to Berlin by train. Rome is quiet. " * 4 + "Give a route from Paris to Berlin."
OTHER = "Oslo has a harbour. Rome is quiet. Bergen is rainy. " * 2 + "Which city has a harbour?"
N_NEW = 8
SHORT = 8  # a training length the tiny prompts pass, so that the scaling acts


def logn(train_length: int = SHORT) -> DecodingConfig:
    return DecodingConfig(method="logn", params={"train_length": train_length}, max_new_tokens=N_NEW)


@pytest.mark.parametrize("style", STYLES)
def test_logn_gives_the_same_tokens_on_every_backend_in_a_padded_batch_as_alone(style, tiny_of, tokens_everywhere):
    model = tiny_of(style)
    assert len(prepare_prompt(model, PROMPT).ids) != len(prepare_prompt(model, OTHER).ids)  # the batch is padded
    # decoded beside vanilla in one call: log-n keeps a prefill of its own, so the two differ
    chosen = {"logn": logn(), "vanilla": DecodingConfig(method="vanilla", max_new_tokens=N_NEW)}
    out = tokens_everywhere(model, chosen, (PROMPT, OTHER))
    for backend in ("sdpa", "static"):
        assert out[backend] == out["bridge"], backend
    assert out["bridge"]["logn"] != out["bridge"]["vanilla"]


def test_inside_the_training_length_logn_gives_vanilla_s_tokens_on_every_backend(tiny_llama, tokens_everywhere):
    # the last query of the longer prompt sees its prompt and all but the last generated token
    last = len(prepare_prompt(tiny_llama, PROMPT).ids) + N_NEW - 1
    chosen = {"at": logn(last), "default": logn(LogN.Params().train_length),
              "vanilla": DecodingConfig(method="vanilla", max_new_tokens=N_NEW)}
    for backend, tokens in tokens_everywhere(tiny_llama, chosen, (PROMPT, OTHER)).items():
        assert tokens["at"] == tokens["default"] == tokens["vanilla"], backend


def direct_logn(model, train_length: int):
    """Log-n scaling written directly as TransformerLens hooks: in every layer and pass, the prefill
    included, each query row's scores times max(1, ln n / ln train_length), n the keys it sees (one
    prompt, no pads: the query rows are the last positions of the key axis)."""

    def hook(scores, hook):
        n_queries, n_keys = scores.shape[-2], scores.shape[-1]
        seen = range(n_keys - n_queries + 1, n_keys + 1)
        factor = torch.tensor([max(1.0, math.log(n) / math.log(train_length)) for n in seen], dtype=scores.dtype)
        return scores * factor.to(scores.device)[:, None]

    return [(scores_name(layer), hook) for layer in range(model.spec.n_layers)]


def plan_and_hooks(model, config: DecodingConfig):
    """(the plan program's tokens, the direct hooks' tokens, vanilla's tokens) on the bridge."""
    ours = generate(model, PROMPT, config, backend="bridge").tokens
    vanilla = config.replace(method="vanilla")
    with observe(model, hooks=direct_logn(model, config.params.train_length)):
        direct = generate(model, PROMPT, vanilla, backend="bridge").tokens
    return ours, direct, generate(model, PROMPT, vanilla, backend="bridge").tokens


def test_logn_as_a_plan_equals_logn_written_as_bridge_hooks(tiny_llama):
    ours, direct, vanilla = plan_and_hooks(tiny_llama, logn())
    assert ours == direct
    assert ours != vanilla


@pytest.mark.real_model
def test_logn_as_a_plan_equals_bridge_hooks_on_the_default_model(real_model):
    ours, direct, vanilla = plan_and_hooks(real_model, logn(16).replace(max_new_tokens=12))
    assert ours == direct
    assert ours != vanilla


def test_logn_scales_the_prefill_and_every_pass_and_reads_no_heads(tiny_llama):
    config = logn()
    every = Scale(range(tiny_llama.spec.n_layers), log_n=SHORT)
    assert LogN.prefill_scale(config, tiny_llama.spec.n_layers) == every
    assert config.changes_prefill  # whatever the length: it never shares vanilla's prefill
    assert logn(LogN.Params().train_length).changes_prefill
    method = REGISTRY["logn"](config, None, tiny_llama.spec)
    assert method.plain.scale == every and method.warmup_plan is method.plain
    assert method.plain.bias is None and method.plain.reads == () and not method.uses_heads
    assert LogN.Params().train_length == 32768  # Qwen2.5's native context


@pytest.mark.parametrize("value, words", [
    (1, "train_length must be an integer"),
    (0, "train_length must be an integer"),
    (-5, "train_length must be an integer"),
    (2.5, "'train_length' must be int"),
    ("4096", "'train_length' must be int"),
    (True, "'train_length' must be int"),
    (None, "'train_length' must be int"),
])
def test_bad_parameters_are_one_line_before_any_model_loads(value, words, no_model):
    with pytest.raises(ConfigError, match=re.escape(words)) as caught:
        DecodingConfig(method="logn", params={"train_length": value})
    assert "\n" not in str(caught.value) and str(caught.value).startswith("method 'logn'")
