"""Typed, validated decoding configurations: DySCO, its baselines and ablations, and presets."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dysco_interp.checks import brief, check_bool, check_choice, check_int, check_number, check_seed, check_type
from dysco_interp.decoding import relevance
from dysco_interp.decoding.choices import (
    DEFAULT_PRESET,
    MASKING_MODES,
    PRESET_NAMES,
    SCHEDULES,
    MethodName,
    Schedule,
    TemplateMasking,
)
from dysco_interp.decoding.methods import METHOD_FIELDS, METHODS, REGISTRY, Method
from dysco_interp.decoding.params import MethodParams
from dysco_interp.decoding.sampling import GREEDY, SamplingConfig
from dysco_interp.errors import ConfigError

# the layer count a method's prefill scale is asked with before any model is known (`changes_prefill`)
ANY_DEPTH = 1024


@dataclass(frozen=True)
class DecodingConfig:
    """One decoding method and its parameters. The defaults are the `small-budget` preset's
    (`choices.DEFAULT_PRESET`, every command's default too); `preset("paper")` gives the paper's.

    Every field is type-checked on construction: a wrong type or range is a ConfigError naming
    the field (`DecodingConfig(beta="2")`, `DecodingConfig(warmup=True)`).
    """

    method: MethodName = "dysco"
    beta: float = 1.5  # strength: log(beta) added to the selected keys' scores (the paper's: 2.0)
    top_p: float = 0.975  # nucleus mass of the selection
    top_k: int = 8  # cap on the number of selected keys (the paper's: 4096)
    decay: float = 0.75  # momentum d; history weight gamma = d / (1 + d)
    warmup: int = 8  # T_w: the prefill stops T_w + n_gen tokens before the prompt's end
    # "reference": T_w - 1 unbiased warm-up tokens, then n_gen + 1 biased prompt steps (the
    # official code); "paper": T_w unbiased, then the n_gen generation-prompt tokens biased
    schedule: Schedule = "reference"
    # chat-template tokens never selected: the official code's sequences ("reference"), every
    # token outside the messages' contents ("skeleton"), or none ("off")
    template_masking: TemplateMasking = "reference"
    top_k_fraction: float | None = None  # also cap the selection at this share of each prompt
    tau: float = 1.0  # UniAttnS temperature
    head_seed: int = 0  # seed of the random heads (dysco-random)
    max_new_tokens: int = 256
    sampling: SamplingConfig = field(default=GREEDY)
    record_positions: bool = False  # keep every step's selected positions in the trace
    enable_thinking: bool | None = None  # forwarded to the chat template (Qwen3-style)
    # a registered method's own parameters (its `Params`, or a mapping; kept as sorted (name, value)
    # pairs, its defaults filled in): e.g. PASTA's alpha, or dysco-gated's min_mass. `params` gives
    # them back typed.
    options: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self):
        if not isinstance(self.method, str) or self.method not in METHODS:
            raise ConfigError(f"unknown method {brief(self.method)}; choose one of {', '.join(METHODS)}")
        relevance.check_beta(self.beta)
        relevance.check_selection_params(self.top_p, self.top_k)
        relevance.check_decay(self.decay)
        check_int("warmup", self.warmup, minimum=0)
        check_choice("schedule", self.schedule, SCHEDULES)
        check_choice("template_masking", self.template_masking, MASKING_MODES,
                     then=" (the old switch: True is 'skeleton', False is 'off')" if isinstance(
                         self.template_masking, bool) else "")
        relevance.check_top_k_fraction(self.top_k_fraction)
        check_number("tau", self.tau, above=0)
        check_seed("head_seed", self.head_seed)
        check_int("max_new_tokens", self.max_new_tokens, minimum=1)
        check_type("sampling", self.sampling, SamplingConfig)
        check_bool("record_positions", self.record_positions)
        check_bool("enable_thinking", self.enable_thinking, allow_none=True)
        object.__setattr__(self, "options", method_options(self.method, self.strategy.options, self.options))
        self.strategy.check_options(dict(self.options))

    @property
    def strategy(self) -> type[Method]:
        """The method's class in the registry (`decoding.methods`)."""
        return REGISTRY[self.method]

    @property
    def uses_heads(self) -> bool:
        return self.strategy.uses_heads

    @property
    def params(self) -> MethodParams | None:
        """The method's typed parameters with this config's values (None: it declares no `Params`)."""
        typed = self.strategy.Params
        return None if typed is None else typed.of(self.method, dict(self.options))

    def used_fields(self) -> dict:
        """The fields this method's outputs depend on (sampling as a dict): what a result store
        compares, so that vanilla results stay valid when only DySCO's beta changes."""
        unused = (METHOD_FIELDS - self.strategy.fields) | {"record_positions"}  # the trace, never the tokens
        if not self.options:
            unused |= {"options"}  # stores written before methods had options stay comparable
        used = {k: v for k, v in dataclasses.asdict(self).items() if k not in unused}
        if "options" in used:
            used["options"] = dict(self.options)
        return used

    def record_fields(self) -> dict:
        """The fields a result record keeps for the tables to group by: all but sampling, and the
        options (as a mapping) only when the method has some, so older records stay comparable."""
        out = {k: v for k, v in vars(self).items() if k not in ("sampling", "options")}
        if self.options:
            out["options"] = dict(self.options)
        return out

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
        return dataclasses.replace(self, **changes)


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


def method_options(method: str, defaults: Mapping[str, Any], given: Any) -> tuple[tuple[str, Any], ...]:
    """`given` (the method's `Params`, a mapping or (name, value) pairs) checked against the
    method's options and completed with their defaults, as sorted pairs; values must be JSON
    (lists become tuples)."""
    if isinstance(given, MethodParams):
        given = given.as_dict()
    try:
        items = dict(given.items() if isinstance(given, Mapping) else given)
    except (TypeError, ValueError):
        raise ConfigError(f"options must be a mapping of names to values, got {brief(given)}") from None
    unknown = sorted(set(items) - set(defaults))
    if unknown:
        known = ", ".join(sorted(defaults)) or "none"
        raise ConfigError(f"method {method!r} has no option {unknown[0]!r} (its options: {known})")
    merged = {**defaults, **items}
    for name, value in merged.items():
        if _depth(value) > MAX_OPTION_DEPTH:
            raise ConfigError(f"option {name!r} of method {method!r} is nested more than {MAX_OPTION_DEPTH} "
                              "levels deep; an option is a number, a string, or a short list or object")
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError):
            raise ConfigError(f"option {name!r} of method {method!r} must be a JSON value, got {brief(value)}") \
                from None
    return tuple((name, _frozen(merged[name])) for name in sorted(merged))


