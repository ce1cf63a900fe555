"""Typed, validated decoding configurations: DySCO, its baselines and ablations, and presets."""

from __future__ import annotations

import dataclasses
import json
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dysco_interp.checks import brief, check_bool, check_int, check_type
from dysco_interp.decoding import baselines  # noqa: F401  (registers the field's methods beside the built-in ones)
from dysco_interp.decoding.choices import DEFAULT_PRESET, PRESET_NAMES, MethodName
from dysco_interp.decoding.methods import (
    FLAT_DEFAULTS,
    FLAT_FIELDS,
    METHODS,
    REGISTRY,
    Method,
    SelectionParams,
    check_flat,
    flat_name,
    param_name,
)
from dysco_interp.decoding.params import MethodParams
from dysco_interp.decoding.sampling import GREEDY, SamplingConfig
from dysco_interp.errors import ConfigError

_UNSET: Any = object()  # the method not given: its field's default

# the layer count a method's prefill scale is asked with before any model is known (`changes_prefill`)
ANY_DEPTH = 1024


@dataclass(frozen=True, init=False)
class DecodingConfig:
    """One decoding method, its typed parameters (`params`, an instance of the method's `Params`)
    and the settings every method shares. The defaults are the `small-budget` preset's
    (`choices.DEFAULT_PRESET`, every command's default too); `preset("paper")` gives the paper's.

    Every value is checked on construction: a wrong type or range is a ConfigError naming it
    (`DecodingConfig(params=SelectionParams(beta="2"))`, `DecodingConfig(warmup=True)`).

    Change parameters with `with_params` (`preset("paper").with_params(select_k=8)`) and shared
    settings with `replace`; read them as `config.params.beta`, or `config.parameter(name)` for
    one the method may lack (its built-in owner's default then).

    The older flat spelling still works for one release, with a notice, mapped into and out of
    `params`: `DecodingConfig(beta=2.0)`, `config.replace(top_k=4)`, `config.beta`, and
    `options=` for a method's other parameters. A flat parameter given to a method that has none
    of that name (`DecodingConfig(method="vanilla", beta=2.0)`, one spelling for several methods)
    is checked as the built-in method that has it checks it and kept in `unowned`, which
    equality, the repr and records see, and which `replace(method=...)` hands to a method that
    has it.
    """

    method: MethodName = "dysco"
    warmup: int = 8  # T_w: the prefill stops T_w + n_gen tokens before the prompt's end
    max_new_tokens: int = 256
    sampling: SamplingConfig = field(default=GREEDY)
    record_positions: bool = False  # keep every step's selected positions in the trace
    enable_thinking: bool | None = None  # forwarded to the chat template (Qwen3-style)
    # the method's `Params` with every default filled in (None: it declares none)
    params: MethodParams | None = None
    # for one release: flat parameters given that the method does not have, away from their
    # defaults, as sorted (name, value) pairs. Compared, so that two configs equal as flat fields
    # stay equal and two that differ stay apart, as they did when every parameter was a field.
    unowned: tuple[tuple[str, Any], ...] = ()

    def __init__(self, method: Any = _UNSET, *, params: Any = None, options: Any = (), unowned: Any = (),
                 **settings: Any):
        flat = {name: settings.pop(name) for name in list(settings) if name in FLAT_FIELDS}
        older_spelling("DecodingConfig", flat, options)
        self._build(method, params, options, unowned, flat, settings)

    @classmethod
    def _made(cls, method: Any = _UNSET, *, params: Any = None, options: Any = (), unowned: Any = (),
              **settings: Any) -> "DecodingConfig":
        # what replace and preset build: their callers' spelling has had its notice already
        flat = {name: settings.pop(name) for name in list(settings) if name in FLAT_FIELDS}
        made = object.__new__(cls)
        made._build(method, params, options, unowned, flat, settings)
        return made

    def _build(self, method: Any, params: Any, options: Any, unowned: Any, flat: dict[str, Any],
               settings: dict[str, Any]) -> None:
        unknown = sorted(set(settings) - set(SHARED_FIELDS))
        if unknown:
            raise TypeError(f"DecodingConfig got an unexpected keyword argument {unknown[0]!r}")
        shared = {name: settings.get(name, f.default) for name, f in SHARED_FIELDS.items()}
        shared["method"] = SHARED_FIELDS["method"].default if method is _UNSET else method
        for name, value in shared.items():
            object.__setattr__(self, name, value)
        if not isinstance(self.method, str) or self.method not in METHODS:
            raise ConfigError(f"unknown method {brief(self.method)}; choose one of {', '.join(METHODS)}")
        check_int("warmup", self.warmup, minimum=0)
        check_int("max_new_tokens", self.max_new_tokens, minimum=1)
        check_type("sampling", self.sampling, SamplingConfig)
        check_bool("record_positions", self.record_positions)
        check_bool("enable_thinking", self.enable_thinking, allow_none=True)
        flat = {**flat_pairs(unowned), **flat}
        owned = {param_name(k): v for k, v in flat.items() if k in self.strategy.fields}
        object.__setattr__(self, "params", method_params(self.strategy, params, owned, options))
        object.__setattr__(self, "unowned", unowned_values({k: v for k, v in flat.items()
                                                            if k not in self.strategy.fields}))

    def __getattr__(self, name: str) -> Any:
        # only reached for names that are no field: the older flat parameters, for one release
        if name not in FLAT_FIELDS:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        own = param_name(name)
        warnings.warn(f"config.{name} is the older flat spelling and goes in the next release: read "
                      f"config.params.{own}, or config.parameter({own!r}) for a parameter the method may lack",
                      DeprecationWarning, stacklevel=2)
        return self.parameter(own)

    def parameter(self, name: str) -> Any:
        """This run's value of the parameter `name` (as its method's `Params` names it): the
        method's own, else one kept `unowned`, else the default of the built-in method that has
        it. The generic loop reads DySCO's schedule and template masking so for every method."""
        if self.params is not None and name in {f.name for f in dataclasses.fields(self.params)}:
            return getattr(self.params, name)
        flat = flat_name(name)
        if flat in dict(self.unowned):
            return dict(self.unowned)[flat]
        if flat in FLAT_DEFAULTS:
            return FLAT_DEFAULTS[flat][1]
        raise ConfigError(f"method {self.method!r} has no parameter {name!r}, nor does any built-in method")

    def with_params(self, **values: Any) -> "DecodingConfig":
        """A copy with these of its method's parameters changed, the others kept:
        `preset("paper").with_params(select_k=8)`. An unknown name is a ConfigError that lists the
        method's parameters."""
        return self._replaced({"params": values})

    @property
    def strategy(self) -> type[Method]:
        """The method's class in the registry (`decoding.methods`)."""
        return REGISTRY[self.method]

    @property
    def uses_heads(self) -> bool:
        return self.strategy.uses_heads

    @property
    def options(self) -> tuple[tuple[str, Any], ...]:
        """The method's parameters other than the flat ones (`methods.FLAT_FIELDS`), as sorted
        (name, value) pairs: what records keep under "options"."""
        values = {} if self.params is None else self.params.as_dict()
        return tuple((name, values[name]) for name in sorted(self.strategy.options))

    def used_fields(self) -> dict:
        """The fields this method's outputs depend on (sampling as a dict): what a result store
        compares, so that vanilla results stay valid when only DySCO's beta changes."""
        unused = (FLAT_FIELDS - self.strategy.fields) | {"record_positions"}  # the trace, never the tokens
        record = flat_record(self.method, {**vars(self), "sampling": dataclasses.asdict(self.sampling)},
                             self.values())
        return {k: v for k, v in record.items() if k not in unused}

    def record_fields(self) -> dict:
        """The fields a result record keeps for the tables to group by (`flat_record`): all but
        sampling, and the options (as a mapping) only when the method has some."""
        return {k: v for k, v in flat_record(self.method, vars(self), self.values()).items() if k != "sampling"}

    def values(self) -> dict[str, Any]:
        """Every parameter value this config holds, by its record name (`methods.flat_name`): its
        method's and those `unowned`."""
        return {**dict(self.unowned), **as_flat({} if self.params is None else self.params.as_dict())}

    @property
    def temperature(self) -> float:
        """Attention temperature of every head, prefill included (UniAttnS's tau; 1.0 otherwise)."""
        return self.strategy.temperature_of(self)

    @property
    def changes_prefill(self) -> bool:
        """Whether the method scales the prompt's attention too (UniAttnS), so that it cannot share
        a vanilla prefill."""
        # asked before a model is known: at a depth no model reaches, so any layer range a method names exists
        return self.strategy.prefill_scale(self, ANY_DEPTH) is not None

    def replace(self, **changes) -> "DecodingConfig":
        """A copy with `changes`: shared settings, `params`, or (the older spelling) flat parameters
        and `options`. A change of method moves every flat value to the new method or to `unowned`
        (the paper's beta goes from dysco to vanilla and back) and keeps the other parameters the
        two methods share by name; the new method's others take its defaults."""
        older_spelling("replace", {k: v for k, v in changes.items() if k in FLAT_FIELDS}, changes.get("options", ()))
        return self._replaced(changes)

    def _replaced(self, changes: Mapping[str, Any]) -> "DecodingConfig":
        method = changes.get("method", self.method)
        keep: dict[str, Any] = {name: getattr(self, name) for name in SHARED_FIELDS}
        if method == self.method:
            keep.update(params=self.params, unowned=self.unowned)
        else:
            values = self.values()
            flat = {k: v for k, v in values.items() if k in FLAT_FIELDS}
            if "params" in changes:  # given whole: the old flat values stay only where the new method has none
                strategy = REGISTRY.get(method) if isinstance(method, str) else None
                flat = {k: v for k, v in flat.items() if strategy is None or k not in strategy.fields}
            keep.update(params=shared_values(values, method), unowned=flat)
        given = changes.get("params")
        if isinstance(given, Mapping):  # a mapping changes the parameters it names, as with_params does
            kept = keep["params"]
            changes = {**changes, "params": {**(kept.as_dict() if isinstance(kept, MethodParams) else kept or {}),
                                             **given}}
        return DecodingConfig._made(**{**keep, **changes})


