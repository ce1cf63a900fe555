"""What may be written: the one rule for every output path, checked by the command line before
anything is computed and again by each writer.

An output is a regular file or a path that does not exist yet. A symbolic link stands for what
it points to, and writers write through it (the link stays a link). Anything else is refused:
a device reads as empty, so a writer would replace it (as root, /dev/null), a FIFO blocks
whoever opens it, and a folder or a socket cannot hold the content.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

from dysco_interp.errors import ConfigError

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class OutputPathError(ConfigError):
    """A path named for output cannot be written as a regular file (or a folder of them)."""


def file_kind(path: str | os.PathLike) -> str | None:
    """What an existing path that is no regular file is ("a folder", "a FIFO (named pipe)", ...),
    following symbolic links; None for a regular file, a missing path or a dangling link.
    An OSError when the path cannot be looked at (a link loop, no permission)."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    return mode_kind(mode)


def mode_kind(mode: int) -> str | None:
    """What a file of this `st_mode` is when no regular file ("a folder", "a FIFO (named pipe)", ...);
    None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def output_target(path: str | os.PathLike) -> Path:
    """The file that writing to `path` writes: `path` with its symbolic links resolved.
    OutputPathError when that is no regular file and no new path."""
    try:
        kind = file_kind(path)
    except OSError as e:
        raise OutputPathError(f"cannot write {os.fspath(path)}: {e.strerror}") from None
    if kind == "a folder":
        raise OutputPathError(f"{os.fspath(path)} is a folder; name the file to write inside it")
    if kind is not None:
        raise OutputPathError(f"{os.fspath(path)} is {kind}, not a regular file; name a regular file or a new path")
    return Path(os.path.realpath(path))


def _nearest_existing(path: Path) -> Path:
    for parent in (path, *path.parents):
        if parent.exists():
            return parent
    return Path(".")


def check_writable_below(path: Path, named: str | os.PathLike | None = None) -> None:
    """`path` can be created: no folder above it is a file, and the nearest existing one takes
    new files (tried with a nameless temporary file: permissions alone miss read-only and
    virtual file systems such as /proc, where even root creates nothing). Errors name `named`
    (the path as given), else `path`."""
    shown = os.fspath(path if named is None else named)
    anchor = _nearest_existing(path.parent if path.parent != path else path)
    if not anchor.is_dir():
        raise OutputPathError(f"{anchor} is a file, so {shown} cannot be created below it")
    if not os.access(anchor, os.W_OK | os.X_OK):
        raise OutputPathError(f"cannot write {shown}: no new file can be made in {anchor} "
                              f"({os.strerror(errno.EACCES)})")
    try:
        with tempfile.TemporaryFile(dir=anchor):
            pass
    except OSError as e:
        raise OutputPathError(f"cannot write {shown}: no new file can be made in {anchor} ({e.strerror})") from None


# How the files that commands replace begin, by suffix. An existing file that begins otherwise
# was not written by such a command (a note named like a table, a log named like a page): it is
# someone else's, and left alone.
SIGNATURES = {".json": (b"{", b"["), ".html": (b"<!doctype html", b"<html"), ".png": (b"\x89png",)}


def check_replaceable(path: str | os.PathLike, target: Path) -> None:
    """OutputPathError when `target` exists and does not begin as files of its suffix do."""
    signature = SIGNATURES.get(target.suffix.lower())
    if signature is None or not target.is_file():
        return
    with open(target, "rb") as f:
        head = f.read(64).lstrip().lower()
    if head and not head.startswith(signature):
        raise OutputPathError(f"{os.fspath(path)} exists and is no {target.suffix} file of ours (it begins "
                              f"{head[:16]!r}); it was left untouched: choose another path, or remove it")


def check_output_file(path: str | os.PathLike) -> Path:
    """The file to write for `path` (links resolved), checked before any work: a regular file
    or a new path (`output_target`), in a folder that exists or can be made, writable, and,
    when it exists, of the kind its suffix says (`check_replaceable`)."""
    if not os.fspath(path).strip():
        raise OutputPathError("an empty path")
    target = output_target(path)
    check_writable_below(target, path)
    if target.exists() and not os.access(target, os.W_OK):
        raise OutputPathError(f"cannot write {os.fspath(path)} ({os.strerror(errno.EACCES)})")
    check_replaceable(path, target)
    return target


# what a report written under one stem consists of (tables: STEM.md and STEM.json; figures add
# STEM.png and STEM.html)
STEM_SUFFIXES = (".md", ".json", ".png", ".html")


def check_output_stem(stem: str | os.PathLike) -> str:
    """`check_output_file` for every file a report under `stem` may write."""
    if not os.fspath(stem).strip():
        raise OutputPathError("an empty path")
    for suffix in STEM_SUFFIXES:
        check_output_file(os.fspath(stem) + suffix)
    return os.fspath(stem)


def check_output_folder(path: str | os.PathLike) -> Path:
    """A folder to write files in: an existing folder, or a path where one can be created."""
    if not os.fspath(path).strip():
        raise OutputPathError("an empty path")
    try:
        kind = file_kind(path)
    except OSError as e:
        raise OutputPathError(f"cannot write in {os.fspath(path)}: {e.strerror}") from None
    folder = Path(path)
    if folder.exists() and kind != "a folder":
        raise OutputPathError(f"{os.fspath(path)} is {'an existing file' if kind is None else kind}, not a folder")
    check_writable_below(Path(os.path.realpath(folder)) / "x", path)  # x: any file the folder will hold
    return folder


__all__ = [
    "OutputPathError",
    "check_output_file",
    "check_output_folder",
    "check_output_stem",
    "check_replaceable",
    "check_writable_below",
    "file_kind",
    "mode_kind",
    "output_target",
]
