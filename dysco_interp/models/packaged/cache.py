"""The cache folder of converted models: where it is, whether it can be written, and what
lives in it for each packaged model (its converted folder, the lock that serialises its
conversion, and work folders that a killed conversion left behind)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from filelock import FileLock, Timeout

from dysco_interp.errors import ConfigError
from dysco_interp.models.packaged.registry import PackagedModel

CACHE_ENV = "DYSCO_INTERP_CACHE"


def _cache_label(root: Path) -> str:
    env = os.environ.get(CACHE_ENV)
    return f"${CACHE_ENV}={env}" if env else f"the model cache {root} (set ${CACHE_ENV} to move it)"


def cache_root() -> Path:
    """Where converted models live: $DYSCO_INTERP_CACHE, else ~/.cache/dysco-interp.

    A ConfigError when that path is a file or lies inside one (checked without writing).
    """
    env = os.environ.get(CACHE_ENV)
    root = (Path(env) if env else Path.home() / ".cache" / "dysco-interp").expanduser()
    blocker = next((p for p in (root, *root.parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        where = "is a file" if blocker == root else f"lies inside the file {blocker}"
        raise ConfigError(f"{_cache_label(root)} {where}, not a folder: point ${CACHE_ENV} at a folder")
    return root


def check_cache_writable(purpose: str) -> Path:
    """The cache root, or a ConfigError when converting cannot write there (before any slow work)."""
    root = cache_root()
    existing = next(p for p in (root, *root.parents) if p.exists())
    # A cache that does not exist yet is created inside its nearest existing parent.
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "is not writable" if existing == root else f"cannot be created (no write access to {existing})"
        raise ConfigError(f"{_cache_label(root)} {where}, and {purpose} needs to write there: "
                          f"point ${CACHE_ENV} at a writable folder")
    return root


def converted_folder(model: PackagedModel) -> Path:
    return cache_root() / "models" / f"{model.alias}-{model.sha256[:12]}"


def conversion_lock(model: PackagedModel, timeout: float = -1) -> FileLock:
    """The file lock held while a model's folder is converted, replaced or amended."""
    return FileLock(str(converted_folder(model)) + ".lock", timeout=timeout)


# --- stale temporary folders -------------------------------------------------------------


def partial_prefix(model: PackagedModel) -> str:
    """The name prefix of a conversion's work folder, beside the converted folder."""
    return f".{converted_folder(model).name}.partial-"


def stale_folders(model: PackagedModel) -> list[Path]:
    """Work folders of this model beside its converted folder: from a conversion in progress
    or one that was killed (SIGKILL skips TemporaryDirectory's cleanup)."""
    parent = converted_folder(model).parent
    if not parent.is_dir():
        return []
    name = converted_folder(model).name
    # Older versions named their work folder .<alias>-<8 random characters>.
    legacy = re.compile(rf"\.{re.escape(model.alias)}-[a-z0-9_]{{8}}")
    return sorted(
        p for p in parent.iterdir()
        if p.is_dir() and (p.name.startswith((f".{name}.partial-", f".{name}.broken-")) or legacy.fullmatch(p.name))
    )


def remove_stale(model: PackagedModel) -> None:
    """Delete the model's work folders; call it only under `conversion_lock`, when no
    conversion of this model can be running."""
    for path in stale_folders(model):
        shutil.rmtree(path, ignore_errors=True)


def remove_stale_if_idle(model: PackagedModel) -> None:
    """Delete the model's work folders unless a conversion holds the lock right now."""
    if not stale_folders(model):
        return
    try:
        with conversion_lock(model, timeout=0):
            remove_stale(model)
    except (Timeout, OSError):  # a conversion is running, or the cache is read-only
        pass


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
