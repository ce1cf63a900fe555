"""Resumable experiment runs: JSONL files with one record per finished item.

A record is written (and flushed to disk) as soon as its item finishes, so a run that
is killed keeps every finished result and, when started again, skips them. A line cut
short by the kill is dropped when the file is opened again. An optional header line
records the settings the records depend on; reopening with other settings is an error
rather than a silent mix. Records are plain JSON, never pickles.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dysco_interp.errors import ConfigError

DEFAULT_KEY = ("model", "task", "length", "method", "seed", "index")
_UNCHECKED_HEADER_FIELDS = ("package_version",)


class ResultStore:
    """An append-only JSONL file of records, each identified by its `key_fields`."""

    def __init__(self, path: str | Path, key_fields: Sequence[str] = DEFAULT_KEY, header: dict | None = None):
        self.path = Path(path)
        self.key_fields = tuple(key_fields)
        self.header = None if header is None else {"kind": "header", **header}
        self._drop_partial_last_line()
        rows = self._read()
        if self.header is not None:
            if rows:
                self._check_header(rows.pop(0))
            else:
                self._write(self.header)
        self._by_key = {self.key(r): r for r in rows}

    def _drop_partial_last_line(self) -> None:
        """A run killed mid-write leaves an unfinished last line; that item was not finished."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            self.path.write_bytes(data[: data.rfind(b"\n") + 1])

    def _read(self) -> list[dict]:
        if not self.path.exists():
            return []
        rows = []
        for i, line in enumerate(self.path.read_text(encoding="utf-8").split("\n")):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                raise ConfigError(f"{self.path}: line {i + 1} is not valid JSON; the file is corrupt") from None
        return rows

    def _check_header(self, found: Any) -> None:
        if not isinstance(found, dict) or found.get("kind") != "header":
            raise ConfigError(f"{self.path}: the first line is not a settings header")
        mine = {k: v for k, v in self.header.items() if k not in _UNCHECKED_HEADER_FIELDS}
        theirs = {k: v for k, v in found.items() if k not in _UNCHECKED_HEADER_FIELDS}
        if mine != theirs:
            diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
            raise ConfigError(
                f"{self.path} holds a run with other settings (differs in: {', '.join(diff)}); "
                "use another output or delete it"
            )

    def key(self, record: dict) -> tuple:
        missing = [k for k in self.key_fields if k not in record]
        if missing:
            raise KeyError(f"record lacks key field(s) {missing}; keys are {self.key_fields}")
        return tuple(json.dumps(record[k], sort_keys=True) for k in self.key_fields)

    def records(self) -> list[dict]:
        return list(self._by_key.values())

    def get(self, record: dict) -> dict:
        """The stored record with the same key fields as `record`."""
        return self._by_key[self.key(record)]

    def __contains__(self, record: dict) -> bool:
        """Whether a record with the same key fields is stored (other fields are ignored)."""
        return self.key(record) in self._by_key

    def __len__(self) -> int:
        return len(self._by_key)

    def append(self, record: dict) -> None:
        key = self.key(record)
        self._write(record)
        self._by_key[key] = record

    def _write(self, record: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(record, sort_keys=True, allow_nan=False)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
