"""The decoding methods as programs of pass plans, chosen once from a `DecodingConfig`.

A method builds its `plan.PassPlan`s once (so the static backend captures each once) and says
what one decoding step runs: vanilla and UniAttnS the plain pass; DySCO a partial pass that
reads the QRHeads, then relevance, selection and the biased pass; its ablations change one
piece (a set selected once, random heads, one pass per token with the bias built by a rule).
Every backend runs every plan, so a method never knows which backend it runs on. The running
relevance and the selection live in a `Selector`, the pure math in `relevance.py`; a method that
reads heads makes its own when it begins (`Method.begin`), and nothing outside it builds one.

A researcher's own method is a subclass registered under its name (`register_method`), as each
built-in one is; see `decoding/steering.py` for the pieces most steering methods need.
"""

from __future__ import annotations

import dataclasses
import re
import typing
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from dysco_interp.checks import check_choice, check_number, check_seed
from dysco_interp.decoding import relevance
from dysco_interp.decoding.backends.base import StepOutput
from dysco_interp.decoding.choices import MASKING_MODES, METHOD_NAMES, SCHEDULES, Schedule, TemplateMasking
from dysco_interp.decoding.params import MethodParams, RunSettings, check_params_class, legacy_params_class
from dysco_interp.decoding.plan import Bias, PassPlan, Read, Scale
from dysco_interp.decoding.template import warn_fallback
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet, random_like
from dysco_interp.models import LoadedModel, ModelSpec

if TYPE_CHECKING:
    from dysco_interp.decoding.plan import ReadOut
    from dysco_interp.decoding.prompts import PromptBatch

Run = Callable[[PassPlan], StepOutput]  # one pass of this step's tokens on the backend


@dataclasses.dataclass(frozen=True)
class SelectionParams(MethodParams):
    """DySCO's parameters, shared by its ablations and by `SteeringMethod`: the selection from the
    QRHeads' running relevance and the scaling of the selected keys. The defaults are the
    `small-budget` preset's (`choices.DEFAULT_PRESET`); `config.PRESETS` names the paper's."""

    beta: float = 1.5  # strength: log(beta) added to the selected keys' scores (the paper's: 2.0)
    # select_*, not top_*: sampling's top_p and top_k are another thing (`SamplingConfig`)
    select_p: float = 0.975  # nucleus mass of the selection
    select_k: int = 8  # cap on the number of selected keys (the paper's: 4096)
    decay: float = 0.75  # momentum d; history weight gamma = d / (1 + d)
    k_fraction: float | None = None  # also cap the selection at this share of each prompt
    # "reference": T_w - 1 unbiased warm-up tokens, then n_gen + 1 biased prompt steps (the
    # official code); "paper": T_w unbiased, then the n_gen generation-prompt tokens biased
    schedule: Schedule = "reference"
    # chat-template tokens never selected: the official code's sequences ("reference"), every
    # token outside the messages' contents ("skeleton"), or none ("off")
    template_masking: TemplateMasking = "reference"

    def __post_init__(self) -> None:
        # the checks below test the types too, in the words the flat fields' errors always had
        self.check()
        super().__post_init__()

    def check(self) -> None:
        relevance.check_beta(self.beta)
        relevance.check_selection_params(self.select_p, self.select_k, names=("select_p", "select_k"))
        relevance.check_decay(self.decay)
        check_choice("schedule", self.schedule, SCHEDULES)
        check_choice("template_masking", self.template_masking, MASKING_MODES,
                     then=" (the old switch: True is 'skeleton', False is 'off')" if isinstance(
                         self.template_masking, bool) else "")
        relevance.check_top_k_fraction(self.k_fraction, name="k_fraction")


SELECTION_FIELDS = frozenset(f.name for f in dataclasses.fields(SelectionParams))
# A parameter's name where records (and the older flat spelling) name it otherwise. Records keep
# the older names, so that stores written before and after the rename hold one setting.
RECORD_NAMES = {"select_p": "top_p", "select_k": "top_k", "k_fraction": "top_k_fraction"}
PARAM_NAMES = {flat: name for name, flat in RECORD_NAMES.items()}


