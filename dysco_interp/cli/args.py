"""Argument types, the argument parser that every `dysco-interp` subcommand shares, and the
one-line error reporting of `main`.

The ranges come from `checks.py`, the same functions the Python configs call, so a flag and
the config field it fills refuse the same values. Types run while the command line is
parsed: a bad value costs nothing, never a model load.
"""

from __future__ import annotations

import argparse
import os
import sys

from dysco_interp.checks import check_int, check_number, check_seed
from dysco_interp.errors import ConfigError
from dysco_interp.outputs import OutputPathError, check_output_file, check_output_folder, check_output_stem


class ArgumentParser(argparse.ArgumentParser):
    """argparse with its errors on one line.

    Stock argparse prints the whole usage before the message; for `generate` that is a
    dozen lines that bury the one that matters. `--help` still shows the usage.
    """

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _typed(convert, check):
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


positive_int = _typed(_int, lambda v: check_int("value", v, minimum=1))
nonnegative_int = _typed(_int, lambda v: check_int("value", v, minimum=0))
seed = _typed(_int, lambda v: check_seed("value", v))
positive_float = _typed(_float, lambda v: check_number("value", v, above=0))
nonnegative_float = _typed(_float, lambda v: check_number("value", v, at_least=0))
probability = _typed(_float, lambda v: check_number("value", v, above=0, at_most=1))
unit_interval = _typed(_float, lambda v: check_number("value", v, at_least=0, at_most=1))
open_fraction = _typed(_float, lambda v: check_number("value", v, above=0, below=1))
yarn_factor = _typed(_float, lambda v: check_number("value", v, above=1))  # YaRN stretches the context


def devices(text: str):
    """A split over devices, "cuda:0,cuda:1" (`models.placement.parse_devices`)."""
    from dysco_interp.models.placement import parse_devices

    try:
        return parse_devices(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _ints(text: str) -> list[int]:
    return [_int(x) for x in str(text).split(",")]


# comma-separated; text that is no list of integers goes to check_int as it is, which quotes it
positive_ints = _typed(_ints, lambda v: [check_int("value", x, minimum=1) for x in v] if isinstance(v, list)
                       else check_int("value", v, minimum=1))


def _checked(check, text: str) -> str:
    try:
        check(text)
    except OutputPathError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def output_file(text: str) -> str:
    """A file to (over)write: a regular file or a new path, creatable (`outputs.check_output_file`)."""
    return _checked(check_output_file, text)


def output_stem(text: str) -> str:
    """A report's stem: STEM.md, STEM.json (and STEM.png, STEM.html) can each be (over)written."""
    return _checked(check_output_stem, text)


def output_folder(text: str) -> str:
    """A folder to write files in: an existing folder, or a path where one can be created."""
    return _checked(check_output_folder, text)


def one_line(message: object) -> str:
    """A message as one line of stderr: its non-blank lines joined by "; "."""
    return "; ".join(line.strip() for line in str(message).splitlines() if line.strip())


def stdout_to_devnull() -> None:
    """After a broken pipe, point stdout at /dev/null so the flush at exit cannot fail again
    (the recipe in Python's `signal` docs); pytest's captured stdout has no descriptor to swap."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


__all__ = [
    "ArgumentParser",
    "nonnegative_float",
    "nonnegative_int",
    "one_line",
    "open_fraction",
    "output_file",
    "output_folder",
    "output_stem",
    "positive_float",
    "positive_int",
    "probability",
    "seed",
    "stdout_to_devnull",
    "unit_interval",
]
