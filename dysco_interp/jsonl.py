"""JSON Lines: the one reader and writer of the package.

One record per line, each a JSON object. Lines are decoded one at a time, so a binary file
or a record cut off by a kill is reported at its line, not as a UnicodeDecodeError or a
JSONDecodeError from deep inside.

Two rules for the last line when it has no newline and does not parse (a torn tail):
data files are written atomically, so there it is an error (`torn_tail="error"`); an
append-only log whose writer may be killed mid-line keeps the records before it and
reports the tail (`torn_tail="report"`). A complete last record without its newline is
kept in both and flagged `unterminated`, so a writer can add the newline before appending.

Every file is read a line at a time, and no line past `MAX_LINE` bytes: what a file costs to
read is bounded by that, not by the file, which may have no newline at all, be a
device that never ends, or an archive that decompresses to one endless line. Only regular
files are read: a FIFO, a device or a socket is refused before a byte is read (`open_regular`).
"""

from __future__ import annotations

import io
import itertools
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

from dysco_interp.atomic import atomic_open
from dysco_interp.errors import DataError
from dysco_interp.outputs import file_kind, mode_kind

# The longest line read, in bytes (its newline not counted). The longest lines this package writes
# are task records of its longest prompts (one of 127K tokens is about 1.5 MB: the prompt's text
# twice, and its spans) and result records with a trace (27 kB at most in figures/, the rest a few
# kB); 16 MiB is ten times the first, room for prompts of about a million tokens, and still a
# small cost for one line of anything else: its bytes, and the objects they parse to, a few times that.
MAX_LINE = 16 << 20


class LineError(ValueError):
    """A line that holds no JSON object.

    `kind` is "encoding" (not UTF-8), "json" (not valid JSON), "not_object" (valid JSON
    but no object) or "too_long" (over `MAX_LINE` bytes, not read to its end); `str()` reads
    "line N: why".
    """

    def __init__(self, line: int, kind: str, why: str):
        super().__init__(f"line {line}: {why}")
        self.line, self.kind, self.why = line, kind, why


def parse_line(raw: bytes, number: int) -> dict | None:
    """The JSON object on one line (with or without its newline); None for a blank line.

    Raises LineError, numbered `number`, for anything else.
    """
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        why = f"not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1})"
        raise LineError(number, "encoding", why) from None
    if not line.strip():
        return None
    text = line.rstrip("\r\n")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        # an error at the very end of the line, or a string never closed, means the record
        # stops early: a cut-off write, not a typo
        cut = e.pos >= len(text.rstrip()) or e.msg.startswith("Unterminated string")
        where = f"{e.msg}{'' if e.msg.endswith(' at') else ' at'} column {e.colno}"
        why = f"{where}; the record stops early, the file looks truncated" if cut else where
        raise LineError(number, "json", f"not valid JSON ({why})") from None
    except RecursionError:
        raise LineError(number, "json", "JSON nested too deeply to be a data record") from None
    if not isinstance(obj, dict):
        raise LineError(number, "not_object", f"expected a JSON object, got {type(obj).__name__}")
    return obj


@dataclass(frozen=True)
class ParsedLines:
    """What `parse_lines` found: (line number, object) per record, and how the data ended."""

    records: list[tuple[int, dict]]
    torn_tail: bool  # the last line had no newline and did not parse; it is not in records
    unterminated: bool  # the last record is complete but has no newline


def too_long(number: int) -> LineError:
    return LineError(number, "too_long", f"longer than {MAX_LINE >> 20} MiB, more than any record holds; "
                                         "it was not read further")


def read_lines(stream: BinaryIO | io.BufferedIOBase, first: int = 1) -> Iterator[tuple[int, bytes]]:
    """(number, bytes) for each line of a binary stream, its newline kept, numbered from `first`.

    A line over `MAX_LINE` bytes is a LineError ("too_long") once that much of it is read:
    no more of it is ever held.
    """
    for number in itertools.count(first):
        raw = stream.readline(MAX_LINE + 1)
        if not raw:
            return
        if len(raw) > MAX_LINE and not raw.endswith(b"\n"):
            raise too_long(number)
        yield number, raw


class Records:
    """(line number, object) for each record of JSONL lines (from `read_lines`), parsed as they
    are read; blank lines are skipped.

    A bad line before the last raises LineError. A bad last line without a newline raises too
    with `torn_tail="error"`, and is dropped and reported with `torn_tail="report"`. Once read
    to the end, `torn_tail` and `unterminated` say how the data ended (as in `ParsedLines`).
    """

    def __init__(self, lines: Iterable[tuple[int, bytes]], torn_tail: Literal["error", "report"] = "error"):
        if torn_tail not in ("error", "report"):
            raise ValueError(f"torn_tail must be 'error' or 'report', got {torn_tail!r}")
        self.lines, self.rule = lines, torn_tail
        self.torn_tail = self.unterminated = False

    def __iter__(self) -> Iterator[tuple[int, dict]]:
        for number, raw in self.lines:
            if raw.endswith(b"\n"):
                obj = parse_line(raw, number)
            else:  # the last line: only the end of the data has no newline
                try:
                    obj = parse_line(raw, number)
                except LineError:
                    if self.rule == "error":
                        raise
                    self.torn_tail = True
                    continue
                self.unterminated = obj is not None
            if obj is not None:
                yield number, obj


