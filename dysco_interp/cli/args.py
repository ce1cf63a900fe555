"""Argument types, the argument parser that every `dysco-interp` subcommand shares, and the
one-line error reporting of `main`.

The ranges come from `checks.py`, the same functions the Python configs call, so a flag and
the config field it fills refuse the same values. Types run while the command line is
parsed: a bad value costs nothing, never a model load. The numeric types are defined in
`argtypes` (task specs name them too) and re-exported here.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import warnings
from collections.abc import Callable

from dysco_interp.argtypes import (
    nonnegative_float,
    nonnegative_int,
    open_fraction,
    positive_float,
    positive_int,
    positive_ints,
    probability,
    seed,
    unit_interval,
    yarn_factor,
)
from dysco_interp.errors import ConfigError
from dysco_interp.outputs import OutputPathError, check_output_file, check_output_folder, check_output_stem


class ArgumentParser(argparse.ArgumentParser):
    """argparse with its errors on one line.

    Stock argparse prints the whole usage before the message; for `generate` that is a
    dozen lines that bury the one that matters. `--help` still shows the usage.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.checks: list[Callable[[argparse.Namespace], None]] = []

    def add_check(self, check: Callable[[argparse.Namespace], None]) -> None:
        """`check(args)` runs once the whole command line is read, for what one flag's type cannot
        tell alone (a --method name that a --methods-from file registers); it raises
        ArgumentTypeError, which becomes this parser's one-line error."""
        self.checks.append(check)

    def parse_known_args(self, args=None, namespace=None):
        # a subcommand's parser is run through this too (argparse's subparsers action calls it)
        parsed, extras = super().parse_known_args(args, namespace)
        if not extras:  # else the top parser reports what it does not know first
            for check in self.checks:
                try:
                    check(parsed)
                except argparse.ArgumentTypeError as e:
                    self.error(str(e))
        return parsed, extras

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def devices(text: str):
    """A split over devices, "cuda:0,cuda:1" (`models.placement.parse_devices`)."""
    from dysco_interp.models.placement import parse_devices

    try:
        return parse_devices(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _checked(check, text: str) -> str:
    try:
        check(text)
    except OutputPathError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def output_file(text: str) -> str:
    """A file to (over)write: a regular file or a new path, creatable (`outputs.check_output_file`)."""
    return _checked(check_output_file, text)


def html_file(text: str) -> str:
    """An HTML page to (over)write, named so: a browser opens a file by its extension, and one
    without it is not opened as a page."""
    path = output_file(text)
    if not path.lower().endswith((".html", ".htm")):
        raise argparse.ArgumentTypeError(f"{text} has no .html extension, and the page opens in a browser by it: "
                                         f"name it {text}.html")
    return path


def output_stem(text: str) -> str:
    """A report's stem: STEM.md, STEM.json (and STEM.png, STEM.html) can each be (over)written."""
    return _checked(check_output_stem, text)


def output_folder(text: str) -> str:
    """A folder to write files in: an existing folder, or a path where one can be created."""
    return _checked(check_output_folder, text)


def one_line(message: object) -> str:
    """A message as one line of stderr: its non-blank lines joined by "; "."""
    return "; ".join(line.strip() for line in str(message).splitlines() if line.strip())


def out_of_memory(error: BaseException) -> str | None:
    """A device's out-of-memory error as one line, what was asked and what was free (PyTorch's
    allocator advice left out), or None for any other error. torch is not imported for this: an
    error raised before it was is none of its."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(error, torch.OutOfMemoryError):
        return None
    text = one_line(error)
    asked = re.match(r".*?is free\.", text)  # "...Tried to allocate X. GPU 0 has ... of which Y is free."
    return f"the device ran out of memory ({(asked.group(0) if asked else text).rstrip('.')})"


def show_warnings_as_lines(prog: str = "dysco-interp") -> None:
    """From now on in this process, show each DyscoWarning as one line, `PROG: warning: ...`
    (Python's own shows two, the second a line of our source); other warnings as before."""
    from dysco_interp.errors import DyscoWarning

    original = warnings.showwarning
    if getattr(original, "dysco_interp", False):
        return

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, DyscoWarning):
            print(f"{prog}: warning: {one_line(message)}", file=sys.stderr if file is None else file)
        else:
            original(message, category, filename, lineno, file, line)

    show.dysco_interp = True  # type: ignore[attr-defined]
    warnings.showwarning = show


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
    "devices",
    "nonnegative_float",
    "nonnegative_int",
    "one_line",
    "open_fraction",
    "output_file",
    "output_folder",
    "output_stem",
    "positive_float",
    "positive_int",
    "positive_ints",
    "probability",
    "seed",
    "stdout_to_devnull",
    "unit_interval",
    "yarn_factor",
]
