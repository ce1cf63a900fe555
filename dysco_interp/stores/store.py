"""Resumable result stores: JSONL files that carry the settings their records depend on.

The first line of a store is its header,
`{"kind": "dysco-interp-store", "format": 2, "purpose": ..., "settings": {...}, "created_by": ...}`;
every further line is one finished record, written and flushed as soon as its item finishes,
so a killed run keeps every finished result and skips them when started again.

The guarantees, each pinned by a test:
- Reopening a store with other settings is a `StoreMismatchError` that names the fields that
  differ; `open_store(..., if_differs="new")` moves to a sibling file instead. Never a mix.
- Only a file whose first line is one of our headers is ever written to, and only a writer
  repairs it: a line cut short by a kill is dropped, a complete last record that lost its
  newline keeps it. Any other file (a head file, a data file, text) is refused untouched, and
  so is anything that is no regular file (a FIFO, a device): it is never even opened.
- A store reached through a symbolic link is written through it: the link stays a link.
- One writer at a time: a writer holds a lock file beside the store (beside the file a link
  points to, so two names of one store share one lock) for its lifetime; a second writer
  fails at once with `StoreBusyError`. Readers (`read_store`, `readonly=True`) take no lock
  and never modify the file.
- A file is judged on its first line before the rest is read, and a compressed archive is
  decompressed up to `format.MAX_DECOMPRESSED` bytes, never further.
- Records are plain JSON, never pickles.
- A data-parallel run writes one shard per rank beside the store (`shard_path`: results.rank1.jsonl
  beside results.jsonl), each a store of its own with the same header, marked as a shard of
  that store (`create_shard`). `fold_shards` appends what the shards hold and the store lacks
  (never a record twice), then deletes them; a writer folds in the shards a killed run left
  before it decodes anything. A file of a shard's name without the mark is never touched.

Format 1 stores (before settings headers) are read for the tables: a header line
`{"kind": "header", ...}` still counts as settings; a file of bare evaluation records can be
read but not resumed.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from dysco_interp.atomic import atomic_open
from dysco_interp.errors import ConfigError
from dysco_interp.outputs import output_target
from dysco_interp.stores.format import (
    FORMAT,
    SHARD_FIELD,
    STORE_KIND,
    NotAStoreError,
    StoreBusyError,
    StoreContents,
    StoreCorruptError,
    StoreError,
    StoreMismatchError,
    canonical_json,
    content_hash,
    differences,
    flatten,
    read_header,
    read_resumable,
    read_store,
)


def non_finite_field(record: Mapping) -> tuple[str, float] | None:
    """The first field of a record ("scores.accuracy", or "steps[3]" in a list) holding NaN or
    an infinity, with its value; None when there is none."""
    def find(value: Any, where: str) -> tuple[str, float] | None:
        if isinstance(value, float) and not math.isfinite(value):
            return where, value
        items = value.items() if isinstance(value, Mapping) else \
            ((f"[{i}]", v) for i, v in enumerate(value)) if isinstance(value, (list, tuple)) else ()
        for k, v in items:
            found = find(v, f"{where}{k}" if str(k).startswith("[") else f"{where}.{k}" if where else str(k))
            if found is not None:
                return found
        return None

    return find(record, "")


def _lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def _busy(path: Path, lock_file: Path) -> StoreBusyError:
    return StoreBusyError(f"{path} is being written by another writer, in this or another process "
                          f"(lock {lock_file}); wait for it to finish, or write to another file")


def check_not_busy(path: str | Path) -> None:
    """StoreBusyError when a writer holds the store at `path` now; creates nothing. A command calls
    it before a slow model load, which would otherwise be spent before the writer's own lock refuses.
    (Another writer may still start after it: the lock is what excludes it then.)"""
    path = Path(path)
    lock_file = _lock_path(output_target(path))
    if not lock_file.is_file():  # every writer creates it first: no lock file, no writer
        return
    lock = FileLock(str(lock_file), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise _busy(path, lock_file) from None
    except OSError:
        return  # a lock that cannot be taken at all: opening the store says why
    lock.release()


DEFAULT_KEY = ("model", "task", "length", "method", "seed", "index")


class ResultStore:
    """A JSONL store of records, each identified by its `key_fields`, under one settings header.

    A writer (the default) creates the file with its header, or checks the header of an
    existing store against `settings` and `purpose`, repairs a tail cut by a kill, and holds
    the store's lock until `close()` (or the end of a `with` block, or the process).
    `readonly=True` only reads: no lock, no repair, no settings check unless `settings` is given.
    """

    def __init__(
        self,
        path: str | Path,
        key_fields: Sequence[str] = DEFAULT_KEY,
        settings: Mapping[str, Any] | None = None,
        *,
        purpose: str = "results",
        readonly: bool = False,
    ):
        self.path = Path(path)
        self.key_fields = tuple(key_fields)
        self.purpose = purpose
        self.readonly = readonly
        self.settings = None if settings is None else json.loads(canonical_json(dict(settings)))
        self._lock: FileLock | None = None
        if readonly:
            contents = read_store(self.path)
            if contents is None:
                raise StoreError(f"{self.path}: no such result store")
            if self.settings is not None:
                self._check(contents)
        else:
            if self.settings is None:
                self.settings = {}
            contents = self._open_for_writing()
        self.header = contents.header if contents is not None else self._new_header()
        self._by_key: dict[tuple, dict] = {}
        for r in contents.records if contents is not None else []:
            missing = [k for k in self.key_fields if k not in r]
            if missing:  # a record that no key finds would be decoded again and stored twice
                self.close()
                raise StoreCorruptError(f"{self.path}: a record lacks {', '.join(missing)}, which identify its "
                                        "item; the store is corrupt (remove that line, or start a new store)")
            self._by_key.setdefault(self.key(r), r)

    # ------------------------------------------------------------------ opening

    def _new_header(self) -> dict:
        from dysco_interp import __version__

        return {"kind": STORE_KIND, "format": FORMAT, "purpose": self.purpose, "settings": self.settings,
                "created_by": f"dysco-interp {__version__}"}

    def _open_for_writing(self) -> StoreContents | None:
        if self.path.is_dir():
            raise NotAStoreError(f"{self.path} is a folder; give a file path for the results")
        # a symbolic link is written through, and locked as the file it points to: two writers
        # through two names of one file must exclude each other
        target = output_target(self.path)
        # refuse a file that is no store, or other settings, before creating anything beside it
        early = read_resumable(self.path)
        if early is not None:
            self._check(early)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot create the folder {target.parent} for the results: {e.strerror}") from None
        lock_file = _lock_path(target)
        try:
            # filelock reports a lock file it cannot create as a lock held by someone else;
            # O_NONBLOCK: a FIFO in its place fails here instead of blocking
            os.close(os.open(lock_file, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK, 0o666))
        except OSError as e:
            raise StoreError(f"cannot write {self.path}: its lock file {lock_file} cannot be created "
                             f"({e.strerror})") from None
        lock = FileLock(str(lock_file), timeout=0)
        try:
            lock.acquire()
        except Timeout:
            raise _busy(self.path, lock_file) from None
        except OSError as e:
            raise StoreError(f"cannot lock {self.path}: {e.strerror}") from None
        self._lock = lock
        try:
            contents = read_resumable(self.path)  # again: another writer may have finished meanwhile
            if contents is None:
                with atomic_open(self.path) as f:  # a header is never torn
                    f.write(canonical_json(self._new_header()) + "\n")
                return None
            self._check(contents)
            self._repair(contents)
            return contents
        except BaseException:
            self.close()
            raise

    def _check(self, contents: StoreContents) -> None:
        if contents.format == FORMAT and contents.purpose != self.purpose:
            raise StoreMismatchError(f"{self.path} is a {contents.purpose!r} store, not a {self.purpose!r} one; "
                                     "write to another file")
        stored = contents.settings or {}
        if stored != self.settings:
            raise StoreMismatchError(
                f"{self.path} holds results computed with other settings "
                f"({'; '.join(differences(stored, self.settings or {}))}); "
                "write to another file, or ask for a new store"
            )

    def _repair(self, contents: StoreContents) -> None:
        """Drop a line cut short by a kill; end a complete last record with its newline."""
        if contents.torn_tail:
            data = self.path.read_bytes()
            os.truncate(self.path, data.rfind(b"\n") + 1)
        elif contents.unterminated:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write("\n")

    def close(self) -> None:
        """Release the writer's lock (a closed store can still be read, not appended to)."""
        lock = getattr(self, "_lock", None)  # absent when __init__ failed early
        if lock is not None:
            lock.release()
            self._lock = None

    def __enter__(self) -> "ResultStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    # ------------------------------------------------------------------ records

    def key(self, record: Mapping) -> tuple:
        missing = [k for k in self.key_fields if k not in record]
        if missing:
            raise KeyError(f"record lacks key field(s) {missing}; keys are {self.key_fields}")
        return tuple(canonical_json(record[k]) for k in self.key_fields)

    def records(self) -> list[dict]:
        return list(self._by_key.values())

    def get(self, record: Mapping) -> dict:
        """The stored record with the same key fields as `record`."""
        return self._by_key[self.key(record)]

    def __contains__(self, record: Mapping) -> bool:
        """Whether a record with the same key fields is stored (other fields are ignored)."""
        return self.key(record) in self._by_key

    def __len__(self) -> int:
        return len(self._by_key)

    def append(self, record: Mapping) -> None:
        self.extend([record])

    def extend(self, records: Iterable[Mapping]) -> None:
        """`append` for several records with one flush (what folding shards writes); every record
        is keyed and serialised before the file is touched, so a bad one writes nothing."""
        if self._lock is None:
            why = "opened read-only" if self.readonly else "closed"
            raise StoreError(f"{self.path} is {why}; it cannot take new records")
        rows = [dict(r) for r in records]
        keys = [self.key(r) for r in rows]
        lines = [self._line(r) for r in rows]
        with open(self.path, "a", encoding="utf-8") as f:
            f.writelines(lines)
            f.flush()
            os.fsync(f.fileno())
        self._by_key.update(zip(keys, rows))

    def _line(self, record: dict) -> str:
        try:
            return json.dumps(record, sort_keys=True, allow_nan=False) + "\n"
        except ValueError:  # JSON has no NaN: a metric of a broken run, never a result to keep
            field, value = non_finite_field(record) or ("a value", float("nan"))
            instance = next((record[k] for k in ("id", "index", "instance", "example") if k in record), None)
            whose = " ".join(filter(None, (f"method {record['method']!r}" if "method" in record else "",
                                           f"instance {instance!r}" if instance is not None else "")))
            raise StoreError(f"{self.path}: the record of {whose or 'an item'} holds {field} = {value}, not a "
                             "number a table can use; it was not stored") from None

    def fold_shards(self, order: Callable[[dict], Any] | None = None) -> list[dict]:
        """Append the records of the shards beside this store (`shard_paths`) that it lacks, sorted
        by `order` (else shard by shard), then delete the shards; returns the records appended.

        Each shard is opened as a writer first, so a shard with other settings, or one that a
        process still writes, stops the fold before anything is written. A kill between the
        append and the deletion leaves shards whose records the next fold skips.
        """
        if self._lock is None:
            raise StoreError(f"{self.path} is not open for writing; its shards cannot be folded in")
        shards: list[ResultStore] = []
        try:
            for path in shard_paths(self.path):
                shards.append(ResultStore(path, self.key_fields, self.settings, purpose=self.purpose))
            missing: dict[tuple, dict] = {}
            for shard in shards:
                for record in shard.records():
                    if record not in self:
                        missing.setdefault(self.key(record), record)
            added = list(missing.values())
            if order is not None:
                added.sort(key=order)
            if added:
                self.extend(added)
            for shard in shards:
                shard.path.unlink()  # still locked: nobody appends to a shard that is going away
        finally:
            for shard in shards:
                lock = shard._lock
                shard.close()
                if lock is not None and not shard.path.exists():
                    Path(lock.lock_file).unlink(missing_ok=True)
        return added


