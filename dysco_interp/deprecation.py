"""What is kept for one release after it changed, and its one notice: module paths whose code
moved (each old module re-exports the new one's names and says, when imported, where they went),
and declarations that a new one replaced."""

from __future__ import annotations

import warnings


def warn_moved(old: str, new: str) -> None:
    """The one DeprecationWarning of importing module `old`, whose names now live in `new`.
    Called from the old module's body: the warning points at the line that imported it (Python
    skips the import machinery's own frames), where the path is to be changed."""
    warnings.warn(f"{old} moved to {new}; the old path goes in the next release", DeprecationWarning, stacklevel=3)


def warn_deprecated(old: str, new: str, stacklevel: int = 2) -> None:
    """The one-line DeprecationWarning of `old`, still honoured, with what to do instead (`new`).
    `stacklevel` counts from the caller, as `warnings.warn`'s does: point it at the user's line."""
    warnings.warn(f"{old} is deprecated and goes in the next release: {new}", DeprecationWarning,
                  stacklevel=stacklevel + 1)


__all__ = ["warn_deprecated", "warn_moved"]
