"""Which decoding method and parameters produced a stored evaluation record.

Labels in result stores are free text ("dysco p=0.9", "uniattns-tau0.85"), so tables
group records by what actually ran: the record's `config`. A `MethodKey` holds the
config method and the parameters that define it; a record's *setting* (token budget,
thinking flag) says which experiment it belongs to without changing the method.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

from dysco_interp.decoding.config import METHODS, DecodingConfig
from dysco_interp.errors import ConfigError

_DEFAULTS = DecodingConfig()
_DYSCO = ("beta", "top_p", "top_k", "top_k_fraction", "decay", "warmup", "schedule", "template_masking")
# How DySCO meets the prompt rather than a knob of the method: a label names them when they are
# not the default, but they do not take a run off the defaults of a table or a robustness curve.
PROTOCOL_FIELDS = ("schedule", "template_masking")
# Records written before a field existed ran what the code did then.
_LEGACY = {"schedule": "paper", "top_k_fraction": None, "template_masking": True}
METHOD_PARAMS: dict[str, tuple[str, ...]] = {
    "vanilla": (),
    "uniattns": ("tau",),
    "dysco": _DYSCO,
    "dysco-static": _DYSCO,
    "dysco-random": _DYSCO + ("head_seed",),
    "dysco-reuse": _DYSCO,
}
SETTING_FIELDS = ("max_new_tokens", "enable_thinking")
# the parameters the robustness study varies one at a time
ROBUSTNESS_PARAMS = ("top_p", "top_k", "beta")
SYMBOLS = {"top_p": "p", "top_k": "K", "top_k_fraction": "K/n", "beta": "beta", "tau": "tau", "decay": "decay",
           "warmup": "T_w", "schedule": "schedule", "template_masking": "template masking", "head_seed": "head seed"}
NAMES = {"vanilla": "vanilla", "uniattns": "UniAttnS", "dysco": "DySCO", "dysco-static": "DySCO static",
         "dysco-random": "DySCO random heads", "dysco-reuse": "DySCO reuse"}


def _masking(value: Any) -> str:
    # before masking had modes it was a switch: on meant every non-content token (today's "skeleton")
    if isinstance(value, bool):
        return "skeleton" if value else "off"
    return str(value)


def _fraction(value: Any) -> float:
    return 0.0 if value is None else float(value)  # 0: no cap by share (None would not sort)


_TYPES: dict[str, Callable[[Any], Any]] = {
    "beta": float, "top_p": float, "top_k": int, "top_k_fraction": _fraction, "decay": float, "warmup": int,
    "schedule": str, "template_masking": _masking, "tau": float, "head_seed": int,
}


def default_value(name: str) -> Any:
    """The paper's default for a decoding parameter (DecodingConfig's field default)."""
    return getattr(_DEFAULTS, name)


def _normalise(name: str, value: Any) -> Any:
    try:
        return _TYPES[name](value)
    except (TypeError, ValueError):
        raise ConfigError(f"config field {name!r} has an invalid value {value!r}") from None


def format_value(name: str, value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


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
        if method not in METHOD_PARAMS:
            raise ConfigError(f"unknown config method {method!r}; expected one of {', '.join(METHODS)}")
        params = tuple((name, _normalise(name, _stored(config, name))) for name in METHOD_PARAMS[method])
        return cls(method, params)

    def value(self, name: str) -> Any:
        return dict(self.params)[name]

    def deviations(self, protocol: bool = True) -> dict[str, Any]:
        """Parameters that differ from the defaults (head seeds and tau are not defaults); the
        schedule and template masking too unless `protocol` is False."""
        skip = ("head_seed", "tau") if protocol else ("head_seed", "tau", *PROTOCOL_FIELDS)
        return {k: v for k, v in self.params if k not in skip and v != _normalise(k, default_value(k))}

    @property
    def is_default(self) -> bool:
        """At the default parameters, whatever its schedule and template masking."""
        return not self.deviations(protocol=False)

    def scaling_params(self) -> tuple[tuple[str, Any], ...]:
        """The DySCO parameters shared by the ablation variants (head seed left out)."""
        return tuple((k, v) for k, v in self.params if k != "head_seed")

    @property
    def label(self) -> str:
        name = NAMES[self.method]
        if self.method == "uniattns":
            return f"{name} (tau={format_value('tau', self.value('tau'))})"
        extra = [f"{SYMBOLS[k]}={format_value(k, v)}" for k, v in self.deviations().items()]
        if self.method == "dysco-random":
            extra.append(f"seed {self.value('head_seed')}")
        return f"{name} ({', '.join(extra)})" if extra else name

    def params_dict(self) -> dict[str, Any]:
        return dict(self.params)


def method_key(record: Mapping) -> MethodKey:
    return MethodKey.from_config(record.get("config"))


def setting_of(record: Mapping) -> tuple[tuple[str, Any], ...]:
    config = record.get("config") or {}
    return tuple((name, config.get(name)) for name in SETTING_FIELDS)
