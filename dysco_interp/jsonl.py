"""JSON Lines: the one reader and writer of the package.

One record per line, each a JSON object. Lines are decoded one at a time, so a binary file
or a record cut off by a kill is reported at its line, not as a UnicodeDecodeError or a
JSONDecodeError from deep inside.

Two rules for the last line when it has no newline and does not parse (a torn tail):
data files are written atomically, so there it is an error (`torn_tail="error"`); an
append-only log whose writer may be killed mid-line keeps the records before it and
reports the tail (`torn_tail="report"`). A complete last record without its newline is
kept in both and flagged `unterminated`, so a writer can add the newline before appending.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from dysco_interp.atomic import atomic_open
from dysco_interp.errors import DataError


class LineError(ValueError):
    """A line that holds no JSON object.

    `kind` is "encoding" (not UTF-8), "json" (not valid JSON) or "not_object" (valid JSON
    but no object); `str()` reads "line N: why".
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


def parse_lines(data: bytes, *, torn_tail: Literal["error", "report"] = "error") -> ParsedLines:
    """Every record of JSONL bytes; blank lines are skipped.

    A bad line before the last raises LineError. A bad last line without a newline raises
    too with `torn_tail="error"`, and is dropped and reported with `torn_tail="report"`.
    """
    if torn_tail not in ("error", "report"):
        raise ValueError(f"torn_tail must be 'error' or 'report', got {torn_tail!r}")
    *lines, tail = data.split(b"\n")  # tail is b"" when the data ends with a newline
    records = []
    for number, raw in enumerate(lines, 1):
        obj = parse_line(raw, number)
        if obj is not None:
            records.append((number, obj))
    torn = unterminated = False
    try:
        obj = parse_line(tail, len(lines) + 1)
    except LineError:
        if torn_tail == "error":
            raise
        torn = True
    else:
        if obj is not None:
            records.append((len(lines) + 1, obj))
            unterminated = True
    return ParsedLines(records, torn, unterminated)


def open_input(path: str | Path, missing: str, folder: str, unreadable: str):
    """`path` opened for binary reading; a DataError with the given words (each formatted with
    `path`, and `unreadable` also with `why`) when it is missing, a folder or unreadable."""
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise DataError(missing.format(path=path)) from None
    except IsADirectoryError:
        raise DataError(folder.format(path=path)) from None
    except OSError as e:
        raise DataError(unreadable.format(path=path, why=e.strerror or e)) from None


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line of a data file, read as it goes.

    Strict: any bad line, the last one included, is a DataError naming the file and the line.
    """
    path = Path(path)
    f = open_input(path, "data file not found: {path}", "{path} is a folder, not a JSONL data file",
                   "cannot read data file {path}: {why}")
    with f:
        for number, raw in enumerate(f, 1):
            try:
                obj = parse_line(raw, number)
            except LineError as e:
                hint = "; is it a JSONL data file?" if e.kind == "encoding" else ""
                raise DataError(f"{path}, {e}{hint}") from None
            if obj is not None:
                yield number, obj


def read_jsonl(path: str | Path, cls=None) -> list:
    """Records of a JSONL data file, as `cls.from_dict(...)` when a class is given."""
    return [cls.from_dict(obj) if cls is not None else obj for _, obj in iter_jsonl(path)]


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