PRESETS: dict[str, DecodingConfig] = {
    # the official defaults (Qwen3 / Llama-3.1 releases)
    "paper": DecodingConfig(top_k=4096, beta=2.0),
    # the paper's other grid point: wider nucleus cap, stronger scaling
    "paper-strong": DecodingConfig(top_p=0.95, top_k=8192, beta=2.5),
    # the paper's parameter table for 64K-128K with YaRN: the nucleus kept, a larger cap, stronger scaling
    "paper-long": DecodingConfig(top_k=8192, beta=2.5),
    # the official quick check: top-K only (no nucleus cut), beta 2.5, 128 new tokens
    "quick-check": DecodingConfig(top_p=1.0, top_k=1024, beta=2.5, max_new_tokens=128),
    # chosen on a dev split for Qwen2.5-Coder 0.5B and 1.5B at 2K-8K tokens (figures/budget/), where the
    # paper's nucleus holds hundreds of keys, and again for 1.5B over 2K-128K (figures/paper_regime/):
    # a handful of keys, gently boosted, helps where the paper's settings do not. DecodingConfig's
    # defaults are its values, so Python and the command line default to one preset
    "small-budget": DecodingConfig(),
}
assert tuple(PRESETS) == PRESET_NAMES
assert PRESETS[DEFAULT_PRESET] == DecodingConfig()


def preset(name: str, **changes) -> DecodingConfig:
    """A named DecodingConfig from `PRESETS` ("paper", "paper-strong", "paper-long", "quick-check", "small-budget"),
    with `changes` applied to its fields, e.g. `preset("paper", beta=3.0, max_new_tokens=64)`."""
    if not isinstance(name, str) or name not in PRESETS:
        raise ConfigError(f"unknown preset {brief(name)}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name].replace(**changes)
