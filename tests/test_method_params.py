"""A method with typed parameters is one class: a nested frozen dataclass of defaults, types and
checks, refused in one line before any model loads, recorded with its results, and read back typed."""

import dataclasses
import math

import pytest
import torch

from dysco_interp import Bias, DecodingConfig, Method, MethodParams, PassPlan, generate, register_method
from dysco_interp.checks import check_number
from dysco_interp.decoding import methods
from dysco_interp.decoding.config import with_flat
from dysco_interp.decoding.methods import SelectionParams
from dysco_interp.errors import ConfigError

PROMPT = "You can travel from Paris to Berlin by train. Rome is quiet. " * 3 + "Give a route from Paris to Berlin."


@register_method
class SpanBoost(Method):
    """InstABoost's move: the attention to one sentence of the prompt multiplied by `factor` and
    renormalised in every head of every layer (log factor on its keys)."""

    name = "test-span-boost"
    description = "one sentence's attention times factor, every head"

    @dataclasses.dataclass(frozen=True)
    class Params(MethodParams):
        factor: float = 4.0
        sentence: str = "Rome is quiet."
        layers: list | None = None  # None: every layer

        def check(self):
            check_number("factor", self.factor, above=0)
            if self.layers is not None and not self.layers:
                raise ValueError("layers is None (every layer) or a non-empty list")  # a plain error is one line too

    def __init__(self, config, heads, spec):
        super().__init__(config, heads, spec)
        self.boosted = PassPlan(bias=Bias(self.params.layers or range(spec.n_layers)))

    def start(self, model, batch):
        span = torch.zeros(batch.ids.shape, dtype=torch.bool)
        for row, (prepared, pad) in enumerate(zip(batch.prepared, batch.pads)):
            at = prepared.text.find(self.params.sentence)
            start, end = prepared.encoded.token_span(at, at + len(self.params.sentence))
            span[row, pad + start:pad + end] = True
        self.span = span.to(model.device)

    def step(self, run, n_keys):
        span = torch.nn.functional.pad(self.span, (0, n_keys - self.span.shape[-1]))
        values = torch.where(span, math.log(self.params.factor), 0.0)[:, None, None, :]
        return run(self.boosted.with_bias(values)).logits, None


def test_typed_parameters_are_checked_recorded_and_read_back(tiny_llama):
    config = DecodingConfig(method=SpanBoost.name, params=SpanBoost.Params(factor=8.0), max_new_tokens=6)
    assert config.params == SpanBoost.Params(factor=8.0) and dict(config.options)["factor"] == 8.0
    assert config.record_fields()["options"] == {"factor": 8.0, "layers": None, "sentence": "Rome is quiet."}
    assert "beta" not in config.used_fields()  # no bookkeeping: parameters it does not have never split its stores
    assert DecodingConfig(method=SpanBoost.name, params={"factor": 8}).params.factor == 8  # JSON's 8 is a float
    assert config.with_params(factor=2.0).params == SpanBoost.Params(factor=2.0)
    for bad, message in (({"factor": "8"}, "parameter 'factor' must be float"), ({"factor": 0}, "factor must be"),
                         ({"fator": 2}, "has no parameter 'fator'"), ({"layers": 3}, "parameter 'layers' must be"),
                         ({"layers": []}, "non-empty list")):
        with pytest.raises(ConfigError, match=message):
            DecodingConfig(method=SpanBoost.name, params=bad)
    by_backend = {b: generate(tiny_llama, PROMPT, config, backend=b).tokens for b in ("bridge", "sdpa", "static")}
    assert by_backend["bridge"] == by_backend["sdpa"] == by_backend["static"]
    plain = generate(tiny_llama, PROMPT, DecodingConfig(method="vanilla", max_new_tokens=6))
    assert by_backend["bridge"] != plain.tokens
    gated = DecodingConfig(method="dysco-gated", params={"min_mass": 0.2})
    assert gated.params.min_mass == 0.2 and methods.REGISTRY["dysco-gated"].options == {"min_mass": 0.0}
    # options=, the spelling before params=, for one release with a notice: a Params or a mapping
    with pytest.warns(DeprecationWarning, match="older spelling of params="):
        assert DecodingConfig(method=SpanBoost.name, options=SpanBoost.Params(factor=8.0), max_new_tokens=6) == config
    with pytest.warns(DeprecationWarning, match="older spelling of params="):
        assert DecodingConfig(method="dysco-gated", options={"min_mass": 0.2}) == gated