def shard_path(path: str | Path, rank: int) -> Path:
    """Where rank `rank` of a data-parallel run writes its records for the store at `path`:
    results.rank1.jsonl beside results.jsonl."""
    path = Path(path)
    return path.with_name(f"{path.stem}.rank{rank}{path.suffix}")


def is_shard_of(path: str | Path, store: str | Path) -> bool:
    """Whether the file at `path` is a shard of the store at `store`: its header says so."""
    header = read_header(path)
    return header is not None and header.get(SHARD_FIELD) == Path(store).name


def shard_paths(path: str | Path) -> list[Path]:
    """The shards of the store at `path` that exist, by rank: the files at `shard_path`s whose
    header marks them as its shards (another file of such a name is no shard, and left alone)."""
    path = Path(path)
    pattern = re.compile(re.escape(path.stem) + r"\.rank(\d+)" + re.escape(path.suffix))
    if not path.parent.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in path.parent.iterdir()
             if (m := pattern.fullmatch(p.name)) is not None and is_shard_of(p, path)]
    return [p for _, p in sorted(found)]


def create_shard(store: str | Path, rank: int, header: Mapping[str, Any]) -> Path:
    """Rank `rank`'s shard of the store at `store` (`shard_path`), made with `header` (the
    store's) marked as a shard of it unless a shard is there already, left by a killed run.
    A StoreError, touching nothing, when another file is in the way."""
    store = Path(store)
    path = shard_path(store, rank)
    if os.path.lexists(path):
        if not is_shard_of(path, store):
            raise StoreError(f"{path} exists and is not a shard of {store}, where a data-parallel run writes rank "
                             f"{rank}'s records; move it away, or write to another store")
        return path
    with atomic_open(path) as f:
        f.write(canonical_json({**header, SHARD_FIELD: store.name}) + "\n")
    return path


