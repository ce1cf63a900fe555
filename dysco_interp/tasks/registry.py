"""The task registry: the one place that lists tasks, each by the `TaskSpec` its package defines.

`make_dataset`, `load_dataset`, `make-data`, `evaluate` and the result tables read a task's
spec from here, by name or alias (`get_task`); a new task is its package plus one entry in
`TASKS`. Importing it loads no torch: the command line's `--help` lists the names from here.
"""

from __future__ import annotations

import difflib

from dysco_interp.errors import ConfigError
from dysco_interp.tasks.mrcr.spec import MRCR
from dysco_interp.tasks.needle_qa.spec import NEEDLE_QA
from dysco_interp.tasks.path_traversal.spec import PATH_TRAVERSAL
from dysco_interp.tasks.spec import TaskSpec

# in the order the command line lists them
TASKS: dict[str, TaskSpec] = {spec.name: spec for spec in (PATH_TRAVERSAL, NEEDLE_QA, MRCR)}
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


__all__ = ["DEFAULT_TASK", "TASKS", "get_task", "task_names"]