def flat_name(param: str) -> str:
    """A parameter's name in records and in the older flat spelling."""
    return RECORD_NAMES.get(param, param)


def param_name(flat: str) -> str:
    """A flat (record) parameter name's name in a method's `Params`."""
    return PARAM_NAMES.get(flat, flat)


# The parameters that were DecodingConfig's own fields before methods owned them, by their record
# names: a record keeps them flat beside the shared settings (and `DecodingConfig(beta=2.0)` still
# sets them, for one release), the other parameters of a method under "options".
FLAT_FIELDS = frozenset(flat_name(name) for name in SELECTION_FIELDS) | {"tau", "head_seed"}
# name -> method: the built-in ones, which register themselves below, then those registered at run time
REGISTRY: dict[str, type[Method]] = {}
METHODS: dict[str, str] = {}  # name -> description
# what `--method NAME` and `--methods A,B` can name: no spaces, commas, quotes or line breaks
METHOD_NAME = re.compile(r"[A-Za-z0-9._-]+")


def register_method(cls: type[Method]) -> type[Method]:
    """Register a method class under `cls.name` (usable as a class decorator), as the built-in
    ones are. Registering the same class again is harmless; another class under a taken name is a
    ConfigError."""
    if not (isinstance(cls, type) and issubclass(cls, Method)):
        raise ConfigError(f"register_method takes a Method subclass, got {cls!r}")
    name = cls.__dict__.get("name")
    if not isinstance(name, str) or not METHOD_NAME.fullmatch(name):
        raise ConfigError(f"a method needs a name of its own, of letters, digits, '.', '_' and '-' only, which a "
                          f"command line can select (got {name!r})")
    taken = REGISTRY.get(name)
    if taken is not None and taken is not cls and not _same_definition(taken, cls):
        raise ConfigError(f"method {name!r} is already registered ({taken.__module__}.{taken.__qualname__})")
    unknown = set(cls.fields) - FLAT_FIELDS
    if unknown:
        raise ConfigError(f"method {name!r} names fields that are no method's ({', '.join(sorted(unknown))}); "
                          "its own parameters go in its `options`")
    REGISTRY[name] = cls
    METHODS[name] = cls.description
    return cls


def with_later_options(stored: Mapping) -> dict:
    """A stored method setting with the options its method has gained since, at their defaults:
    a parameter is added with the default that keeps the method's earlier behaviour, so results
    stored before it existed are results at that default."""
    name, options = stored.get("method"), stored.get("options")
    method = REGISTRY.get(name) if isinstance(name, str) else None
    if method is None or not isinstance(options, Mapping):
        return dict(stored)
    return {**stored, "options": {**{k: v for k, v in method.options.items() if k not in options}, **options}}


def _same_definition(a: type, b: type) -> bool:
    # a notebook cell or a script run twice defines the class anew: the same name in the same module
    return a.__module__ == b.__module__ and a.__qualname__ == b.__qualname__


class Selector:
    """Each row's running relevance over key positions, and the selection made from it.

    `params`: the selection's (`SelectionParams`, or a subclass); `caps`: long `[B]`, each row's
    own key cap (`k_fraction`), or None for `params.select_k`.
    """

    def __init__(self, params: SelectionParams, excluded: torch.Tensor, caps: torch.Tensor | None = None):
        self.params = params
        self.excluded = excluded  # bool [B, capacity]: keys never selected (pads, template tokens)
        self.cap: int | torch.Tensor = params.select_k if caps is None else caps.to(excluded.device)
        self.relevance: torch.Tensor | None = None  # float32 [B, n_keys], rows sum to 1
        self.last: relevance.Selection | None = None  # the latest selection

    def update(self, attention: torch.Tensor) -> None:
        self.relevance = relevance.update_relevance(attention, self.relevance, self.params.decay)

    def select(self, n_keys: int) -> relevance.Selection:
        """Nucleus-then-K selection; excluded keys are never selected."""
        if self.relevance is None:
            raise RuntimeError("no relevance yet: update() with an attention read first")
        self.last = relevance.select_keys(self.relevance, self.params.select_p, self.cap, self.excluded[:, :n_keys])
        return self.last

    def bias(self, mask: torch.Tensor) -> torch.Tensor:
        return relevance.scaling_bias(mask, self.params.beta)


