"""The file format of result stores, and reading one without modifying it.

A store is JSONL: a header line (`STORE_KIND`, `FORMAT`, purpose, settings), then one record per
line; `store.py` says what writers guarantee. Reading takes no lock and writes nothing: it opens
only regular files, judges a file on its first line before reading on, and decompresses an
archived (xz or gzip) store as it reads, up to a cap. It goes a line at a time through the JSONL
reader (`jsonl.read_lines`), so no line longer than `jsonl.MAX_LINE` is ever held, whatever the file.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import itertools
import json
import lzma
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from dysco_interp.errors import ConfigError
from dysco_interp.jsonl import LineError, NotRegularFileError, Records, open_regular, parse_line, read_lines
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
# to gigabytes, and every record read is held in memory.
MAX_DECOMPRESSED = 2 << 30


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
def _store_bytes(path: Path) -> Iterator[tuple[BinaryIO | io.BufferedIOBase, bool]]:
    """The bytes of a store file, decompressed as they are read when it is an archive; and whether it is."""
    try:
        # should the file have been swapped for a FIFO since it was checked, opening it does not
        # wait for a writer, and it is refused
        raw = open_regular(path)
    except NotRegularFileError as e:
        raise NotAStoreError(f"{path} is {e.kind}, not a regular file; it was left untouched: choose another path") \
            from None
    except OSError as e:
        raise StoreError(f"cannot read {path}: {e.strerror}") from None
    with raw:
        magic = raw.read(6)
        raw.seek(0)
        opener = next((o for m, o in _DECOMPRESSORS.items() if magic.startswith(m)), None)
        if opener is None:
            yield raw, False
            return
        with opener(raw) as stream:
            yield stream, True


@contextlib.contextmanager
def _reading(path: Path, compressed: bool) -> Iterator[None]:
    """What reading a store's bytes raises, as a StoreError naming it."""
    try:
        yield
    except (OSError, EOFError, lzma.LZMAError, zlib.error) as e:
        if not compressed:
            raise StoreError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
        raise StoreCorruptError(f"{path} is a compressed store that does not decompress ({e})") from None


def _store_lines(stream: BinaryIO | io.BufferedIOBase, path: Path, compressed: bool) -> Iterator[tuple[int, bytes]]:
    """The store's lines (`read_lines`), an archive's up to MAX_DECOMPRESSED bytes in all."""
    total = 0
    for number, raw in read_lines(stream):
        total += len(raw)
        if compressed and total > MAX_DECOMPRESSED:
            raise StoreError(f"{path} decompresses to more than {_size(MAX_DECOMPRESSED)}, the most a store is "
                             "decompressed to; it was not read (decompress it yourself if it is a store)")
        yield number, raw


def _first_line(lines: Iterator[tuple[int, bytes]], path: Path) -> tuple[int, bytes] | None:
    try:
        return next(lines, None)
    except LineError:  # longer than any header or record
        raise _not_a_store(path) from None


def _not_a_store(path: Path) -> NotAStoreError:
    return NotAStoreError(
        f"{path} exists and is not a dysco-interp result store (its first line is not a store header); "
        "it was left untouched: choose another path"
    )


def _parse_first(line: bytes, path: Path) -> tuple[Any, int | None]:
    """The first line's JSON value and the store format its header announces; NotAStoreError
    when it is neither a header of ours nor a format-1 evaluation record."""
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
        with _store_bytes(path) as (stream, compressed), _reading(path, compressed):
            line = _first_line(_store_lines(stream, path, compressed), path)
            first, fmt = _parse_first(line[1], path) if line else (None, None)
    except StoreError:
        return None
    return first if fmt == FORMAT else None


def _corrupt(path: Path, error: LineError) -> StoreCorruptError:
    if error.kind == "too_long":
        return StoreCorruptError(f"{path}: line {error.line} is {error.why}; the store is corrupt, or no store")
    return StoreCorruptError(f"{path}: line {error.line} is not a JSON record; the store is corrupt "
                             "(remove that line, or start a new store)")


def read_store(path: str | Path) -> StoreContents | None:
    """The contents of a store without modifying it; None for a missing or empty file. An
    xz- or gzip-compressed store (an archive of finished results) reads like a plain one, up
    to MAX_DECOMPRESSED bytes; any file is judged on its first line before the rest is read,
    and read a line at a time, none longer than `jsonl.MAX_LINE`.

    NotAStoreError when the file is something else (its first line is no header of ours and
    no format-1 evaluation record, or it is no regular file); StoreCorruptError for a broken
    line before the last, or a line too long to be a record.
    """
    path = Path(path)
    if not _check_regular(path):
        return None
    with _store_bytes(path) as (stream, compressed), _reading(path, compressed):
        lines = _store_lines(stream, path, compressed)
        line = _first_line(lines, path)
        if line is None:
            return None
        first, fmt = _parse_first(line[1], path)
        parsed = Records(itertools.chain([line], lines), torn_tail="report")  # a kill may have cut the last line
        try:
            records = [obj for number, obj in parsed if not (fmt is not None and number == 1)]
        except LineError as e:
            raise _corrupt(path, e) from None
    header = first if fmt is not None else None
    return StoreContents(path, fmt or 1, header, records, parsed.torn_tail, parsed.unterminated, compressed)


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


__all__ = [
    "FORMAT",
    "LEGACY_HEADER_KIND",
    "LEGACY_RECORD_FIELDS",
    "MAX_DECOMPRESSED",
    "SHARD_FIELD",
    "STORE_KIND",
    "NotAStoreError",
    "StoreBusyError",
    "StoreContents",
    "StoreCorruptError",
    "StoreError",
    "StoreMismatchError",
    "canonical_json",
    "content_hash",
    "differences",
    "flatten",
    "read_header",
    "read_resumable",
    "read_store",
]
