"""Module paths kept for one release after their code moved: each old module re-exports the new
one's names and says once, when imported, where they went."""

from __future__ import annotations

import warnings


def warn_moved(old: str, new: str) -> None:
    """The one DeprecationWarning of importing module `old`, whose names now live in `new`.
    Called from the old module's body: the warning points at the line that imported it (Python
    skips the import machinery's own frames), where the path is to be changed."""
    warnings.warn(f"{old} moved to {new}; the old path goes in the next release", DeprecationWarning, stacklevel=3)


__all__ = ["warn_moved"]