class Method:
    """Vanilla decoding: no intervention. Subclasses override what they change.

    Class attributes describe the method (`name`, `description`, whether it `uses_heads`, its
    typed `Params`); an instance, made fresh for each run by `method_for(config, heads, spec)`,
    holds its plans and whatever state it keeps across steps.
    """

    name: ClassVar[str] = "vanilla"
    description: ClassVar[str] = "no intervention (equals plain decoding)"
    uses_heads: ClassVar[bool] = False  # reads the QRHeads (H*)
    # the method's own typed parameters (`params.MethodParams`, a nested frozen dataclass): the whole
    # declaration of what a run of it can vary; `DecodingConfig.params` holds one, checked when made
    Params: ClassVar[type[MethodParams] | None] = None
    # Both derived from `Params`, for what still reads a record's flat form (`config.record_fields`):
    # the parameters that were DecodingConfig's fields before methods owned them (`FLAT_FIELDS`),
    # and the rest with their defaults. The older way declares these two instead of `Params`
    # (`legacy_params_class` makes its `Params` from them), with `check_options` beside them.
    fields: ClassVar[frozenset[str]] = frozenset()
    options: ClassVar[Mapping[str, Any]] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("name", cls.__name__)
        own = cls.__dict__.get("Params")
        if own is not None:
            check_params_class(name, own)
            if "options" in cls.__dict__ or "fields" in cls.__dict__:
                raise ConfigError(f"method {name!r} declares both Params and options or fields: its Params are its "
                                  "parameters")
            defaults = own.defaults()
            cls.fields = frozenset(flat_name(k) for k in defaults) & FLAT_FIELDS
            cls.options = {k: v for k, v in defaults.items() if flat_name(k) not in FLAT_FIELDS}
        elif "options" in cls.__dict__ or "fields" in cls.__dict__ or (
                "check_options" in cls.__dict__ and getattr(cls.Params, "legacy", False)):
            warnings.warn(f"method {name!r} declares its parameters the older way (fields, options, check_options), "
                          "which goes in the next release: declare them as a nested Params dataclass "
                          "(dysco_interp.decoding.params)", DeprecationWarning, stacklevel=2)
            cls.Params = legacy_params_class(cls, name, cls.fields, dict(cls.options), FLAT_DEFAULTS, check_flat,
                                             param_name)

    def __init__(self, config: RunSettings, heads: HeadSet | None, spec: ModelSpec):
        self.config, self.heads, self.spec = config, heads, spec
        self.plain = PassPlan()
        # bool [B, capacity]: keys no selection should take (each row's pads and the chat template's
        # tokens of `template_masking`), set before `start`; slice `[:, :n_keys]` at a step
        self.never_selected: torch.Tensor | None = None
        # the running relevance of a method that reads heads, and the selection made from it
        self.selector: Selector | None = None

    def begin(self, model: LoadedModel, batch: PromptBatch, never_selected: torch.Tensor) -> None:
        """Called once by the stepper before the first pass: the keys never to select, the relevance
        state of a method that reads heads (`make_selector`), then the method's own `start`."""
        self.never_selected = never_selected
        if self.uses_heads:
            self.selector = self.make_selector(model, batch)
        self.start(model, batch)

    def make_selector(self, model: LoadedModel, batch: PromptBatch) -> Selector:
        """DySCO's running relevance and nucleus-then-K selection over this batch's keys, with the
        selection parameters of this run (those the method lacks at `SelectionParams`' defaults)."""
        config = self.config
        selection = SelectionParams(**{name: config.parameter(name) for name in SELECTION_FIELDS})
        if selection.template_masking == "reference" and any(p.reference_fallback for p in batch.prepared or ()):
            warn_fallback(model.tokenizer)
        caps = None
        if selection.k_fraction is not None:
            caps = relevance.row_caps(batch.lengths, selection.select_k, selection.k_fraction)
        assert self.never_selected is not None
        return Selector(selection, self.never_selected, caps)

    def warmed(self, attention: torch.Tensor | None) -> None:
        """After a context warm-up pass, with its read of the heads (None: it read nothing): a
        method that keeps relevance moves it."""
        if self.selector is not None and attention is not None:
            self.selector.update(attention)

    @classmethod
    def temperature_of(cls, config: RunSettings) -> float:
        """Attention temperature of every head, prefill included (1.0: none)."""
        return 1.0

    @classmethod
    def prefill_scale(cls, config: RunSettings, n_layers: int) -> Scale | None:
        """The logit scale of the prompt's prefill (None: the model's own attention, which any
        method that keeps it shares)."""
        return None

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        """The older way's check of the `options` values (a typed `Params` checks its own): refuse
        bad ones when the config is made, before any model loads."""

    @property
    def params(self) -> MethodParams:
        """This run's values of the method's `Params` (a ConfigError for a method without them)."""
        if self.Params is None or self.config.params is None:
            raise ConfigError(f"method {self.name!r} declares no Params")
        return self.config.params

    def option(self, name: str) -> Any:
        """The value of one of the method's `options` in this run's config."""
        return dict(self.config.options)[name]

    @classmethod
    def heads_for(cls, config: RunSettings, model: LoadedModel, heads: HeadSet | None) -> HeadSet | None:
        """The head set this method reads, checked against the model (None: it reads none)."""
        return None

    @property
    def warmup_plan(self) -> PassPlan:
        """The context warm-up's pass: unbiased; a method with heads reads them (relevance only)."""
        return self.plain

    def start(self, model: LoadedModel, batch: PromptBatch) -> None:
        """Called once before the first pass, with the prompts' rows (e.g. to find spans in them)."""

    def step(self, run: Run, n_keys: int) -> tuple[torch.Tensor, relevance.Selection | None]:
        """One token per row (`n_keys`: the keys its passes see, its own included): (float32
        logits, the selection applied or None)."""
        out = run(self.plain)
        assert out.logits is not None
        return out.logits, None

    def step_values(self) -> list[dict[str, Any]] | None:
        """The method's own values of the step just run, one JSON-able dict per row, kept in the
        trace beside the common fields (`StepRecord.own`); None: it keeps none."""
        return None