# the settings every method shares: DecodingConfig's fields but its parameters
SHARED_FIELDS = {f.name: f for f in dataclasses.fields(DecodingConfig) if f.name not in ("params", "unowned")}
# The flat record's keys in the order DecodingConfig's fields had when they were all flat: stores
# and tables written then keep it (and their JSON, key for key).
RECORD_ORDER = ("method", "beta", "top_p", "top_k", "decay", "warmup", "schedule", "template_masking",
                "top_k_fraction", "tau", "head_seed", "max_new_tokens", "sampling", "record_positions",
                "enable_thinking")
assert set(RECORD_ORDER) == set(SHARED_FIELDS) | FLAT_FIELDS
# what DecodingConfig(...) and replace(...) take: its fields, and for one release the older spelling
KEYWORDS = (*RECORD_ORDER, "options", "params", "unowned")


def with_flat(config: DecodingConfig, values: Mapping[str, Any]) -> DecodingConfig:
    """`config` with flat parameter values given once for several methods (the command line's
    --beta beside --methods vanilla,dysco): the method takes those it has, by their record names,
    and the rest are kept in `unowned`, as records show them."""
    unknown = sorted(set(values) - FLAT_FIELDS)
    if unknown:
        raise ConfigError(f"not flat parameters: {', '.join(unknown)}")
    return config._replaced(dict(values))


