"""Read evaluation result stores (JSONL written by ResultStore) for tables, read-only.

Reading never rewrites the file (`runner.read_store`): a line cut short by a killed run is
skipped, and the settings header is not a record.
"""

from __future__ import annotations

import glob
from collections.abc import Iterable
from pathlib import Path

from dysco_interp.errors import ConfigError
from dysco_interp.experiments.store import read_store

REQUIRED_FIELDS = ("model", "task", "method", "index", "config")


def expand(patterns: Iterable[str]) -> tuple[list[Path], list[str]]:
    """Files matched by glob patterns (or named outright), sorted and unique; and the patterns
    that matched nothing."""
    files: list[Path] = []
    unmatched: list[str] = []
    for pattern in patterns:
        hits = sorted(glob.glob(str(pattern))) if glob.has_magic(str(pattern)) else (
            [str(pattern)] if Path(pattern).is_file() else [])
        if not hits:
            unmatched.append(str(pattern))
        files.extend(Path(h) for h in hits if Path(h).is_file())
    return sorted(set(files)), unmatched


def read_records(path: str | Path) -> list[dict]:
    """The evaluation records of one store (either format), checked to be evaluation records."""
    contents = read_store(path)
    if contents is None:
        return []
    for record in contents.records:
        missing = [f for f in REQUIRED_FIELDS if f not in record]
        if missing:
            raise ConfigError(f"{path}: a record lacks {', '.join(missing)}; not an evaluation store")
    return contents.records


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
