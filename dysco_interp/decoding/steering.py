"""Your own steering method in a few lines: a selection rule, a bias rule, the layers and heads.

`SteeringMethod` is a `methods.Method` whose step is one of three shapes (`step_shape`):
- "read-then-bias": a pass that reads the heads and stops after the deepest one (nothing
  cached), then the whole model with the bias (DySCO's shape, two passes);
- "read-while-biasing": one pass that reads the heads and, from the first layer after them,
  applies the bias its read gives (dysco-reuse's shape; every biased layer must come after the read);
- "bias-only": no read; the bias comes from the prompt alone (PASTA's shape).

Override what differs from DySCO: `select(relevance, n_keys)` (relevance -> selected keys;
`self.never_selected` holds the keys no selection should take: pads and template tokens),
`bias(selected)` or `bias(selected, relevance)` (keys, and the running relevance for a graded
bias, -> the additive bias), `bias_layers()` and `bias_heads()` (where it applies);
`start(model, batch)` prepares per-prompt data. Register the class under its name
(`register_method`) and it runs in `generate`, `generate_batch`, `evaluate` and the replay, on
every backend, in batches, with CUDA graphs on the static backend; its `Params` are recorded
with its results like any other setting (subclass `SelectionParams` to keep DySCO's beside its own).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import TYPE_CHECKING, ClassVar, Literal, get_args

import torch

from dysco_interp.decoding import relevance
from dysco_interp.decoding.methods import HeadReads, Method, SelectionParams, checked_heads
from dysco_interp.decoding.plan import Bias, PassPlan, head_pairs
from dysco_interp.deprecation import warn_deprecated
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet
from dysco_interp.models import LoadedModel, ModelSpec

if TYPE_CHECKING:
    from dysco_interp.decoding.methods import Run
    from dysco_interp.decoding.params import RunSettings
    from dysco_interp.decoding.plan import ReadOut

StepShape = Literal["read-then-bias", "read-while-biasing", "bias-only"]
STEP_SHAPES: tuple[StepShape, ...] = get_args(StepShape)
# the older declaration, `passes`, counted the step's passes; each count names one shape
SHAPE_OF_PASSES: dict[str, StepShape] = {"two": "read-then-bias", "one": "read-while-biasing", "none": "bias-only"}


def selection_of(mask: torch.Tensor, scores: torch.Tensor | None = None) -> relevance.Selection:
    """A `Selection` (what the trace records) of a bool `[B, n_keys]` mask; its mass is the
    relevance `scores` hold there (0 without scores)."""
    mass = (scores.float() * mask).sum(-1) if scores is not None else torch.zeros(mask.shape[0], device=mask.device)
    return relevance.Selection(mask, mask.sum(-1), mass)


class SteeringMethod(Method):
    """A steering method built from a selection rule and a bias rule (see the module docstring).

    The defaults are DySCO's: the QRHeads' running relevance, nucleus-then-K selection, log(beta)
    on the selected keys in every head of every layer, read then biased in two passes.
    """

    step_shape: ClassVar[StepShape] = "read-then-bias"
    uses_heads = True
    Params = SelectionParams

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "passes" in cls.__dict__:
            cls.step_shape = shape_of_passes(cls)
        if "uses_heads" not in cls.__dict__:  # a method that reads nothing needs no heads
            cls.uses_heads = cls.step_shape != "bias-only"

    def __init__(self, config: RunSettings, heads: HeadSet | None, spec: ModelSpec):
        super().__init__(config, heads, spec)
        if self.step_shape not in STEP_SHAPES:
            raise ConfigError(f"method {self.name!r}: step_shape is {', '.join(map(repr, STEP_SHAPES))}, "
                              f"not {self.step_shape!r}")
        self.reads = None if heads is None or self.step_shape == "bias-only" else HeadReads(heads)
        inline = self.step_shape == "read-while-biasing"  # the biased pass reads the heads itself
        source: Literal["tensor", "rule"] = "rule" if inline else "tensor"
        where = "bias_heads()"
        try:
            chosen = self.bias_heads()
            if chosen is None:
                where = "bias_layers()"
                bias = Bias(self.bias_layers(), source=source)
            else:  # chosen heads name their own layers
                pairs = head_pairs(chosen, "bias_heads()")
                bias = Bias({layer for layer, _ in pairs}, pairs, source=source)
        except ConfigError as e:  # what bias_layers() or bias_heads() returned is not layers or heads
            raise ConfigError(f"method {self.name!r}: {e} (what its {where} returned)") from None
        outside = [layer for layer in bias.layers if not 0 <= layer < spec.n_layers]
        if outside:
            raise ConfigError(f"method {self.name!r} biases layer {outside[0]}, outside the model's {spec.n_layers}")
        self.steered = PassPlan(reads=(self.reads.read,) if self.reads is not None and inline else (),
                                bias=bias).check(spec.n_layers, spec.n_heads)
        self.current: relevance.Selection | None = None
        # a bias() of two parameters is graded: it is given the running relevance too
        self.graded = len(inspect.signature(self.bias).parameters) >= 2

    @classmethod
    def heads_for(cls, config: RunSettings, model: LoadedModel, heads: HeadSet | None) -> HeadSet | None:
        return None if cls.step_shape == "bias-only" else checked_heads(cls.name, model, heads)

    @property
    def warmup_plan(self) -> PassPlan:
        return self.plain if self.reads is None else self.reads.reading

    # ---------------------------------------------------------------- what a researcher overrides

    def select(self, relevance_: torch.Tensor | None, n_keys: int) -> torch.Tensor | relevance.Selection:
        """The keys to bias, bool `[B, n_keys]` (or a `Selection`), from the running relevance
        (None for the "bias-only" shape). Default: DySCO's nucleus-then-K selection."""
        assert self.selector is not None
        return self.selector.select(n_keys)

    def bias(self, selected: torch.Tensor) -> torch.Tensor:
        """The additive bias `[B, 1, 1, n_keys]` from the selected keys. Default: log(beta) on them.
        An override may take a second parameter, `relevance` (float32 `[B, n_keys]`, or None for
        the "bias-only" shape), to grade the bias by it."""
        return relevance.scaling_bias(selected, self.config.parameter("beta"))

    def bias_layers(self) -> Iterable[int]:
        """The layers the bias applies to. Default: every layer."""
        return range(self.spec.n_layers)

    def bias_heads(self) -> Iterable[tuple[int, int]] | None:
        """Only these `(layer, head)` pairs, in their own layers (None: every head of `bias_layers`)."""
        return None

    # ---------------------------------------------------------------- the step

    def _bias(self, selected: torch.Tensor) -> torch.Tensor:
        if not self.graded:
            return self.bias(selected)
        scores = None if self.selector is None else self.selector.relevance
        return self.bias(selected, scores)  # type: ignore[call-arg]

    def _selected(self, n_keys: int) -> relevance.Selection:
        chosen = self.select(None if self.selector is None else self.selector.relevance, n_keys)
        if isinstance(chosen, relevance.Selection):
            return chosen
        if not (isinstance(chosen, torch.Tensor) and chosen.dtype == torch.bool and chosen.ndim == 2
                and chosen.shape[-1] == n_keys):
            raise ConfigError(f"method {self.name!r}: select() must return a bool [batch, {n_keys}] mask")
        scores = None if self.selector is None else self.selector.relevance
        return selection_of(chosen, scores if scores is not None and scores.shape[-1] == n_keys else None)

    def step(self, run: Run, n_keys: int):
        selector = self.selector
        if self.step_shape == "read-while-biasing":
            def rule(read: ReadOut) -> torch.Tensor:
                assert selector is not None
                selector.update(read.attention)
                self.current = self._selected(n_keys)
                return self._bias(self.current.mask)

            assert self.steered.bias is not None
            out = run(PassPlan(reads=self.steered.reads, bias=self.steered.bias.ruled_by(rule)))
        else:
            if self.step_shape == "read-then-bias":
                assert selector is not None and self.reads is not None
                attention = run(self.reads.partial).attention
                assert attention is not None
                selector.update(attention)
            self.current = self._selected(n_keys)
            out = run(self.steered.with_bias(self._bias(self.current.mask)))
        assert out.logits is not None
        return out.logits, self.current


def shape_of_passes(cls: type[SteeringMethod]) -> StepShape:
    """The step shape of a class that declares the older `passes`, with its one notice."""
    name = cls.__dict__.get("name", cls.__name__)
    passes = cls.__dict__["passes"]
    if "step_shape" in cls.__dict__:
        raise ConfigError(f"method {name!r} declares both passes and step_shape: step_shape replaces passes")
    if passes not in SHAPE_OF_PASSES:
        raise ConfigError(f"method {name!r}: passes is 'two', 'one' or 'none', not {passes!r} (and it is "
                          f"deprecated: write step_shape, one of {', '.join(map(repr, STEP_SHAPES))})")
    shape = SHAPE_OF_PASSES[passes]
    # stack: this function, __init_subclass__, then the class statement that declared passes
    warn_deprecated(f"method {name!r}: passes = {passes!r}", f"write step_shape = {shape!r}", stacklevel=3)
    return shape
