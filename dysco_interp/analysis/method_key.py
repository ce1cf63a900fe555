"""Which decoding method and parameters produced a stored evaluation record.

Labels in result stores are free text ("dysco p=0.9", "uniattns-tau0.85"), so tables
group records by what actually ran: the record's `config`. A `MethodKey` holds the
config method and the parameters that define it: the config fields its method uses and,
for a registered method of one's own, each of its `options` (as "options.NAME"); a
record's *setting* (token budget, thinking flag) says which experiment it belongs to
without changing the method.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

from dysco_interp.decoding import methods
from dysco_interp.decoding.config import PRESETS, RECORD_ORDER, as_flat, flat_record
from dysco_interp.decoding.methods import param_name
from dysco_interp.decoding.params import MethodParams
from dysco_interp.errors import ConfigError

# Keys and labels measure a run against the paper's preset, not DecodingConfig's defaults: the
# committed tables were written so ("DySCO" is the paper's, "DySCO (beta=1.5, K=8)" the small
# budget), and a record that lacks a field was written when the paper's value was the default.
_DEFAULTS = PRESETS["paper"]
# The registry counts the warm-up among the fields every method shares, and rightly: every method's
# prefill stops T_w + n_gen tokens before the prompt's end (loop.prefill_prefix), so every method's
# tokens can move with it bitwise, and `used_fields` keeps it for vanilla too (a store then refuses
# to pool vanilla runs of two warm-ups; methods share a prefill only at one warm-up). But only a
# method that keeps relevance (`uses_heads`: the loop gives it a Selector) reads the warm-up tokens,
# to fill its relevance before the first biased step: T_w is one of its parameters, so its key names
# it. The others are fed the same tokens one at a time instead of prefilled: rounding moves, the
# method does not, so their keys leave it out (vanilla's key stays `MethodKey("vanilla")`).
WARMUP = "warmup"
# How DySCO meets the prompt rather than a knob of the method: a label names them when they are
# not the default, but they do not take a run off the defaults of a table or a robustness curve.
PROTOCOL_FIELDS = ("schedule", "template_masking")
# Records written before a field existed ran what the code did then.
_LEGACY = {"schedule": "paper", "top_k_fraction": None, "template_masking": True}
SETTING_FIELDS = ("max_new_tokens", "enable_thinking")
# the parameters the robustness study varies one at a time
ROBUSTNESS_PARAMS = ("top_p", "top_k", "beta")
# a label shows these whatever their value: no value of theirs is the method's default
ALWAYS_SHOWN = ("tau", "head_seed")
# How a label writes each parameter, in the order keys list them: the order the committed tables
# were written in (their JSON keeps it), then any other field in DecodingConfig's order.
SYMBOLS = {"beta": "beta", "top_p": "p", "top_k": "K", "top_k_fraction": "K/n", "decay": "decay", "warmup": "T_w",
           "schedule": "schedule", "template_masking": "template masking", "tau": "tau", "head_seed": "head seed"}
_FIELD_ORDER = tuple(dict.fromkeys([*SYMBOLS, *RECORD_ORDER]))
# a key's entry for a method's own option NAME is "options.NAME": no config field's name, whatever NAME is
OPTION_PREFIX = "options."
_NO_DEFAULT = object()  # an option the method no longer declares: every value of it is shown
NAMES = {"vanilla": "vanilla", "uniattns": "UniAttnS", "dysco": "DySCO", "dysco-static": "DySCO static",
         "dysco-random": "DySCO random heads", "dysco-reuse": "DySCO reuse"}


def key_fields(method: str) -> tuple[str, ...]:
    """The config fields that identify a run of a registered `method`: its own fields in the
    method registry, and the warm-up if it keeps relevance (see WARMUP). Read from the registry
    at each call, so a method registered later has its key too."""
    strategy = methods.REGISTRY[method]
    used = strategy.fields | ({WARMUP} if strategy.uses_heads else set())
    return tuple(name for name in _FIELD_ORDER if name in used)


def _masking(value: Any) -> str:
    # before masking had modes it was a switch: on meant every non-content token (today's "skeleton")
    if isinstance(value, bool):
        return "skeleton" if value else "off"
    return str(value)


def _fraction(value: Any) -> float:
    return 0.0 if value is None else float(value)  # 0: no cap by share (None would not sort)


# the fields whose stored spelling is not their type's; the rest read as their default's type
_READERS: dict[str, Callable[[Any], Any]] = {"template_masking": _masking, "top_k_fraction": _fraction}


def default_value(name: str) -> Any:
    """The paper's value of a decoding parameter by its record name (its preset's): what keys
    compare against."""
    return _DEFAULTS.parameter(param_name(name)) if name in methods.FLAT_FIELDS else getattr(_DEFAULTS, name)


def _reader(name: str) -> Callable[[Any], Any]:
    if name in _READERS:
        return _READERS[name]
    kind = type(default_value(name))
    return kind if kind in (int, float, str) else (lambda value: value)  # 2 and 2.0 are one beta


def _normalise(name: str, value: Any) -> Any:
    try:
        return _reader(name)(value)
    except (TypeError, ValueError):
        raise ConfigError(f"config field {name!r} has an invalid value {value!r}") from None


def _thawed(value: Any) -> Any:
    return [_thawed(v) for v in value] if isinstance(value, tuple) else value


def format_value(name: str, value: Any) -> str:
    if isinstance(value, tuple):  # an option's list, as it was given: JSON
        return json.dumps(_thawed(value), separators=(",", ":"))
    return f"{value:g}" if isinstance(value, float) else str(value)


def _option_value(value: Any, default: Any = None) -> Any:
    # hashable (a key is a dict key: lists become tuples), and 1 and 1.0 one value where the default is a float
    if isinstance(value, (list, tuple)):
        return tuple(_option_value(v) for v in value)
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _option_value(v)) for k, v in value.items()))
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def option_defaults(method: str) -> dict[str, Any]:
    """A registered method's own options and their defaults, as key entries ("options.NAME")."""
    declared = methods.REGISTRY[method].options
    return {OPTION_PREFIX + name: _option_value(value, value) for name, value in declared.items()}