register_method(Method)  # vanilla: the base class, which a decorator of its own could not yet name


# The temperatures the paper tried for UniAttnS; tables that compare against it choose tau on this grid.
PAPER_TAUS = (0.975, 0.95, 0.9, 0.85)


@register_method
class UniAttnS(Method):
    name = "uniattns"
    description = "uniform attention temperature tau in every head and layer, prefill included"

    @dataclasses.dataclass(frozen=True)
    class Params(MethodParams):
        tau: float = 1.0  # 1 leaves every attention score as it is: vanilla decoding

        def check(self):
            check_number("tau", self.tau, above=0)

    def __init__(self, config: RunSettings, heads: HeadSet | None, spec: ModelSpec):
        super().__init__(config, heads, spec)
        self.plain = PassPlan(scale=self.prefill_scale(config, spec.n_layers))

    @classmethod
    def temperature_of(cls, config: RunSettings) -> float:
        return config.parameter("tau")

    @classmethod
    def prefill_scale(cls, config: RunSettings, n_layers: int) -> Scale | None:
        tau = config.parameter("tau")
        return None if tau == 1.0 else Scale(range(n_layers), temperature=tau)


def checked_heads(name: str, model: LoadedModel, heads: HeadSet | None) -> HeadSet:
    """The non-empty head set a method that reads heads needs, checked against the model."""
    if heads is None or len(heads) == 0:
        raise ConfigError(f"method {name!r} needs a non-empty head set (H*)")
    return heads.validate_for(model)  # the model, not its spec: its weights can match another name


