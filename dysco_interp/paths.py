"""File names made from values read out of data files (a record's model, task, index).

Such a value is data, not a path: `safe_component` turns it into one file-name component, so
that no name in a store can lead a write outside the folder a command was given.
"""

from __future__ import annotations

import hashlib
import re

# what a name may hold unchanged: the aliases and labels our own stores write
_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}")
_UNSAFE_RUN = re.compile(r"[^A-Za-z0-9._+-]+")
_MAX = 80


def safe_component(value: object) -> str:
    """`value` as one file-name component: unchanged when it is a plain name (letters, digits,
    '.', '_', '+', '-', not starting with a dot, at most 100 characters); otherwise its unsafe
    runs become '_', leading dots and dashes go, it is cut to 80 characters and a short hash of
    the original follows, so two different names never share a file."""
    text = str(value)
    if _SAFE.fullmatch(text) and ".." not in text:
        return text
    cleaned = _UNSAFE_RUN.sub("_", text).replace("..", "_").lstrip("._-")[:_MAX]
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{cleaned}-{digest}" if cleaned else digest