def _option_params(method: str, config: Mapping) -> tuple[tuple[str, Any], ...]:
    stored = config.get("options") or {}
    if not isinstance(stored, Mapping):
        try:  # a DecodingConfig's own form: (name, value) pairs
            stored = dict(stored)
        except (TypeError, ValueError):
            raise ConfigError(f"config field 'options' has an invalid value {stored!r}") from None
    declared = methods.REGISTRY[method].options
    # an option the record has and the method no longer declares still tells its runs apart
    names = sorted(set(declared) | {str(name) for name in stored})
    return tuple((OPTION_PREFIX + name, _option_value(stored[name] if name in stored else declared[name],
                                                      declared.get(name))) for name in names)


def flattened(config: Mapping) -> Mapping:
    """A config whose method's parameters are nested (`{"method", ..., "params", "unowned"}`: a
    DecodingConfig's `vars` or `asdict`) in the flat form records keep (`config.flat_record`). A
    flat config, or one of a method not registered, is returned as it is."""
    if "params" not in config or config.get("method") not in methods.REGISTRY:
        return config
    params = config["params"]
    values = params.as_dict() if isinstance(params, MethodParams) else dict(params or {})
    return flat_record(config["method"], config, {**dict(config.get("unowned") or ()), **as_flat(values)})


def _stored(config: Mapping, name: str) -> Any:
    if name in config:
        return default_value(name) if config[name] is None and name not in _LEGACY else config[name]
    return _LEGACY[name] if name in _LEGACY else default_value(name)


@dataclass(frozen=True, order=True)
class MethodKey:
    method: str
    params: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def from_config(cls, config: object) -> MethodKey:
        if not isinstance(config, Mapping) or "method" not in config:
            raise ConfigError("the record has no config with a 'method'; tables need what ran, not only its label")
        method = config["method"]
        if not isinstance(method, str) or method not in methods.REGISTRY:
            raise ConfigError(f"unknown config method {method!r}; expected one of {', '.join(methods.REGISTRY)} "
                              "(a method of your own: the scripts that read stores take --methods-from FILE.py, "
                              "the file that registers it; in Python, import that file before reading its records)")
        config = flattened(config)
        params = tuple((name, _normalise(name, _stored(config, name))) for name in key_fields(method))
        return cls(method, params + _option_params(method, config))

    def value(self, name: str) -> Any:
        return dict(self.params)[name]

    def deviations(self, protocol: bool = True) -> dict[str, Any]:
        """Parameters that differ from the defaults (head seeds and tau are not defaults); the
        schedule and template masking too unless `protocol` is False."""
        skip = ALWAYS_SHOWN if protocol else (*ALWAYS_SHOWN, *PROTOCOL_FIELDS)
        return {k: v for k, v in self.params if k not in skip and v != self._default(k)}

    def _default(self, name: str) -> Any:
        if name.startswith(OPTION_PREFIX):
            defaults = option_defaults(self.method) if self.method in methods.REGISTRY else {}
            return defaults.get(name, _NO_DEFAULT)
        return _normalise(name, default_value(name))

    @property
    def is_default(self) -> bool:
        """At the default parameters, whatever its schedule and template masking."""
        return not self.deviations(protocol=False)

    def scaling_params(self) -> tuple[tuple[str, Any], ...]:
        """The DySCO parameters shared by the ablation variants (head seed left out)."""
        return tuple((k, v) for k, v in self.params if k != "head_seed")

    @property
    def label(self) -> str:
        name = NAMES.get(self.method, self.method)
        if self.method == "uniattns":
            return f"{name} (tau={format_value('tau', self.value('tau'))})"
        extra = [f"{symbol(k)}={format_value(k, v)}" for k, v in self.deviations().items()]
        if self.method == "dysco-random":
            extra.append(f"seed {self.value('head_seed')}")
        return f"{name} ({', '.join(extra)})" if extra else name

    def params_dict(self) -> dict[str, Any]:
        return dict(self.params)


def symbol(name: str) -> str:
    """How a label writes a key entry: a field's symbol, an option's own name."""
    return name.removeprefix(OPTION_PREFIX) if name.startswith(OPTION_PREFIX) else SYMBOLS.get(name, name)


def method_key(record: Mapping) -> MethodKey:
    """What ran: a record's method and its `params` (the method's parameters by their Python
    names), or, in a record written before records kept them, its flat `config`."""
    config, params = record.get("config"), record.get("params")
    if isinstance(params, Mapping) and isinstance(config, Mapping):
        config = {**config, "params": params}
    return MethodKey.from_config(config)


def setting_of(record: Mapping) -> tuple[tuple[str, Any], ...]:
    config = record.get("config") or {}
    return tuple((name, config.get(name)) for name in SETTING_FIELDS)