def test_a_params_class_must_be_a_frozen_dataclass_with_defaults():
    with pytest.raises(ConfigError, match="frozen"):  # not a dataclass of its own: x would be no field
        class Undecorated(Method):
            name = "test-undecorated"

            class Params(MethodParams):
                x: float = 1.0
    with pytest.raises(ConfigError, match="needs a default"):
        class NoDefault(Method):
            name = "test-no-default"

            @dataclasses.dataclass(frozen=True)
            class Params(MethodParams):
                x: float
    with pytest.raises(ConfigError, match="both Params and options"):
        class Both(Method):
            name = "test-both"
            options = {"x": 1.0}

            @dataclasses.dataclass(frozen=True)
            class Params(MethodParams):
                x: float = 1.0
    with pytest.raises(ConfigError, match="declares no Params"):
        _ = methods.REGISTRY["vanilla"](DecodingConfig(method="vanilla"), None, None).params


def flat_notice():
    return pytest.warns(DeprecationWarning, match="older flat spelling")


def test_flat_values_are_owned_or_kept_in_sight():
    # the older flat spelling, for one release with a notice: a flat value the method lacks is
    # checked and kept where equality and records see it
    with flat_notice():
        vanilla = DecodingConfig(method="vanilla", beta=2.0)
    assert vanilla.unowned == (("beta", 2.0),) and vanilla != DecodingConfig(method="vanilla")
    assert vanilla == with_flat(DecodingConfig(method="vanilla"), {"beta": 2.0})  # one value for several methods
    assert vanilla.record_fields()["beta"] == 2.0 and "beta" not in vanilla.used_fields()
    with flat_notice():
        assert DecodingConfig(method="vanilla", beta=1.5) == DecodingConfig(method="vanilla")  # a default is no change
    assert vanilla.replace(method="dysco").params.beta == 2.0
    with flat_notice(), pytest.raises(ConfigError, match="beta must be"):
        DecodingConfig(method="vanilla", beta=-1)
    with pytest.raises(ConfigError, match="has no parameter 'beta'"):  # the typed spelling is strict
        DecodingConfig(method="uniattns", params={"beta": 2.0})
    with pytest.raises(ConfigError, match="must be its UniAttnS.Params"):
        DecodingConfig(method="uniattns", params=methods.SelectionParams())

    class Older(Method):  # declared the older way: its flat fields are checked as DySCO checks them
        name = "test-older"
        fields = frozenset({"beta"})
        options = {"x": 1}

    register_method(Older)
    with flat_notice(), pytest.raises(ConfigError, match="beta must be"):
        DecodingConfig(method="test-older", beta=-1)
    with pytest.warns(DeprecationWarning) as caught:  # a notice for each older spelling
        older = DecodingConfig(method="test-older", beta=3.0, options={"x": 2})
    notices = [str(w.message) for w in caught]
    assert any("older flat spelling" in n for n in notices) and any("older spelling of params=" in n for n in notices)
    assert older.record_fields()["options"] == {"x": 2}


def test_a_mapping_changes_only_the_parameters_it_names_wherever_it_is_given():
    from dysco_interp.decoding.config import preset

    paper = preset("paper")
    for changed in (paper.replace(params={"beta": 3.0}), paper.with_params(beta=3.0),
                    preset("paper", params={"beta": 3.0})):
        assert changed.params == dataclasses.replace(paper.params, beta=3.0)  # the paper's K 4096 kept
    # a method's Params given whole replace them all
    assert paper.replace(params=SelectionParams(beta=3.0)).params.select_k == SelectionParams().select_k
    # nested or non-JSON values are refused as --params refuses them, one line
    deep: list = []
    for _ in range(40):
        deep = [deep]
    with pytest.raises(ConfigError, match="nested more than 32 levels"):
        DecodingConfig(method="dysco-gated").with_params(min_mass=deep)
