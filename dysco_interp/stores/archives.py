"""Store names that find a store's compressed archive too.

Finished result stores are committed xz-compressed, as `NAME.jsonl.xz`, to keep the repository
small. Every reader opens an archive as it is (`stores.format` judges a file by its bytes,
not its name), but a writer cannot resume one. So that the commands and defaults that name
`NAME.jsonl` or `*.jsonl` keep working on the committed results, a store name stands for the file
of that name or, where only that exists, its archive; a store and its archive are one store, the
uncompressed one being the one a run extends; `expand` turns the names and patterns a table is
given into its store files. It imports nothing heavy: figure-only drivers use it.
"""

from __future__ import annotations

import glob
from collections.abc import Iterable
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


def expand(patterns: Iterable[str]) -> tuple[list[Path], list[str]]:
    """Files matched by glob patterns (or named outright), sorted and unique; and the patterns
    that matched nothing. A store's name or pattern finds its compressed archive too (`stored`,
    `glob_stores`). A path named outright is kept whatever it is, and so is anything but a folder
    that a pattern matches: the reader refuses a FIFO or a device as no regular file, rather than
    the table saying nothing matched."""
    files: list[Path] = []
    unmatched: list[str] = []
    for pattern in patterns:
        if glob.has_magic(str(pattern)):
            hits = [Path(h) for h in glob_stores(pattern) if not Path(h).is_dir()]
        else:
            hits = [stored(pattern)] if stored(pattern).exists() else []
        if not hits:
            unmatched.append(str(pattern))
        files.extend(hits)
    return sorted(set(files)), unmatched


__all__ = ["ARCHIVE_SUFFIXES", "STORE_SUFFIX", "expand", "glob_stores", "stored", "stores_in"]
