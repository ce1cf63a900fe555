"""A researcher's own decoding methods on the command line: `--methods-from FILE.py` imports the
files that register them, `--params NAME=JSON` (also `--method-options`) sets their parameters, and the names that
`--method`/`--methods` give are checked once both are known.

Argparse meets `--method` before or after `--methods-from`, so a name is checked after the whole
command line is read (`check_method_flags`, run by `args.ArgumentParser`), still before any
model loads. Only what needs the registry imports it (and so torch): built-in names alone, and
`--help`, never do.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import re
import sys
import traceback
from pathlib import Path
from typing import Any

from dysco_interp.decoding.choices import KNOWN_METHODS

FILES_FLAG, OPTIONS_FLAG = "--methods-from", "--params"
OPTIONS_ALIAS = "--method-options"  # the flag's first name, kept
# the help of FILES_FLAG wherever it is taken: the command line's own and the scripts' that read stores
METHODS_FROM_HELP = ("a Python file of your own decoding methods, imported before the method names are checked: it "
                     "runs as Python code, with your permissions, so name only a file you trust. The SteeringMethod "
                     "subclasses it registers with register_method can then be named and their records read (repeat "
                     "the flag for several files)")
# the package every loaded file's module lives under: a name no import statement of the user's can reach
MODULE_PREFIX = "dysco_interp_user_methods"


def method_name(text: str) -> str:
    """argparse type of --method: a name, checked against the registry once --methods-from is read."""
    name = str(text).strip()
    if not name or "," in name:
        raise argparse.ArgumentTypeError(f"{text!r} is not one method name (evaluate's --methods takes several)")
    return name


def method_list(text: str) -> str:
    """argparse type of --methods: names, none twice; the comma-separated text back (each name is
    checked against the registry once --methods-from is read)."""
    names = [m.strip() for m in str(text).split(",") if m.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"no method named; choose from {', '.join(KNOWN_METHODS)}")
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"a method is named twice in {text!r}")
    return ",".join(names)


def named_json(text: str) -> tuple[str, Any]:
    """NAME=JSON as (NAME, the parsed JSON), for the flags that give a method a value: an
    ArgumentTypeError in one line for a missing name or '=', or JSON that does not parse."""
    name, sep, value = str(text).partition("=")
    name = name.strip()
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=JSON, e.g. 'pasta={{\"alpha\": 0.05}}'")
    try:
        return name, json.loads(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{name}=...: not valid JSON ({e})") from None
    except RecursionError:
        raise argparse.ArgumentTypeError(f"{name}=...: the JSON is nested too deeply to be options") from None


def method_option(text: str) -> tuple[str, dict]:
    """argparse type of --method-options: NAME=JSON, the JSON an object of option values."""
    name, options = named_json(text)
    if not isinstance(options, dict):
        raise argparse.ArgumentTypeError(f"{name}=...: the options must be a JSON object, e.g. {{\"alpha\": 0.05}}")
    return name, options


def module_name(path: Path) -> str:
    """The module a method file is imported as: its stem made an identifier, and a hash of where it
    lies, so two files of one name do not replace each other while one file loaded again is the
    same module (and `register_method` takes its classes as the same ones)."""
    stem = re.sub(r"\W", "_", path.stem) or "methods"
    where = hashlib.sha1(str(path).encode("utf-8", "surrogateescape")).hexdigest()[:10]
    return f"{MODULE_PREFIX}_{stem}_{where}"


def _error_line(error: BaseException, path: Path) -> int | None:
    if isinstance(error, SyntaxError) and error.lineno is not None:
        return error.lineno
    lines = [frame.lineno for frame in traceback.extract_tb(error.__traceback__)
             if frame.filename and Path(frame.filename) == path]
    return lines[-1] if lines else None


def _import_failure(error: BaseException, path: Path, given: str) -> str:
    detail = error.msg if isinstance(error, SyntaxError) else str(error)
    line = _error_line(error, path)
    at = f" at line {line}" if line is not None else ""
    return f"{given}: importing it raised {type(error).__name__}{at}" + (f": {detail}" if detail else "")


def load_method_file(given: str) -> str:
    """Import one user file (its methods register themselves) and return its module's name.

    Its folder is on sys.path while it runs, so it can import a helper beside it, and is taken
    off again: it must not shadow other modules for the rest of the run. Raises
    ArgumentTypeError in one line: a path that is no .py file, or what importing it raised.
    """
    path = Path(given).expanduser()
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{given}: no such file")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{given} is a folder; name a Python file (.py)")
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{given} is not a regular file; name a Python file (.py)")
    if path.suffix != ".py":
        raise argparse.ArgumentTypeError(f"{given} is not a Python file (.py)")
    path = path.resolve()
    name = module_name(path)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise argparse.ArgumentTypeError(f"{given}: cannot be imported as a Python file")
    module = importlib.util.module_from_spec(spec)
    # registered before it runs, as `import` does: dataclasses and pickling look their module up there
    sys.modules[name] = module
    folder = str(path.parent)
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as e:  # a user's file can raise anything; Ctrl-C still stops the run
        sys.modules.pop(name, None)
        raise argparse.ArgumentTypeError(_import_failure(e, path, given)) from None
    finally:
        if folder in sys.path:
            sys.path.remove(folder)
    return name


def known_methods() -> tuple[str, ...]:
    """Every method name a run can take now: the built-in ones, and any registered in this
    process (by a --methods-from file, or by Python code that called `main`). The registry is
    read only where something imported it already: the built-in names need no torch."""
    registry = sys.modules.get("dysco_interp.decoding.methods")
    return KNOWN_METHODS if registry is None else tuple(dict.fromkeys((*KNOWN_METHODS, *registry.REGISTRY)))


def _check_names(flag: str, names: list[str], loaded: bool) -> None:
    known = known_methods()
    unknown = [m for m in names if m not in known]
    if unknown:
        hint = "" if loaded else f" (or a method of your own: {FILES_FLAG} FILE.py registers it)"
        raise argparse.ArgumentTypeError(
            f"argument {flag}: unknown method(s) {', '.join(unknown)}; choose from {', '.join(known)}{hint}")


def _checked_options(given: list[tuple[str, dict]], names: list[str], flag: str) -> dict[str, dict]:
    from dysco_interp.decoding.config import checked_params
    from dysco_interp.errors import ConfigError

    out: dict[str, dict] = {}
    for name, options in given:
        if name in out:
            raise argparse.ArgumentTypeError(f"argument {OPTIONS_FLAG}: {name} is given twice; "
                                             "name all its options in one JSON object")
        if name not in names:
            raise argparse.ArgumentTypeError(f"argument {OPTIONS_FLAG}: {name} is not a method this run uses "
                                             f"({flag} {','.join(names)})")
        try:  # the check DecodingConfig makes, now rather than after the data is read
            checked_params(name, options)
        except ConfigError as e:
            raise argparse.ArgumentTypeError(f"argument {OPTIONS_FLAG}: {e}") from None
        out[name] = options
    return out


def load_method_files(args: argparse.Namespace) -> None:
    """After the command line is read: import the --methods-from files (`args.methods_from`), in
    order. ArgumentTypeError in one line."""
    for given in args.methods_from or []:
        try:
            load_method_file(given)
        except argparse.ArgumentTypeError as e:
            raise argparse.ArgumentTypeError(f"argument {FILES_FLAG}: {e}") from None


def add_methods_from_flag(parser) -> None:
    """--methods-from FILE.py for a script that reads stores: the files are imported once the
    command line is read, so records of the methods they register can be read (`args.ArgumentParser`
    runs the check, its error one line)."""
    parser.add_argument(FILES_FLAG, dest="methods_from", action="append", default=None, metavar="FILE.py",
                        help=METHODS_FROM_HELP)
    parser.add_check(load_method_files)


def check_method_flags(args: argparse.Namespace) -> None:
    """After the command line is read: import the --methods-from files, check every --method(s)
    name against the methods now known, and --method-options against their methods' options
    (into `args.method_options`: name -> options). ArgumentTypeError in one line."""
    files = args.methods_from or []
    load_method_files(args)
    flag, names = ("--methods", args.methods.split(",")) if hasattr(args, "methods") else ("--method", [args.method])
    _check_names(flag, names, bool(files))
    args.method_options = _checked_options(args.method_options or [], names, flag)
