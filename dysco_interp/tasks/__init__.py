"""Task generators with exact gold spans, and their scorers.

Three tasks, each seeded, sized to a target prompt length in tokens for a given tokenizer
(with its chat template applied) and stored as JSONL:

- `path_traversal`: LongProc's Path Traversal (route following through one-way edges).
- `needle_qa`: multi-document QA about invented entities, for QRScore head detection.
- `mrcr`: multi-round co-reference over a long chat (OpenAI MRCR style).

Each is a package (instance, generate, score; word lists as package data) whose `spec.py`
defines its `TaskSpec` (`tasks.spec`); `registry` lists the specs (a new task joins them with
`register_task`), `base` holds what the tasks share (seeds, stored spans, fitting to a token
length) and `lengths` parses '8k'-style lengths. This module makes, saves and loads data sets of
any registered task.

    from dysco_interp.tasks import make_dataset
    data = make_dataset("path_traversal", tokenizer, target_tokens=8192, n=50, seed=0)
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from dysco_interp.checks import brief
from dysco_interp.errors import ConfigError, DataError
from dysco_interp.jsonl import iter_jsonl, write_jsonl
from dysco_interp.tasks.base import check_positive
from dysco_interp.tasks.registry import TASKS, get_task, register_task
from dysco_interp.tasks.spec import TaskSpec


def make_dataset(
    task: str,
    tokenizer,
    target_tokens: int | None = None,
    *,
    n: int = 1,
    seed: int = 0,
    progress: bool = False,
    **options,
) -> list:
    """n instances (index 0..n-1) of a task at one target length; deterministic for a seed.

    Args:
        task: a registered task's name (`TASKS`) or alias: "path_traversal", "needle_qa", "mrcr"
            (dashes work too).
        tokenizer: the tokenizer whose token count the instances are fitted to.
        target_tokens: the prompt length to fit (None: the task's natural size).
        n: how many instances.
        seed: the data seed; instance i is fixed by (task, seed, i, length, options).
        progress: show a progress bar.
        **options: the task's own options (e.g. hops for Path Traversal, n_needles for MRCR).

    Returns:
        The instances, in index order.
    """
    spec = get_task(task)
    check_positive("n", n)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ConfigError(f"seed must be an integer, got {seed!r}")
    unknown = sorted(set(options) - set(spec.options))
    if unknown:
        raise ConfigError(
            f"task {spec.name!r} has no option(s) {', '.join(unknown)}; it accepts {', '.join(spec.options)}"
        )
    if not progress:
        return [spec.generate(tokenizer, target_tokens, seed=seed, index=i, **options) for i in range(n)]
    from dysco_interp.progress import tqdm

    # a context manager, so an error clears the bar and its message starts a clean line
    with tqdm(total=n, desc=f"{spec.name} {target_tokens or ''}", unit="inst", leave=False) as bar:
        out = []
        for i in range(n):
            out.append(spec.generate(tokenizer, target_tokens, seed=seed, index=i, **options))
            bar.update()
    return out


def save_dataset(path: str | Path, instances: Iterable) -> Path:
    """Write instances as JSONL (one `to_dict()` per line)."""
    return write_jsonl(path, instances)


def load_dataset(path: str | Path) -> list:
    """Read a JSONL file written by `save_dataset`, as instances of the right task class.

    Every problem is a DataError naming the file (and the line, where there is one): a
    missing file, a folder, binary or truncated content, a record of no known task, and a
    file with no records at all (an empty data file would otherwise evaluate to an empty table).
    """
    out = []
    for number, rec in iter_jsonl(path):
        where = f"{path}, line {number}"
        if "task" not in rec:
            raise DataError(f"{where}: the record has no 'task' field; not a dysco-interp task file")
        try:
            spec = get_task(rec["task"])
        except ConfigError as e:
            raise DataError(f"{where}: {e}") from None
        try:
            out.append(spec.instance_type.from_dict(rec))
        except DataError as e:  # the record's own checks, worded for it
            raise DataError(f"{where}: not a valid {spec.name} record ({e}); regenerate it with make-data") from None
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            # whatever the dataclass constructor trips on, the cause is the record's content
            what = f"missing field {e}" if isinstance(e, KeyError) else brief(str(e))
            raise DataError(f"{where}: not a valid {spec.name} record ({what}); regenerate it with make-data") from None
    if not out:
        raise DataError(f"{path} holds no records; make data with `dysco-interp make-data TASK --out DIR`")
    return out


__all__ = [
    "TASKS",
    "TaskSpec",
    "get_task",
    "register_task",
    "make_dataset",
    "save_dataset",
    "load_dataset",
]
