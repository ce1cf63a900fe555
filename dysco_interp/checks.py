"""Type and range checks shared by the Python API and the command line.

Each range is defined once, here: the configs (`DecodingConfig`, `SamplingConfig`) call
these functions, and the command line's argument types (`argtypes.py`) wrap them, so
`--seed 1e30` and `SamplingConfig(seed=10**30)` are refused with the same words.
"""

from __future__ import annotations

import math
import operator
import reprlib
from typing import Any

from dysco_interp.errors import ConfigError

# torch.Generator.manual_seed takes 64 bits; a signed range also fits every other consumer
# (numpy, JSON readers that parse int64, result stores).
MAX_SEED = 2**63 - 1

_BRIEF = reprlib.Repr()
_BRIEF.maxstring = 60
_BRIEF.maxother = 60
_BRIEF.maxlevel = 3


def brief(value: Any) -> str:
    """A short repr for error messages: a 100 000-item or 100 000-deep value stays one short line."""
    return _BRIEF.repr(value)


def typed(value: Any) -> str:
    """`brief`, with the type in front where the repr alone does not show it (not for '2', None, [1])."""
    if type(value) in (str, bytes, bool, int, float, list, dict, tuple, type(None)):
        return brief(value)
    return f"{type(value).__name__} {brief(value)}"


def check_type(name: str, value: Any, expected: type | tuple[type, ...], *, example: str | None = None,
               then: str | None = None, allow_none: bool = False) -> Any:
    """`value` if it is an instance of `expected` (or None with `allow_none`), else a ConfigError:
    "{name} must be a {Type} ({example}), got {value}{then}"."""
    if (allow_none and value is None) or isinstance(value, expected):
        return value
    kinds = expected if isinstance(expected, tuple) else (expected,)
    names = " or ".join(k.__name__ for k in kinds)
    article = "an" if names[0].lower() in "aeiou" else "a"
    hint = f" ({example})" if example else ""
    raise ConfigError(f"{name} must be {article} {names}{hint}, got {typed(value)}{then or ''}")


def is_int(value: Any) -> bool:
    """An integer (numpy integers included), never a bool: True as a count is always a mistake."""
    if isinstance(value, (bool, str, bytes, float)):
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def _range_words(minimum, maximum) -> str:
    if minimum is not None and maximum is not None:
        return f" in {minimum}..{maximum}"
    if minimum is not None:
        return f" >= {minimum}"
    if maximum is not None:
        return f" <= {maximum}"
    return ""


def check_int(name: str, value: Any, minimum: int | None = None, maximum: int | None = None) -> int:
    """`value` as an int, or a ConfigError naming `name` and the allowed range."""
    if not is_int(value):
        raise ConfigError(f"{name} must be an integer{_range_words(minimum, maximum)}, got {typed(value)}")
    v = operator.index(value)
    if (minimum is not None and v < minimum) or (maximum is not None and v > maximum):
        raise ConfigError(f"{name} must be an integer{_range_words(minimum, maximum)}, got {v}")
    return v


def check_seed(name: str, value: Any) -> int:
    return check_int(name, value, 0, MAX_SEED)


def check_number(
    name: str, value: Any, *, above: float | None = None, at_least: float | None = None,
    at_most: float | None = None, below: float | None = None,
) -> float:
    """A finite real number (not a bool, not a string) within the given bounds."""
    bounds = []
    if above is not None:
        bounds.append(f"> {above:g}")
    if at_least is not None:
        bounds.append(f">= {at_least:g}")
    if at_most is not None:
        bounds.append(f"<= {at_most:g}")
    if below is not None:
        bounds.append(f"< {below:g}")
    words = f"a finite number{' ' + ' and '.join(bounds) if bounds else ''}"
    if isinstance(value, (bool, str, bytes)) or value is None:
        raise ConfigError(f"{name} must be {words}, got {typed(value)}")
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{name} must be {words}, got {typed(value)}") from None
    if (
        not math.isfinite(v)
        or (above is not None and not v > above)
        or (at_least is not None and not v >= at_least)
        or (at_most is not None and not v <= at_most)
        or (below is not None and not v < below)
    ):
        raise ConfigError(f"{name} must be {words}, got {value!r}")
    return v


def check_bool(name: str, value: Any, allow_none: bool = False) -> bool | None:
    if value is None and allow_none:
        return None
    if not isinstance(value, bool):
        also = " or None" if allow_none else ""
        raise ConfigError(f"{name} must be True or False{also}, got {typed(value)}")
    return value


def check_choice(name: str, value: Any, choices: tuple[str, ...], then: str = "") -> str:
    """`value` if it is one of the string `choices`, else a ConfigError naming them."""
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(repr(c) for c in choices)}, got {typed(value)}{then}")
    return value


def check_parts(parts: Any, known: tuple[str, ...]) -> None:
    """A study's parts, each one of `known`: else one ConfigError naming the unknown ones and the choices."""
    unknown = set(parts) - set(known)
    if unknown:
        raise ConfigError(f"unknown part(s) {sorted(unknown)}; choose from {', '.join(known)}")


__all__ = ["MAX_SEED", "brief", "typed", "check_bool", "check_choice", "check_int", "check_number", "check_parts",
           "check_seed", "is_int"]

