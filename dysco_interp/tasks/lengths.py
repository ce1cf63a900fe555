"""Target prompt lengths as users write them: '8k', '0.5k', '1500', '1k,2k,4k'."""

from __future__ import annotations

import math
import re

from dysco_interp.errors import ConfigError
from dysco_interp.tasks.base import check_positive

_LENGTH_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*$")


def parse_length(text: str | int) -> int:
    """'8k' -> 8192, '0.5k' -> 512, '1500' -> 1500 (k means 1024, as in '32K context')."""
    if isinstance(text, int) and not isinstance(text, bool):
        return check_positive("length", text)
    m = _LENGTH_RE.match(str(text))
    if not m:
        raise ConfigError(f"invalid length {text!r}: use a token count such as 1500, 2k or 32K")
    scale = {"": 1, "k": 1024, "m": 1024 * 1024}[m.group(2).lower()]
    value = float(m.group(1)) * scale
    if value < 1 or not math.isfinite(value):
        raise ConfigError(f"invalid length {text!r}: must be at least 1 token")
    return int(round(value))


def length_label(tokens: int) -> str:
    """The inverse of `parse_length` for file names: 8192 -> '8k', 1500 -> '1500'."""
    return f"{tokens // 1024}k" if tokens % 1024 == 0 else str(tokens)


def parse_lengths(text: str) -> list[int]:
    """A comma-separated list of lengths: '1k,2k,4k' -> [1024, 2048, 4096]."""
    parts = [p for p in str(text).split(",") if p.strip()]
    if not parts:
        raise ConfigError("no lengths given: use e.g. --lengths 1k,2k,4k,8k")
    return [parse_length(p) for p in parts]
