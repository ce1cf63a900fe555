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
  decompressed up to `MAX_DECOMPRESSED` bytes, never further.
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

import contextlib
import gzip
import hashlib
import io
import json
import lzma
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from filelock import FileLock, Timeout

from dysco_interp.atomic import atomic_open
from dysco_interp.errors import ConfigError
from dysco_interp.jsonl import LineError, parse_line, parse_lines
from dysco_interp.outputs import file_kind, output_target

STORE_KIND = "dysco-interp-store"
FORMAT = 2
LEGACY_HEADER_KIND = "header"
# Fields that every format-1 evaluation record has: how such a headerless file is recognised.
LEGACY_RECORD_FIELDS = ("model", "task", "method", "index", "config")
# Header fields that describe who wrote the store, not what its records depend on.
_PROVENANCE_FIELDS = ("package_version", "created_by")
# In the header of a data-parallel run's shard: the file name of the store it belongs to. Only
# files marked so are folded into a store (and deleted), whatever their name.
SHARD_FIELD = "shard_of"


class StoreError(ConfigError):
    """A result store cannot be opened or written as asked."""


class NotAStoreError(StoreError):
    """The path holds something that is not a dysco-interp result store; it is left untouched."""


class StoreCorruptError(StoreError):
    """A store's line other than the last is not a JSON record."""


class StoreMismatchError(StoreError):
    """The store holds results computed with other settings."""


