"""Resumable experiment runs: JSONL files with one record per finished item.

A record is written (and flushed to disk) as soon as its item finishes, so a run that
is killed keeps every finished result and, when started again, skips them. A line cut
short by the kill is dropped when the file is opened again. Records are plain JSON, never pickles.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence

DEFAULT_KEY = ("model", "task", "length", "method", "seed", "index")


class ResultStore:
    """An append-only JSONL file of records, each identified by its `key_fields`."""

    def __init__(self, path: str | Path, key_fields: Sequence[str] = DEFAULT_KEY):
        self.path = Path(path)
        self.key_fields = tuple(key_fields)
        self._drop_partial_last_line()
        self._done = {self.key(r) for r in self.records()}

    def _drop_partial_last_line(self) -> None:
        """A run killed mid-write leaves an unfinished last line; that item was not finished."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            self.path.write_bytes(data[: data.rfind(b"\n") + 1])

    def key(self, record: dict) -> tuple:
        missing = [k for k in self.key_fields if k not in record]
        if missing:
            raise KeyError(f"record lacks key field(s) {missing}; keys are {self.key_fields}")
        return tuple(json.dumps(record[k], sort_keys=True) for k in self.key_fields)

    def records(self) -> list[dict]:
        if not self.path.exists():
            return []
        out = []
        with open(self.path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                raise ValueError(f"{self.path}: line {i + 1} is not valid JSON") from None
        return out

    def __contains__(self, record: dict) -> bool:
        """Whether a record with the same key fields is stored (other fields are ignored)."""
        return self.key(record) in self._done

    def __len__(self) -> int:
        return len(self._done)

    def append(self, record: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(record, sort_keys=True, allow_nan=False)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
        self._done.add(self.key(record))
