"""Manifests of converted folders, and the checks that find a damaged folder before use.

The completion marker records a manifest: the GGUF's SHA-256 and every file of the
folder with its size and SHA-256. Each use checks the folder cheaply (every file
present at its recorded size; files up to `SMALL_FILE_BYTES`, i.e. the config and the
tokenizer, also by hash); hashing the weights too (6.7 GB for the largest model) is
`verify_converted`, or `dysco-interp models --verify`.

Only hashes taken at conversion, from a GGUF checked against the registry, can certify a
folder (`FolderState.trusted`). A folder converted before manifests existed has none: it is
checked by structure (every JSON parses, every safetensors file is as long as its header
says). Manifests of version 2 cannot certify either: that version also recorded the hashes of
such a folder at its first load, whatever its weights then held. Both are converted again at
their next load where the packages allow (`conversion.ensure_converted`).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from dysco_interp.models.packaged.cache import converted_folder
from dysco_interp.models.packaged.registry import PackagedModel

_COMPLETE_MARKER = "dysco_conversion.json"
_MARKER_TMP = f".{_COMPLETE_MARKER}.tmp"
HASH_BLOCK = 1 << 22
MANIFEST_VERSION = 3
# From this version on, a manifest's hashes were taken at conversion and nowhere else.
TRUSTED_SINCE = 3
# Config, generation config and tokenizer files (Qwen's tokenizer.json is 7 MB) are hashed
# at every use; the weights (500 MB to 6.7 GB) only by size.
SMALL_FILE_BYTES = 32 << 20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def folder_manifest(folder: Path) -> dict[str, dict]:
    """{relative path: {"size", "sha256"}} for every file under `folder` but the marker."""
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        if rel not in (_COMPLETE_MARKER, _MARKER_TMP):
            files[rel] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
    return files


def manifest_problem(folder: Path, files: dict, full: bool = False) -> str | None:
    """What is wrong with `folder` against its manifest, or None.

    Every file must exist at its recorded size; small files (or all, when `full`) must hash
    to their recorded SHA-256. Files the manifest does not name are ignored.
    """
    for rel, entry in sorted(files.items()):
        path = folder / rel
        if not path.is_file():
            return f"{rel} is missing"
        size = path.stat().st_size
        if size != entry["size"]:
            return f"{rel} is {size} bytes, expected {entry['size']}"
        if (full or size <= SMALL_FILE_BYTES) and sha256_file(path) != entry["sha256"]:
            return f"{rel} does not match its recorded sha256"
    return None


def _safetensors_problem(path: Path) -> str | None:
    # Header: u64 length, then JSON with each tensor's byte range; the data follows it exactly.
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if 8 + n > size:
                return f"{path.name} is {size} bytes, shorter than its header says (truncated)"
            header = json.loads(f.read(n))
        end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    except (OSError, ValueError, KeyError, TypeError, IndexError, struct.error):
        return f"{path.name} has a broken header"
    if size != 8 + n + end:
        return f"{path.name} is {size} bytes, its header says {8 + n + end}"
    return None


def structure_problem(folder: Path) -> str | None:
    """What is visibly broken in a safetensors folder without a manifest, or None."""
    if not (folder / "config.json").is_file():
        return "config.json is missing"
    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        return "no .safetensors file"
    for path in sorted(folder.glob("*.json")):
        try:
            json.loads(path.read_text())
        except (OSError, ValueError):
            return f"{path.name} is not valid JSON"
    return next((p for p in map(_safetensors_problem, weights) if p), None)


@dataclass(frozen=True)
class FolderState:
    """A converted folder as found: "converted", "not converted" or "corrupt" (with why)."""

    folder: Path
    status: str
    reason: str = ""
    # converted by a version that recorded no manifest: checked by structure only
    legacy: bool = False
    # its manifest's hashes were taken at conversion from the verified GGUF: they can certify it
    trusted: bool = False

    @property
    def ok(self) -> bool:
        return self.status == "converted"


def _read_marker(folder: Path) -> dict | None:
    try:
        record = json.loads((folder / _COMPLETE_MARKER).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def check_folder(model: PackagedModel, full: bool = False) -> FolderState:
    """The state of a packaged model's converted folder; `full` hashes the weights too."""
    folder = converted_folder(model)
    if not (folder / _COMPLETE_MARKER).is_file():
        return FolderState(folder, "not converted")
    record = _read_marker(folder)
    if record is None:
        return FolderState(folder, "corrupt", f"{_COMPLETE_MARKER} is unreadable")
    if record.get("gguf_sha256") != model.sha256:
        return FolderState(folder, "corrupt", f"{_COMPLETE_MARKER} records another GGUF")
    files = record.get("files")
    if files is None:
        problem = structure_problem(folder)
        if problem:
            return FolderState(folder, "corrupt", problem, legacy=True)
        return FolderState(folder, "converted", "converted by an older version: no manifest yet", legacy=True)
    try:
        problem = manifest_problem(folder, files, full)
    except (AttributeError, KeyError, TypeError):
        problem = f"{_COMPLETE_MARKER} has a malformed manifest"
    if problem:
        return FolderState(folder, "corrupt", problem)
    version = record.get("manifest_version")
    trusted = isinstance(version, int) and not isinstance(version, bool) and version >= TRUSTED_SINCE
    return FolderState(folder, "converted", trusted=trusted)


def is_converted(model: PackagedModel) -> bool:
    """Whether the converted folder exists and passes the cheap check."""
    return check_folder(model).ok


def verify_converted(model: PackagedModel) -> FolderState:
    """The full check: every file of the folder hashed against the manifest (seconds per GB)."""
    return check_folder(model, full=True)


def write_marker(folder: Path, record: dict) -> None:
    """Write the completion marker atomically: readers never see a half-written one."""
    tmp = folder / _MARKER_TMP
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, folder / _COMPLETE_MARKER)


def conversion_record(model: PackagedModel, folder: Path) -> dict:
    """The marker's content for a folder just converted from the model's GGUF."""
    return {
        "alias": model.alias,
        "gguf_sha256": model.sha256,
        "upstream": model.upstream,
        "manifest_version": MANIFEST_VERSION,
        "files": folder_manifest(folder),
    }