def sibling_paths(path: str | Path) -> Iterator[Path]:
    """path, then stem.2.suffix, stem.3.suffix, ...: where a store with other settings goes."""
    path = Path(path)
    yield path
    n = 2
    while True:
        yield path.with_name(f"{path.stem}.{n}{path.suffix}")
        n += 1


def open_store(
    path: str | Path,
    key_fields: Sequence[str],
    settings: Mapping[str, Any],
    *,
    purpose: str = "results",
    if_differs: str = "error",
    check: Callable[[ResultStore], None] | None = None,
) -> ResultStore:
    """A writer on `path`; `check(store)` may raise StoreMismatchError for record-level settings.

    if_differs="error" raises on other settings; "new" takes the first sibling path
    (`sibling_paths`) that is new or holds exactly these settings.
    """
    if if_differs not in ("error", "new"):
        raise ConfigError(f"if_differs must be 'error' or 'new', got {if_differs!r}")
    for candidate in sibling_paths(path):
        try:
            store = ResultStore(candidate, key_fields, settings, purpose=purpose)
        except StoreMismatchError:
            if if_differs == "error":
                raise
            continue
        try:
            if check is not None:
                check(store)
        except StoreMismatchError:
            store.close()
            if if_differs == "error":
                raise
            continue
        return store
    raise AssertionError("unreachable")  # pragma: no cover


# the format's names, re-exported: a store's users import one module
__all__ = [
    "DEFAULT_KEY",
    "FORMAT",
    "SHARD_FIELD",
    "STORE_KIND",
    "NotAStoreError",
    "ResultStore",
    "StoreBusyError",
    "StoreContents",
    "StoreCorruptError",
    "StoreError",
    "StoreMismatchError",
    "canonical_json",
    "check_not_busy",
    "content_hash",
    "create_shard",
    "differences",
    "flatten",
    "is_shard_of",
    "non_finite_field",
    "open_store",
    "read_header",
    "read_resumable",
    "read_store",
    "shard_path",
    "shard_paths",
    "sibling_paths",
]