def parse_lines(data: bytes, *, torn_tail: Literal["error", "report"] = "error") -> ParsedLines:
    """Every record of JSONL bytes (`Records` read to the end)."""
    records = Records(read_lines(io.BytesIO(data)), torn_tail)
    return ParsedLines(list(records), records.torn_tail, records.unterminated)


class NotRegularFileError(OSError):
    """A path that is no regular file; `kind` says what it is ("a FIFO (named pipe)", "a folder", ...)."""

    def __init__(self, path: str | Path, kind: str):
        super().__init__(f"{path} is {kind}, not a regular file")
        self.kind = kind


# A file read whole (a prompt, a head file) is at most this: a million-token prompt is a few MB
MAX_WHOLE_FILE = 64 << 20


def read_whole(f: BinaryIO, what: str) -> bytes:
    """All of an opened file, or a DataError naming `what` once it passes MAX_WHOLE_FILE (a
    device that never ends is refused at that point, not held in memory)."""
    data = f.read(MAX_WHOLE_FILE + 1)
    if len(data) > MAX_WHOLE_FILE:
        raise DataError(f"{what} is larger than {MAX_WHOLE_FILE >> 20} MiB; it was not read further")
    return data


def read_input(path: str | Path, what: str) -> bytes:
    """All of the input file at `path`, `what` naming it in one-line DataErrors ("notebook", "PNG
    file"): missing, a folder, no regular file, unreadable, or larger than MAX_WHOLE_FILE."""
    with open_input(path, f"{{path}}: no such {what}", f"{{path}} is a folder; name a {what}",
                    "cannot read {path}: {why}", f"{{path}} is {{kind}}, not a regular file; name a {what}") as f:
        return read_whole(f, f"{what} {path}")


def open_regular(path: str | Path) -> BinaryIO:
    """`path` opened for binary reading when it is a regular file, else NotRegularFileError.

    Opened without waiting (O_NONBLOCK: a FIFO does not block for a writer) and judged on what was
    opened (fstat), so a file swapped for a FIFO after any earlier check is refused too. Other
    failures are the OSError that opening raised (FileNotFoundError, PermissionError, ...).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except OSError:
        kind = file_kind(path)  # a socket cannot be opened at all: say what it is
        if kind is not None:
            raise NotRegularFileError(path, kind) from None
        raise
    try:
        kind = mode_kind(os.fstat(fd).st_mode)
        if kind is not None:
            raise NotRegularFileError(path, kind)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def open_input(path: str | Path, missing: str, folder: str, unreadable: str,
               other: str = "{path} is {kind}, not a regular file") -> BinaryIO:
    """`path` opened for binary reading (`open_regular`); a DataError with the given words (each
    formatted with `path`, `unreadable` also with `why`, `other` with `kind`) when it is missing, a
    folder, no regular file (a FIFO, a device, a socket) or unreadable."""
    try:
        return open_regular(path)
    except FileNotFoundError:
        raise DataError(missing.format(path=path)) from None
    except NotRegularFileError as e:
        words = folder if e.kind == "a folder" else other
        raise DataError(words.format(path=path, kind=e.kind)) from None
    except OSError as e:
        raise DataError(unreadable.format(path=path, why=e.strerror or e)) from None


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line of a data file, read as it goes.

    Strict: any bad line, the last one included, is a DataError naming the file and the line.
    """
    path = Path(path)
    f = open_input(path, "data file not found: {path}", "{path} is a folder, not a JSONL data file",
                   "cannot read data file {path}: {why}",
                   "{path} is {kind}, not a regular file; name a JSONL data file")
    with f:
        try:
            yield from Records(read_lines(f))
        except LineError as e:
            hint = "; is it a JSONL data file?" if e.kind in ("encoding", "too_long") else ""
            raise DataError(f"{path}, {e}{hint}") from None
        except OSError as e:  # a disk error while reading
            raise DataError(f"cannot read data file {path}: {e.strerror or e}") from None


def write_jsonl(path: str | Path, records: Iterable) -> Path:
    """One JSON object per line; objects with `to_dict` are converted.

    Atomic: the lines go to a temporary file beside `path`, which then replaces it, so a
    killed run or a record that cannot be serialised never leaves a truncated data file.
    """
    path = Path(path)
    with atomic_open(path) as f:
        for rec in records:
            obj = rec.to_dict() if hasattr(rec, "to_dict") else rec
            f.write(json.dumps(obj, ensure_ascii=False) + "\n")
    return path
