"""Read evaluation result stores (JSONL written by ResultStore) for tables, read-only.

Unlike opening a ResultStore, reading never rewrites the file: a line cut short by a
killed run (the unfinished last line) is skipped, and settings headers are skipped.
"""

from __future__ import annotations

import glob
import json
from collections.abc import Iterable
from pathlib import Path

from dysco_interp.errors import ConfigError

REQUIRED_FIELDS = ("model", "task", "method", "index", "config")


def expand(patterns: Iterable[str]) -> tuple[list[Path], list[str]]:
    """Files matched by glob patterns (or named outright), sorted and unique; and the patterns
    that matched nothing."""
    files, unmatched = [], []
    for pattern in patterns:
        hits = sorted(glob.glob(str(pattern))) if glob.has_magic(str(pattern)) else (
            [str(pattern)] if Path(pattern).is_file() else [])
        if not hits:
            unmatched.append(str(pattern))
        files.extend(Path(h) for h in hits if Path(h).is_file())
    return sorted(set(files)), unmatched


def read_records(path: str | Path) -> list[dict]:
    path = Path(path)
    lines = path.read_text(encoding="utf-8").split("\n")
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:  # no newline after it: a write cut short, that item never finished
                continue
            raise ConfigError(f"{path}: line {i + 1} is not valid JSON") from None
        if not isinstance(record, dict):
            raise ConfigError(f"{path}: line {i + 1} is not a JSON object")
        if record.get("kind") == "header":
            continue
        missing = [f for f in REQUIRED_FIELDS if f not in record]
        if missing:
            raise ConfigError(f"{path}: line {i + 1} lacks {', '.join(missing)}; not an evaluation record")
        records.append(record)
    return records


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


def load_deduplicated(patterns: Iterable[str]) -> tuple[list[dict], list[Path], list[str], int]:
    """Records of the matching stores with repeated items dropped: (records, files, patterns
    that matched nothing, how many were dropped); ConfigError when there is nothing at all."""
    from dysco_interp.analysis.result_tables import dedupe

    patterns = list(patterns)
    records, files, unmatched = load_records(patterns)
    if not records:
        raise ConfigError(f"no records in {' '.join(patterns)}")
    records, dropped = dedupe(records)
    return records, files, unmatched, dropped
