"""Evaluation records read back from result stores for tables: checked, and pooled across stores.

Reading never rewrites the file (`stores.format.read_store`): a line cut short by a killed run is
skipped, and the settings header is not a record. Which files a pattern names, archives included,
is `stores.archives.expand`; what a table may read from a record, and whether records of several
stores share a table, is decided here.

Pooling several stores (`pool_files`, `load_pooled`) refuses what is not comparable, with one line
naming the two files and the fields that differ; it never gives such records rows of their own,
since a table of mixed settings would silently pair them:
- records of one cell (model, task, length, token budget) whose settings differ: the store
  header's (dtype, device, backend, weights, teacher forcing, decoding attention) and the
  record's own, or the backend a headerless record names;
- records of one cell and method (what ran, from the config) whose method settings differ
  (sampling, the head set);
A headerless (format-1) store records no settings beyond its backend: its records pool with a
headered store's of the same cell when the backends agree, and the table names how many such
records it paired that way, so a reader knows those settings are stated, not recorded.
A record stored twice (same cell, method and instance) counts once, the first kept. When the
two differ in results (timings and free-text label aside) the table says so in a note naming the
first such pair: decoding in bf16 on a GPU is not bitwise repeatable, and headerless stores do
not record their dtype, so this is not refused but never silent.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dysco_interp.analysis.method_key import method_key
from dysco_interp.analysis.report import store_notes
from dysco_interp.analysis.result_tables import cell_of, instance_of
from dysco_interp.decoding.methods import with_later_options
from dysco_interp.errors import ConfigError
from dysco_interp.stores.archives import expand
from dysco_interp.stores.format import canonical_json, differences, read_store
from dysco_interp.tasks.registry import TASKS
from dysco_interp.tasks.spec import TaskMetrics

REQUIRED_FIELDS = ("model", "task", "method", "index", "config")

# what differs between two runs of the same item without telling of other settings
VOLATILE_FIELDS = ("timings", "method", "settings")


@dataclass(frozen=True)
class Sourced:
    """An evaluation record, the store it came from and the settings its results depend on
    besides its cell and config (`record_settings`)."""

    record: dict
    file: Path
    settings: dict
    recorded: bool = True  # False: a headerless record, whose settings beyond its backend are unknown


def record_settings(record: dict, store_settings: dict | None) -> dict:
    """The store header's settings overlaid by the record's own (method settings under
    "method"); a headerless record contributes the backend it names."""
    settings = {**(store_settings or {}), **(record.get("settings") or {})}
    if "backend" in record:
        settings.setdefault("backend", record["backend"])
    return settings


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_record(record: dict, where: str, store_task: Any) -> None:
    """ConfigError, one line beginning with `where`, for what a table must not read from an
    evaluation record (a hand-edited store): a length that is no integer, a task other than its
    store header's, and a score of its task that is a boolean, no number, not finite or out of its
    range (`TaskMetrics.bounds`). A null score stands for a score not measured on the record (a
    route without a city to score): the means leave it out, and their n counts only what they use."""
    task = record["task"]
    if not isinstance(task, str) or (store_task is not None and task != store_task):
        raise ConfigError(f"{where}: task {task!r}, but the store's header is for {store_task!r}; a store holds "
                          "one task's records (was it edited, or two stores joined?)")
    length = record.get("length")
    if length is not None and not (_number(length) and float(length).is_integer()):
        raise ConfigError(f"{where}: 'length' must be an integer number of tokens or null, got {length!r}")
    metrics = TASKS[task].metrics if task in TASKS else None
    for name in metrics.scores if metrics else ():
        value = record.get(name)
        if value is None:
            continue
        lo, hi = TaskMetrics.bounds(name)
        if not _number(value):
            raise ConfigError(f"{where}: score {name!r} must be a number or null, got {value!r}")
        if not (math.isfinite(value) and lo <= value <= hi):
            span = f"at most {hi:g}" if lo == -math.inf else f"in [{lo:g}, {hi:g}]"
            raise ConfigError(f"{where}: score {name!r} is {value!r}; a {name} is {span}")


def read_sourced(path: str | Path) -> list[Sourced]:
    """The evaluation records of one store (either format), checked to be evaluation records a
    table can read (`check_record`), each with its file and settings."""
    contents = read_store(path)
    if contents is None:
        return []
    store_task = (contents.settings or {}).get("task")
    for number, record in enumerate(contents.records, 1):
        missing = [f for f in REQUIRED_FIELDS if f not in record]
        if missing:
            raise ConfigError(f"{path}: a record lacks {', '.join(missing)}; not an evaluation store")
        check_record(record, f"{path}, record {number} ({record['method']}, instance "
                             f"{record.get('id', record['index'])})", store_task)
    return [Sourced(r, Path(path), record_settings(r, contents.settings),
                    recorded=contents.settings is not None or "settings" in r) for r in contents.records]


def read_records(path: str | Path) -> list[dict]:
    """The evaluation records of one store (either format), checked to be evaluation records."""
    return [s.record for s in read_sourced(path)]


def _short(path: Path) -> str:
    # folder and name: enough to find the file, and no machine path in a committed note
    return Path(*path.parts[-2:]).as_posix()


def _where(record: dict) -> str:
    return f"{record['model']} {record['task']} {record.get('length')}"


def _refuse(a: Sourced, b: Sourced, what: str, diffs: list[str]) -> None:
    files = f"{a.file} and {b.file}" if a.file != b.file else str(a.file)
    raise ConfigError(f"{files} hold {what} ({'; '.join(diffs)}); they do not pool into one table: "
                      "give each setting's stores to a run of its own")


@dataclass
class Pooled:
    """Records of several stores once checked comparable, each item once."""

    records: list[dict]
    dropped: int = 0  # repeats counted once
    differing: int = 0  # of those, repeats whose results differ from the record kept
    example: str = ""  # the first such repeat: where and what differs
    unrecorded: int = 0  # headerless records pooled with recorded ones on their backend alone

    def notes(self, unmatched: Sequence[str] = ()) -> list[str]:
        notes = store_notes(unmatched, self.dropped)
        if self.unrecorded:
            notes.append(f"{self.unrecorded} records come from headerless stores, which record no settings but their "
                         "backend; they share cells with recorded runs of the same backend")
        if self.differing:
            notes.append(f"{self.differing} of the repeated records differ in results from the one kept (first: "
                         f"{self.example}): decoding that is not bitwise repeatable, or settings the stores do "
                         "not record")
        return notes


def _method_settings(item: Sourced) -> Any:
    """An item's method settings, with the options its method gained after it was stored at their
    defaults (`methods.with_later_options`): records from before and after a parameter was added
    pool when they ran the same."""
    ran = item.settings.get("method")
    return with_later_options(ran) if isinstance(ran, dict) else ran


def check_comparable(items: Iterable[Sourced], apart: Sequence[str] = ()) -> Pooled:
    """ConfigError unless the records can share a table (see the module docstring), else the
    records with each item once. Settings named in `apart` put records in separate groups
    instead of conflicting (the budget study reads its teacher-forced and free records apart)."""
    by_cell: dict[tuple, Sourced] = {}
    by_method: dict[tuple, Sourced] = {}
    by_item: dict[tuple, Sourced] = {}
    mixed: set[tuple] = set()  # cells where headerless records meet recorded ones
    unrecorded: list[tuple] = []  # the cell of every headerless record kept
    out = Pooled([])
    for it in items:
        r = it.record
        cell = (cell_of(r), *(canonical_json(it.settings.get(f)) for f in apart))
        first = by_cell.setdefault(cell, it)
        shared = [{k: v for k, v in s.settings.items() if k != "method"} for s in (first, it)]
        if first.recorded != it.recorded:  # one side knows only its backend: that much must agree
            shared = [{"backend": d.get("backend")} for d in shared]
            mixed.add(cell)
        if shared[0] != shared[1]:
            _refuse(first, it, f"{_where(r)} results computed with other settings", differences(*shared))
        key = (cell, method_key(r))
        first = by_method.setdefault(key, it)
        ran = [_method_settings(s) for s in (first, it)]
        if ran[0] != ran[1]:
            _refuse(first, it, f"{_where(r)} {key[1].label} results computed with other method settings",
                    differences({"method": ran[0]}, {"method": ran[1]}))
        first = by_item.setdefault((key, instance_of(r)), it)
        if first is it:
            out.records.append(r)
            if not it.recorded:
                unrecorded.append(cell)
            continue
        out.dropped += 1
        results = [{k: v for k, v in s.record.items() if k not in VOLATILE_FIELDS} for s in (first, it)]
        if results[0] != results[1]:
            out.differing += 1
            out.example = out.example or (f"{_short(first.file)} and {_short(it.file)}, {_where(r)} {key[1].label} "
                                          f"{r.get('id', r['index'])}: {'; '.join(differences(*results))}")
    out.unrecorded = sum(1 for cell in unrecorded if cell in mixed)
    return out


def pool_files(files: Iterable[str | Path], apart: Sequence[str] = ()) -> Pooled:
    """`check_comparable` over the records of the given stores."""
    return check_comparable((it for f in files for it in read_sourced(f)), apart)


def load_records(patterns: Iterable[str]) -> tuple[list[dict], list[Path], list[str]]:
    """(records of every matched file, the files, the patterns that matched nothing)."""
    files, unmatched = expand(patterns)
    records = [r for f in files for r in read_records(f)]
    return records, files, unmatched


def display_path(path: str | Path, root: str | Path) -> str:
    """The path relative to `root` when inside it (committed outputs carry no machine paths)."""
    p = Path(path).resolve()
    try:
        return p.relative_to(Path(root).resolve()).as_posix()
    except ValueError:
        return str(path)


def load_pooled(patterns: Iterable[str]) -> tuple[Pooled, list[Path], list[str]]:
    """The matching stores pooled (`check_comparable`), the files, and the patterns that matched
    nothing; ConfigError when they do not pool."""
    files, unmatched = expand(patterns)
    return pool_files(files), files, unmatched


def load_deduplicated(patterns: Iterable[str]) -> tuple[Pooled, list[Path], list[str]]:
    """`load_pooled`, and ConfigError when there is nothing at all."""
    patterns = list(patterns)
    pooled, files, unmatched = load_pooled(patterns)
    if not pooled.records:
        raise ConfigError(f"no records in {' '.join(patterns)}")
    return pooled, files, unmatched


__all__ = [
    "REQUIRED_FIELDS",
    "VOLATILE_FIELDS",
    "Pooled",
    "Sourced",
    "check_comparable",
    "check_record",
    "display_path",
    "load_deduplicated",
    "load_pooled",
    "load_records",
    "pool_files",
    "read_records",
    "read_sourced",
    "record_settings",
]
