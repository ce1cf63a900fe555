"""The file format of result stores, and reading one without modifying it.

A store is JSONL: a header line (`STORE_KIND`, `FORMAT`, purpose, settings), then one record per
line; `store.py` says what writers guarantee. Reading takes no lock and writes nothing: it opens
only regular files, judges a file on its first line before reading on, and decompresses an
archived (xz or gzip) store as it reads, up to a cap.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import lzma
import os
import stat
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from dysco_interp.errors import ConfigError
from dysco_interp.jsonl import LineError, parse_line, parse_lines
from dysco_interp.outputs import file_kind

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
