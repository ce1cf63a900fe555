"""Files that appear whole or not at all: write a temporary file beside the target, then rename."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from dysco_interp.outputs import output_target


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """`data` replaces `path` as `atomic_open` replaces a text file (whole or not at all)."""
    with atomic_open(path, encoding="latin-1") as f:  # latin-1 maps each byte to one character and back
        f.write(data.decode("latin-1"))
    return Path(path)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, encoding: str = "utf-8") -> Iterator[TextIO]:
    """A text stream whose content replaces `path` when the block ends without an error.

    A killed process or an exception leaves the previous file (or none), never a truncated one.
    The file gets the permissions a plain `open` would give it (mkstemp's are owner-only).
    A symbolic link is written through: its target is replaced, the link stays. A path that is
    no regular file (a folder, a FIFO, a device) is an `OutputPathError`, left as it is.
    """
    path = output_target(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, 0o666 & ~_umask())
        with os.fdopen(fd, "w", encoding=encoding, newline="") as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


__all__ = ["atomic_open", "atomic_write_bytes"]
