"""YaRN rope scaling (the paper's baseline for contexts past the native window): the config
change that applies it, and the suffix it adds to a weights id."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from dysco_interp.errors import ConfigError

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def with_yarn(config: PretrainedConfig, factor: float | None) -> PretrainedConfig:
    """The config with YaRN rope scaling by `factor` (context x factor), or unchanged for None."""
    if factor is None:
        return config
    scaled = scaled_context(int(config.max_position_embeddings), factor)
    rope = dict(getattr(config, "rope_parameters", None) or {})
    if "rope_theta" not in rope:
        raise ConfigError(
            f"YaRN needs one rope setting for every layer; {type(config).__name__} has {sorted(rope)}"
        )
    original = int(config.max_position_embeddings)
    config.rope_parameters = {
        "rope_type": "yarn",
        "rope_theta": rope["rope_theta"],
        "factor": float(factor),
        "original_max_position_embeddings": original,
    }
    config.max_position_embeddings = scaled
    return config


def scaled_context(context: int, factor: float | None) -> int:
    """The context window under YaRN scaling by `factor` (unchanged for None); a ConfigError
    for a factor that is no number > 1."""
    if factor is None:
        return context
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 1 < factor < math.inf:
        raise ConfigError(f"YaRN factor must be a finite number > 1, got {factor!r}")
    return int(context * factor)


def yarn_factor(config: PretrainedConfig) -> float | None:
    """The YaRN factor the config's rope is scaled by, or None."""
    rope = getattr(config, "rope_parameters", None) or {}
    return float(rope["factor"]) if rope.get("rope_type") == "yarn" else None


def yarn_suffix(factor: float | None) -> str:
    """``;yarn=<factor>`` for a weights id recorded before the config change, or ""."""
    return "" if factor is None else f";yarn={float(factor):g}"
