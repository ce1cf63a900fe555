"""The task registry: the one place that lists tasks, each by the `TaskSpec` its package defines.

`make_dataset`, `load_dataset`, `make-data`, `evaluate` and the result tables read a task's
spec from here, by name or alias (`get_task`); a new task is its package plus one call of
`register_task`, which the built-in tasks go through too. Importing it loads no torch: the
command line's `--help` lists the names from here.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from typing import Any

from dysco_interp.errors import ConfigError
from dysco_interp.tasks.mrcr.spec import MRCR
from dysco_interp.tasks.needle_qa.spec import NEEDLE_QA
from dysco_interp.tasks.path_traversal.spec import PATH_TRAVERSAL
from dysco_interp.tasks.spec import TaskSpec

# name -> spec, in the order the command line lists them: the built-in tasks, then those
# registered at run time
TASKS: dict[str, TaskSpec] = {}
# A name is the `task` field of instances and records and the start of a data file's name
# (path_traversal_8k.jsonl), and `get_task` finds it in lower case: plain lower-case words.
TASK_NAME = re.compile(r"[a-z][a-z0-9_]*")
# what `get_task` also accepts; it lower-cases what it is given, so an alias is lower case too
TASK_ALIAS = re.compile(r"[a-z0-9][a-z0-9_-]*")


def _same_definition(a: Any, b: Any) -> bool:
    # a notebook cell or a script run twice builds its spec anew: other function objects of the
    # same code, which only their module and name tell apart from one another
    if isinstance(a, type) or (callable(a) and hasattr(a, "__qualname__")):
        return (getattr(a, "__module__", None), a.__qualname__) == \
            (getattr(b, "__module__", None), getattr(b, "__qualname__", None))
    if dataclasses.is_dataclass(a):
        return type(a) is type(b) and all(_same_definition(getattr(a, f.name), getattr(b, f.name))
                                          for f in dataclasses.fields(a))
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(map(_same_definition, a, b))
    return bool(a == b)


def register_task(spec: TaskSpec) -> TaskSpec:
    """Register a task under `spec.name` (and its aliases), for `get_task`, `make-data`,
    `evaluate` and the tables. Registering the same spec again is harmless (so is one built anew
    by the same code); another spec under a taken name, or a name or alias that is another
    task's, is a ConfigError."""
    if not isinstance(spec, TaskSpec):
        raise ConfigError(f"register_task takes a TaskSpec, got {spec!r}")
    name = spec.name
    if not isinstance(name, str) or not TASK_NAME.fullmatch(name):
        raise ConfigError(f"a task needs a name of lower-case letters, digits and '_', starting with a letter, "
                          f"which data files and records carry (got {name!r})")
    aliases = spec.aliases
    if not isinstance(aliases, tuple) or not all(isinstance(a, str) and TASK_ALIAS.fullmatch(a) for a in aliases):
        raise ConfigError(f"task {name!r}: aliases are a tuple of lower-case names (letters, digits, '_' and '-'), "
                          f"got {spec.aliases!r}")
    taken = TASKS.get(name)
    if taken is not None and taken is not spec and not _same_definition(taken, spec):
        where = getattr(taken.generate, "__module__", None) or "elsewhere"
        raise ConfigError(f"task {name!r} is already registered, by another spec ({taken.title!r}, from {where}); "
                          "a task of your own needs a name of its own")
    others = {n: s.name for s in TASKS.values() if s.name != name for n in (s.name, *s.aliases)}
    clash = next((n for n in (name, *aliases) if n in others), None)
    if clash is not None:
        raise ConfigError(f"task {name!r}: {clash!r} already names task {others[clash]!r}; choose another "
                          f"{'name' if clash == name else 'alias'}")
    TASKS[name] = spec
    return spec


register_task(PATH_TRAVERSAL)
register_task(NEEDLE_QA)
register_task(MRCR)
DEFAULT_TASK = PATH_TRAVERSAL.name  # `evaluate --task` unless given


def get_task(name: str) -> TaskSpec:
    """The task registered under name (or an alias); ConfigError names the choices."""
    key = str(name).strip().lower()
    aliases = {alias: spec.name for spec in TASKS.values() for alias in spec.aliases}
    key = aliases.get(key, key)
    if key in TASKS:
        return TASKS[key]
    close = difflib.get_close_matches(key, list(TASKS) + list(aliases), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ConfigError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}.{hint}")


def task_names(default: str | None = None) -> str:
    """The registered names as words ("a, b or c"), `default` marked: for help texts."""
    names = [f"{n} (default)" if n == default else n for n in TASKS]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


__all__ = ["DEFAULT_TASK", "TASKS", "get_task", "register_task", "task_names"]