class HeadReads:
    """The passes that read a head set: the context warm-up's full pass (`reading`) and the
    pass that stops after the deepest head, caching nothing (`partial`)."""

    def __init__(self, heads: HeadSet):
        self.read = Read(tuple(heads))
        self.reading = PassPlan(reads=(self.read,))
        self.partial = PassPlan(reads=(self.read,), stop_after=self.read.max_layer, write_cache=False)


@register_method
class Dysco(Method):
    name = "dysco"
    description = "dynamic attention scaling with the QRHeads"
    uses_heads = True
    Params = SelectionParams

    def __init__(self, config: RunSettings, heads: HeadSet | None, spec: ModelSpec):
        super().__init__(config, heads, spec)
        assert heads is not None
        self.reads = HeadReads(heads)
        self.read, self.partial = self.reads.read, self.reads.partial
        self.biased = PassPlan(bias=Bias(range(spec.n_layers)))

    @classmethod
    def heads_for(cls, config: RunSettings, model: LoadedModel, heads: HeadSet | None) -> HeadSet | None:
        return checked_heads(cls.name, model, heads)

    @property
    def warmup_plan(self) -> PassPlan:
        return self.reads.reading

    @property
    def running(self) -> Selector:
        assert self.selector is not None, "a method that reads heads is begun with a selector"
        return self.selector

    def select(self, run: Run, n_keys: int) -> relevance.Selection:
        """This step's selection: the partial pass reads the QRHeads, the relevance moves, keys are chosen."""
        attention = run(self.partial).attention
        assert attention is not None
        self.running.update(attention)
        return self.running.select(n_keys)

    def step(self, run, n_keys):
        selection = self.select(run, n_keys)
        out = run(self.biased.with_bias(self.running.bias(selection.mask)))
        assert out.logits is not None
        return out.logits, selection


@register_method
class DyscoStatic(Dysco):
    name = "dysco-static"
    description = "DySCO with the set selected once after the context warm-up, then kept"

    def __init__(self, config, heads, spec):
        super().__init__(config, heads, spec)
        self.kept: relevance.Selection | None = None

    def step(self, run, n_keys):
        selector = self.running
        if self.kept is None:
            if selector.relevance is None:  # no context warm-up: select from this token's partial pass
                attention = run(self.partial).attention
                assert attention is not None
                selector.update(attention)
            assert selector.relevance is not None
            self.kept = selector.select(selector.relevance.shape[-1])
        mask = torch.nn.functional.pad(self.kept.mask, (0, n_keys - self.kept.mask.shape[-1]))
        out = run(self.biased.with_bias(selector.bias(mask)))
        assert out.logits is not None
        return out.logits, self.kept


@register_method
class DyscoRandom(Dysco):
    name = "dysco-random"
    description = "DySCO with |H*| random heads (seeded) instead of the QRHeads"

    @dataclasses.dataclass(frozen=True)
    class Params(SelectionParams):
        head_seed: int = 0  # seed of the random heads

        def check(self):
            super().check()
            check_seed("head_seed", self.head_seed)

    @classmethod
    def heads_for(cls, config, model, heads):
        checked = super().heads_for(config, model, heads)
        assert checked is not None
        return random_like(checked, model.spec, seed=config.parameter("head_seed"))