class StoreBusyError(StoreError):
    """Another process is writing the store."""


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def content_hash(value: Any, length: int = 20) -> str:
    """A short, stable hash of a JSON-able value: what identifies an instance or a setting."""
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()[:length]


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings as {"a.b": leaf}, so that differences can be named field by field."""
    if isinstance(value, Mapping) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def _short(value: Any, limit: int = 40) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def differences(stored: Mapping, now: Mapping) -> list[str]:
    """Each differing field as 'name stored -> now' (absent fields shown as 'unset')."""
    a, b = flatten(stored), flatten(now)
    out = []
    for name in sorted(set(a) | set(b)):
        if a.get(name, ...) != b.get(name, ...):
            old = _short(a[name]) if name in a else "unset"
            new = _short(b[name]) if name in b else "unset"
            out.append(f"{name or '(all)'} {old} -> {new}")
    return out


@dataclass
class StoreContents:
    """What a store file holds, as read without modifying it."""

    path: Path
    format: int  # 2, or 1 for stores written before settings headers
    header: dict | None
    records: list[dict]
    torn_tail: bool  # the last line was cut short by a kill (not counted as a record)
    unterminated: bool  # the last record is complete but lost its newline
    compressed: bool = False  # an archived store (xz or gzip): read, never resumed

    @property
    def settings(self) -> dict | None:
        if self.header is None:
            return None
        if self.format == FORMAT:
            return self.header.get("settings", {})
        return {k: v for k, v in self.header.items() if k not in ("kind", *_PROVENANCE_FIELDS)}

    @property
    def purpose(self) -> str | None:
        return self.header.get("purpose") if self.header is not None and self.format == FORMAT else None


def _header_kind(obj: Any) -> int | None:
    """The store format a first line announces, or None when it is no header of ours."""
    if not isinstance(obj, dict):
        return None
    if obj.get("kind") == STORE_KIND and isinstance(obj.get("settings"), dict):
        return obj.get("format") if isinstance(obj.get("format"), int) else None
    if obj.get("kind") == LEGACY_HEADER_KIND:
        return 1
    return None


# Archived stores: committed results are kept compressed; readers open them as they are.
_DECOMPRESSORS: dict[bytes, Callable[[BinaryIO], io.BufferedIOBase]] = {
    b"\xfd7zXZ\x00": lambda raw: lzma.LZMAFile(raw),
    b"\x1f\x8b": lambda raw: gzip.GzipFile(fileobj=raw),
}
# An archive is decompressed up to this many bytes, never further: a few MB of gzip can expand
# to gigabytes, all of it held in memory.
MAX_DECOMPRESSED = 2 << 30
# The longest first line read when looking for a header: far beyond any header (the head list of
# the largest models is kilobytes) and any record, and a bound on what another file costs.
HEADER_LIMIT = 64 << 20


def _size(n: int) -> str:
    return f"{n / 2**30:g} GiB" if n >= 2**30 else f"{n / 2**20:g} MiB"


def _check_regular(path: Path) -> bool:
    """Whether `path` exists; NotAStoreError when it is no regular file (a folder, a FIFO, a
    device: never opened, so a FIFO cannot block the reader)."""
    try:
        kind = file_kind(path)
    except OSError as e:
        raise StoreError(f"cannot read {path}: {e.strerror}") from None
    if kind == "a folder":
        raise NotAStoreError(f"{path} is a folder; give a file path for the results")
    if kind is not None:
        raise NotAStoreError(f"{path} is {kind}, not a regular file; it was left untouched: choose another path")
    return path.exists()


@contextlib.contextmanager
def _store_bytes(path: Path) -> Iterator[tuple[io.BufferedIOBase, bool]]:
    """The bytes of a store file, decompressed as they are read when it is an archive; and whether it is."""
    try:
        # O_NONBLOCK: should the file have been swapped for a FIFO since it was checked, opening
        # it does not wait for a writer; fstat then refuses it
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise StoreError(f"cannot read {path}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as raw:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotAStoreError(f"{path} is not a regular file; it was left untouched: choose another path")
        magic = raw.read(6)
        raw.seek(0)
        opener = next((o for m, o in _DECOMPRESSORS.items() if magic.startswith(m)), None)
        if opener is None:
            yield raw, False
            return
        with opener(raw) as stream:
            yield stream, True


def _read(stream: io.BufferedIOBase, path: Path, compressed: bool,
          read: Callable[[io.BufferedIOBase], bytes]) -> bytes:
    try:
        return read(stream)
    except (OSError, EOFError, lzma.LZMAError) as e:
        if not compressed:
            raise StoreError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
        raise StoreCorruptError(f"{path} is a compressed store that does not decompress ({e})") from None


def _first_line(stream: io.BufferedIOBase, path: Path, compressed: bool) -> bytes:
    limit = min(HEADER_LIMIT, MAX_DECOMPRESSED) if compressed else HEADER_LIMIT
    return _read(stream, path, compressed, lambda s: s.readline(limit + 1))


def _not_a_store(path: Path) -> NotAStoreError:
    return NotAStoreError(
        f"{path} exists and is not a dysco-interp result store (its first line is not a store header); "
        "it was left untouched: choose another path"
    )


def _parse_first(line: bytes, path: Path) -> tuple[Any, int | None]:
    """The first line's JSON value and the store format its header announces; NotAStoreError
    when it is neither a header of ours nor a format-1 evaluation record."""
    if len(line) > HEADER_LIMIT:
        raise _not_a_store(path)
    try:
        first = parse_line(line.removesuffix(b"\n"), 1)
    except LineError:
        raise _not_a_store(path) from None
    fmt = _header_kind(first)
    if fmt is None and not (isinstance(first, dict) and all(f in first for f in LEGACY_RECORD_FIELDS)):
        raise _not_a_store(path)
    if fmt is not None and fmt > FORMAT:
        raise StoreError(f"{path} is a store of format {fmt}, newer than this dysco-interp reads ({FORMAT}); upgrade")
    return first, fmt


def read_header(path: str | Path) -> dict | None:
    """The settings header of the store at `path`, read from its first line alone; None for a
    missing or empty file, a format-1 store, or any file that is no store of ours."""
    path = Path(path)
    try:
        if not _check_regular(path):
            return None
        with _store_bytes(path) as (stream, compressed):
            line = _first_line(stream, path, compressed)
            first, fmt = _parse_first(line, path) if line else (None, None)
    except StoreError:
        return None
    return first if fmt == FORMAT else None


def read_store(path: str | Path) -> StoreContents | None:
    """The contents of a store without modifying it; None for a missing or empty file. An
    xz- or gzip-compressed store (an archive of finished results) reads like a plain one, up
    to MAX_DECOMPRESSED bytes; any file is judged on its first line before the rest is read.

    NotAStoreError when the file is something else (its first line is no header of ours and
    no format-1 evaluation record, or it is no regular file); StoreCorruptError for a broken
    line before the last.
    """
    path = Path(path)
    if not _check_regular(path):
        return None
    with _store_bytes(path) as (stream, compressed):
        line = _first_line(stream, path, compressed)
        if not line:
            return None
        first, fmt = _parse_first(line, path)
        if compressed:
            rest = _read(stream, path, compressed, lambda s: s.read(MAX_DECOMPRESSED - len(line) + 1))
            if len(line) + len(rest) > MAX_DECOMPRESSED:
                raise StoreError(f"{path} decompresses to more than {_size(MAX_DECOMPRESSED)}, the most a store is "
                                 "decompressed to; it was not read (decompress it yourself if it is a store)")
        else:
            rest = _read(stream, path, compressed, lambda s: s.read())
    data = line + rest
    try:
        parsed = parse_lines(data, torn_tail="report")  # a kill may have cut the last line
    except LineError as e:
        raise StoreCorruptError(f"{path}: line {e.line} is not a JSON record; the store is corrupt "
                                "(remove that line, or start a new store)") from None
    header = first if fmt is not None else None
    records = [obj for number, obj in parsed.records if not (header is not None and number == 1)]
    torn, unterminated = parsed.torn_tail, parsed.unterminated
    return StoreContents(path, fmt or 1, header, records, torn, unterminated, compressed)


def read_resumable(path: str | Path) -> StoreContents | None:
    """`read_store`, refusing what a writer could not resume: a format-1 store without a header."""
    contents = read_store(path)
    if contents is not None and contents.compressed:
        raise StoreError(f"{path} is a compressed archive of results: the tables read it, but it cannot be "
                         "resumed; decompress it (xz -dk, gunzip -k) to a .jsonl file, or write to a new file")
    if contents is not None and contents.header is None:
        raise StoreError(
            f"{path} holds results of an older dysco-interp without a settings header: "
            "the tables still read it, but it cannot be resumed; write to a new file"
        )
    return contents


def _lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


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
            raise StoreBusyError(
                f"{self.path} is being written by another writer, in this or another process "
                f"(lock {lock_file}); wait for it to finish, or write to another file"
            ) from None
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
        lines = [json.dumps(r, sort_keys=True, allow_nan=False) + "\n" for r in rows]
        with open(self.path, "a", encoding="utf-8") as f:
            f.writelines(lines)
            f.flush()
            os.fsync(f.fileno())
        self._by_key.update(zip(keys, rows))

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