def older_spelling(where: str, flat: Mapping[str, Any], options: Any) -> None:
    """The one notice of the older spelling of a method's parameters: flat fields, `options=`."""
    if flat:
        given = ", ".join(f"{name}=" for name in sorted(flat))
        new = ", ".join(f"{param_name(name)}=..." for name in sorted(flat))
        mapping = ", ".join(f"{param_name(name)!r}: ..." for name in sorted(flat))
        warnings.warn(f"{where}({given}) is the older flat spelling of a method's parameters and goes in the next "
                      f"release: give params={{{mapping}}} (or the method's Params) or use config.with_params({new})",
                      DeprecationWarning, stacklevel=3)
    if options not in ((), None) and not (isinstance(options, Mapping) and not options):
        warnings.warn(f"{where}(options=) is the older spelling of params= and goes in the next release",
                      DeprecationWarning, stacklevel=3)


def as_flat(values: Mapping[str, Any]) -> dict[str, Any]:
    """A method's parameter values by their record names (`methods.flat_name`)."""
    return {flat_name(name): value for name, value in values.items()}


def param_values(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Parameter values by their record names (a record's config, a committed choice) by the
    names a method's `Params` gives them: what `preset(..., params=)` and `with_params` take."""
    return {param_name(name): value for name, value in flat.items()}


def flat_pairs(given: Any) -> dict[str, Any]:
    """`unowned` as given ((name, value) pairs or a mapping) as a mapping of flat parameters."""
    try:
        pairs = dict(given.items() if isinstance(given, Mapping) else given)
    except (TypeError, ValueError):
        raise ConfigError(f"unowned must be (name, value) pairs of flat parameters, got {brief(given)}") from None
    unknown = sorted(set(pairs) - FLAT_FIELDS)
    if unknown:
        raise ConfigError(f"unowned holds flat parameters only ({', '.join(sorted(FLAT_FIELDS))}), got {unknown[0]!r}")
    return pairs


def unowned_values(flat: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Flat values of a method that does not have them, checked as each one's built-in owner
    checks it (`methods.check_flat`), as sorted pairs of those away from the owner's default (so
    that a default given and one left out are one config)."""
    check_flat(flat)
    return tuple((name, flat[name]) for name in sorted(flat) if flat[name] != FLAT_DEFAULTS[name][1])


def shared_values(values: Mapping[str, Any], method: Any) -> dict[str, Any]:
    """The non-flat `values` that `method` has parameters of, by name (none for a method unknown
    or without parameters: DecodingConfig then says what is wrong)."""
    strategy = REGISTRY.get(method) if isinstance(method, str) else None
    typed = None if strategy is None else strategy.Params
    names = set() if typed is None else set(typed.defaults())
    return {k: v for k, v in values.items() if k in names and k not in FLAT_FIELDS}


def method_params(strategy: type[Method], params: Any, owned: Mapping[str, Any], options: Any) -> MethodParams | None:
    """The method's `Params` from `params` (its own `Params`, or a mapping of some of their
    values), the flat values given that it has (`owned`) and `options` (its non-flat parameters
    as a mapping, or its `Params`: the spelling before `params`); later ones win. Another
    method's `Params` is a ConfigError."""
    typed, method = strategy.Params, strategy.name
    if typed is not None and type(options) is typed:  # the spelling before `params`: the whole set
        params, options = options, ()
    if isinstance(params, MethodParams):
        if typed is None or type(params) is not typed:
            raise ConfigError(f"params of method {method!r} must be {_params_name(strategy)}, got "
                              f"{type(params).__qualname__}")
        values = params.as_dict()
    elif isinstance(params, Mapping):
        values = dict(params)
    elif params is None:
        values = {}
    else:
        raise ConfigError(f"params of method {method!r} must be {_params_name(strategy)} or a mapping, got "
                          f"{brief(params)}")
    values = checked_values(method, values, json_too=False)
    values.update(owned)
    values.update(checked_options(method, strategy.options, options))
    if typed is None:
        if values:
            raise ConfigError(f"method {method!r} has no parameters (got {sorted(values)[0]!r})")
        return None
    made = typed.of(method, {k: _frozen(v) for k, v in {**typed.defaults(), **values}.items()})
    checked_values(method, made.as_dict())
    return made


def _params_name(strategy: type[Method]) -> str:
    return "None (it has no parameters)" if strategy.Params is None else f"its {strategy.Params.__qualname__}"


def flat_record(method: str, settings: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """The record form of a config: its shared `settings` and its parameter `values` (the
    method's and those unowned), as they were recorded when every parameter was a field of its
    own: the flat parameters beside the settings (at their owners' defaults where not given), the
    method's other parameters under "options" only when it has some. The one place that form is
    made, for new records and for reading configs whose parameters are nested."""
    flat = {name: values.get(name, default) for name, (_, default) in FLAT_DEFAULTS.items()}
    merged = {**settings, **flat, "method": method}
    out = {name: merged[name] for name in RECORD_ORDER if name in merged}
    own = {name: values[name] for name in sorted(values) if name not in FLAT_FIELDS}
    if own:
        out["options"] = own
    return out


def _frozen(value: Any) -> Any:
    return tuple(_frozen(v) for v in value) if isinstance(value, (list, tuple)) else value


# Deeper options are no settings but a way to exhaust the recursion of every function that walks
# them (JSON encoding, hashing, freezing).
MAX_OPTION_DEPTH = 32


def _depth(value: Any) -> int:
    """How deeply lists and mappings nest in `value`, found without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_OPTION_DEPTH:
            break
        if isinstance(item, Mapping):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend((v, depth + 1) for v in item)
    return deepest


def checked_options(method: str, declared: Mapping[str, Any], given: Any) -> dict[str, Any]:
    """`given` (a mapping, (name, value) pairs, or some `MethodParams`) checked against the
    method's declared options: known names, JSON values no deeper than MAX_OPTION_DEPTH."""
    if isinstance(given, MethodParams):
        given = given.as_dict()
    try:
        items = dict(given.items() if isinstance(given, Mapping) else given)
    except (TypeError, ValueError):
        raise ConfigError(f"options must be a mapping of names to values, got {brief(given)}") from None
    unknown = sorted(set(items) - set(declared))
    if unknown:
        known = ", ".join(sorted(declared)) or "none"
        raise ConfigError(f"method {method!r} has no parameter {unknown[0]!r} (its parameters: {known})")
    return checked_values(method, items)


def checked_values(method: str, values: Mapping[str, Any], json_too: bool = True) -> dict[str, Any]:
    """A method's parameter values as records keep them: no deeper than MAX_OPTION_DEPTH and (with
    `json_too`) JSON values (a ConfigError naming the first that is not). Typed `Params` check
    their own types first: the depth alone comes before them, since freezing a value walks it."""
    for name, value in values.items():
        if _depth(value) > MAX_OPTION_DEPTH:
            raise ConfigError(f"parameter {name!r} of method {method!r} is nested more than {MAX_OPTION_DEPTH} "
                              "levels deep; a parameter is a number, a string, or a short list or object")
        if not json_too:
            continue
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError):
            raise ConfigError(f"parameter {name!r} of method {method!r} must be a JSON value, got {brief(value)}") \
                from None
    return dict(values)


def checked_params(method: str, given: Any) -> dict[str, Any]:
    """Some of `method`'s parameter values (as `--params` gives them) checked now as the config
    will check them (`checked_options`, then its `Params`), before any model loads."""
    typed = REGISTRY[method].Params
    declared = {} if typed is None else typed.defaults()
    values = checked_options(method, declared, given)
    if typed is not None:
        typed.of(method, {**declared, **{k: _frozen(v) for k, v in values.items()}})
    return values


# Named parameter sets of DySCO (its `SelectionParams`; a preset given another method keeps what it shares)
PRESETS: dict[str, DecodingConfig] = {
    # the official defaults (Qwen3 / Llama-3.1 releases)
    "paper": DecodingConfig(params=SelectionParams(select_k=4096, beta=2.0)),
    # the paper's other grid point: wider nucleus cap, stronger scaling
    "paper-strong": DecodingConfig(params=SelectionParams(select_p=0.95, select_k=8192, beta=2.5)),
    # the paper's parameter table for 64K-128K with YaRN: the nucleus kept, a larger cap, stronger scaling
    "paper-long": DecodingConfig(params=SelectionParams(select_k=8192, beta=2.5)),
    # the official quick check: top-K only (no nucleus cut), beta 2.5, 128 new tokens
    "quick-check": DecodingConfig(params=SelectionParams(select_p=1.0, select_k=1024, beta=2.5), max_new_tokens=128),
    # chosen on a dev split for Qwen2.5-Coder 0.5B and 1.5B at 2K-8K tokens (figures/budget/), where the
    # paper's nucleus holds hundreds of keys, and again for 1.5B over 2K-128K (figures/paper_regime/):
    # a handful of keys, gently boosted, helps where the paper's settings do not. SelectionParams'
    # defaults are its values, so Python and the command line default to one preset
    "small-budget": DecodingConfig(),
}
assert tuple(PRESETS) == PRESET_NAMES
assert PRESETS[DEFAULT_PRESET] == DecodingConfig()


def preset(name: str, *, params: Mapping[str, Any] | MethodParams | None = None, **changes) -> DecodingConfig:
    """A named DecodingConfig from `PRESETS` ("paper", "paper-strong", "paper-long", "quick-check",
    "small-budget"), with `changes` applied to its shared settings (the method included) and
    `params` to its method's parameters: a mapping changes those it names
    (`preset("paper", params={"beta": 3.0}, max_new_tokens=64)`), a method's `Params` replaces them all."""
    if not isinstance(name, str) or name not in PRESETS:
        raise ConfigError(f"unknown preset {brief(name)}; choose one of {', '.join(PRESETS)}")
    older_spelling("preset", {k: v for k, v in changes.items() if k in FLAT_FIELDS}, changes.get("options", ()))
    return PRESETS[name]._replaced(changes if params is None else {**changes, "params": params})