@register_method
class DyscoReuse(Dysco):
    name = "dysco-reuse"
    description = "DySCO in one pass per token: selection from layers 0..L*, bias only in the layers after L*"

    def __init__(self, config, heads, spec):
        super().__init__(config, heads, spec)
        after = range(self.read.max_layer + 1, spec.n_layers)
        # a QRHead in the last layer leaves no layer to bias: the pass only reads
        self.reuse = PassPlan(reads=(self.read,), bias=Bias(after, source="rule")) if after else self.reads.reading

    def step(self, run, n_keys):
        selector = self.running

        def select_bias(read: ReadOut) -> torch.Tensor:
            selector.update(read.attention)
            return selector.bias(selector.select(n_keys).mask)

        if self.reuse.bias is None:
            out = run(self.reuse)
            assert out.reads
            select_bias(out.reads[0])
        else:
            out = run(dataclasses.replace(self.reuse, bias=self.reuse.bias.ruled_by(select_bias)))
        assert out.logits is not None
        return out.logits, selector.last


@register_method
class DyscoGated(Dysco):
    name = "dysco-gated"
    description = "DySCO that scales a step only when its selected keys hold min_mass of the QRHeads' relevance"

    @dataclasses.dataclass(frozen=True)
    class Params(SelectionParams):
        # 0 scales every step (plain DySCO); above 1 none (vanilla's tokens, at DySCO's cost)
        min_mass: float = 0.0

        def check(self):
            super().check()
            check_number("min_mass", self.min_mass, at_least=0)

    def step(self, run, n_keys):
        selector = self.running
        selection = self.select(run, n_keys)
        # a row whose QRHeads spread their relevance thinly gets no bias at all (its own key included),
        # and its trace says that nothing was selected
        on = selection.mass >= self.params.min_mass  # type: ignore[attr-defined]
        self.on = on
        mask = selection.mask & on[:, None]
        out = run(self.biased.with_bias(selector.bias(mask) * on[:, None, None, None].to(torch.float32)))
        assert out.logits is not None
        return out.logits, relevance.Selection(mask, mask.sum(dim=-1), selection.mass * on)

    def step_values(self):
        # whether the gate let the step scale, per row (the trace's selection says what it would have chosen)
        return [{"scaled": bool(v)} for v in self.on.tolist()]


# Up to here only the built-in methods have registered, in the order of `choices.METHOD_NAMES`
# (the command line's, which must answer without importing this module); a researcher's join later
# and own none of what follows.
assert tuple(REGISTRY) == METHOD_NAMES
# the flat parameters of some built-in method; a method declared the older way can only name these
METHOD_FIELDS = frozenset().union(*(cls.fields for cls in REGISTRY.values()))
assert METHOD_FIELDS == FLAT_FIELDS
# the built-in Params that first declares each flat parameter: it checks a value given to a method
# without it, and its declaration (type, default) is the one a method declared the older way gets
FLAT_OWNERS: dict[str, type[MethodParams]] = {
    name: cls.Params for cls in reversed(REGISTRY.values()) if cls.Params is not None for name in sorted(cls.fields)}
# flat name -> (type, default) of the parameter it names in its owner's Params
FLAT_DEFAULTS: dict[str, tuple[Any, Any]] = {
    name: (typing.get_type_hints(owner)[param_name(name)], owner.defaults()[param_name(name)])
    for name, owner in FLAT_OWNERS.items()}


def check_flat(values: Mapping[str, Any]) -> None:
    """Check flat parameter values as their built-in owners check them (a ConfigError in the
    owner's words), wherever they land: a method declared the older way, or `config.unowned`."""
    by_owner: dict[type[MethodParams], dict[str, Any]] = {}
    for name, value in values.items():
        by_owner.setdefault(FLAT_OWNERS[name], {})[param_name(name)] = value
    for owner, given in by_owner.items():
        owner(**{**owner.defaults(), **given})


def method_for(config: RunSettings, heads: HeadSet | None, spec: ModelSpec) -> Method:
    """The method of `config.method` with its plans, fresh for one run (some keep state across steps)."""
    return REGISTRY[config.method](config, heads, spec)
