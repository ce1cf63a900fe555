"""Store names that find a store's compressed archive too.

Finished result stores are committed xz-compressed, as `NAME.jsonl.xz`, to keep the repository
small. Every reader opens an archive as it is (`experiments.store_format` judges a file by its
bytes, not its name), but a writer cannot resume one. So that the commands and defaults that name
`NAME.jsonl` or `*.jsonl` keep working on the committed results, a store name stands for the file
of that name or, where only that exists, its archive; a store and its archive are one store, the
uncompressed one being the one a run extends. It imports nothing heavy: figure-only drivers use it.
"""

from __future__ import annotations

import glob
from pathlib import Path

STORE_SUFFIX = ".jsonl"
# what `xz` and `gzip` append: the two formats the readers decompress
ARCHIVE_SUFFIXES = (".xz", ".gz")


def stored(path: str | Path) -> Path:
    """`path`, or its archive when only that exists. A writer handed the archive refuses to
    resume it, saying how to decompress it, instead of starting a second store beside it."""
    path = Path(path)
    if path.exists() or path.is_symlink() or not path.name.endswith(STORE_SUFFIX):
        return path
    archives = (path.with_name(path.name + suffix) for suffix in ARCHIVE_SUFFIXES)
    return next((a for a in archives if a.exists()), path)


def glob_stores(pattern: str | Path) -> list[str]:
    """The files a glob pattern matches, sorted; a pattern for `.jsonl` files also matches the
    archives of stores it would match uncompressed, each store once (the uncompressed file where
    both are there)."""
    # strings, not Paths: a match keeps the pattern's spelling ("./x"), so the two lists compare
    pattern = str(pattern)
    hits = set(glob.glob(pattern))
    if pattern.endswith(STORE_SUFFIX):
        for suffix in ARCHIVE_SUFFIXES:
            hits.update(h for h in glob.glob(pattern + suffix) if h.removesuffix(suffix) not in hits)
    return sorted(hits)


def stores_in(folder: str | Path) -> list[Path]:
    """The stores in `folder` (`*.jsonl`, or their archives where only those are there), sorted."""
    return [Path(h) for h in glob_stores(Path(folder) / f"*{STORE_SUFFIX}")]
