"""argparse types for numbers, built from the range checks in `checks.py`.

They live outside `cli/` so that a task's spec can declare its `make-data` flags with them
without importing the command line (whose package imports every command, and so the task
registry). `cli.args` re-exports them for the commands.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from dysco_interp.checks import check_int, check_number, check_seed
from dysco_interp.errors import ConfigError


def argument_type(convert: Callable[[str], Any], check: Callable[[Any], Any]) -> Callable[[str], Any]:
    """An argparse type: `convert` the text, then `check` it; both report through argparse."""

    def parse(text: str):
        try:
            value = convert(text)
        except (TypeError, ValueError):
            value = text  # the check names the range and quotes what was given
        try:
            return check(value)
        except ConfigError as e:
            # the checks say "value must be ..."; argparse already names the flag
            raise argparse.ArgumentTypeError(str(e).removeprefix("value ")) from None

    return parse


def _int(text: str) -> int:
    return int(str(text).strip())


def _float(text: str) -> float:
    return float(str(text).strip())


def _ints(text: str) -> list[int]:
    return [_int(x) for x in str(text).split(",")]


positive_int = argument_type(_int, lambda v: check_int("value", v, minimum=1))
nonnegative_int = argument_type(_int, lambda v: check_int("value", v, minimum=0))
seed = argument_type(_int, lambda v: check_seed("value", v))
positive_float = argument_type(_float, lambda v: check_number("value", v, above=0))
nonnegative_float = argument_type(_float, lambda v: check_number("value", v, at_least=0))
probability = argument_type(_float, lambda v: check_number("value", v, above=0, at_most=1))
unit_interval = argument_type(_float, lambda v: check_number("value", v, at_least=0, at_most=1))
open_fraction = argument_type(_float, lambda v: check_number("value", v, above=0, below=1))
yarn_factor = argument_type(_float, lambda v: check_number("value", v, above=1))  # YaRN stretches the context
# comma-separated; text that is no list of integers goes to check_int as it is, which quotes it
positive_ints = argument_type(_ints, lambda v: [check_int("value", x, minimum=1) for x in v] if isinstance(v, list)
                              else check_int("value", v, minimum=1))

__all__ = [
    "argument_type",
    "nonnegative_float",
    "nonnegative_int",
    "open_fraction",
    "positive_float",
    "positive_int",
    "positive_ints",
    "probability",
    "seed",
    "unit_interval",
    "yarn_factor",
]
