"""Checked values of head sets and head files: head labels, indices, scores, (layer, head) pairs.

Every check raises a HeadSetError naming the field, so a bad value in a file or in a
constructor call gets the same words.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Mapping
from typing import Any

from dysco_interp.checks import brief, is_int
from dysco_interp.heads.errors import HeadSetError
from dysco_interp.hooks import Head

# One pattern per accepted spelling; signs are allowed here so that a negative index
# gets its own message instead of "bad label".
_LABEL_PATTERNS = (
    re.compile(r"^L(-?\d+)H(-?\d+)$"),  # TransformerLens: L16H3
    re.compile(r"^(-?\d+)-(-?\d+)$"),  # QRHead / Retrieval_Head: 16-3
    re.compile(r"^\(\s*(-?\d+)\s*,\s*(-?\d+)\s*\)$"),  # DySCO tuple as text: (16, 3)
)


def parse_head_label(text: str) -> Head:
    """Parse 'L16H3', '16-3' or '(16, 3)' into (16, 3); anything else is a HeadSetError."""
    if not isinstance(text, str):
        raise HeadSetError(f"head label must be a string, got {type(text).__name__} {brief(text)}")
    for pattern in _LABEL_PATTERNS:
        m = pattern.match(text.strip())
        if m:
            layer, head = int(m.group(1)), int(m.group(2))
            if layer < 0 or head < 0:
                raise HeadSetError(f"head label {brief(text)} has a negative index")
            return layer, head
    raise HeadSetError(f"bad head label {brief(text)}: expected 'layer-head' ('16-3'), 'L16H3' or '(16, 3)'")


def is_head_label(x: Any) -> bool:
    try:
        parse_head_label(x)
    except HeadSetError:
        return False
    return True


def require(cond: bool, msg: str) -> None:
    if not cond:
        raise HeadSetError(msg)


def nonneg_int(x: Any, what: str) -> int:
    if not is_int(x):
        raise HeadSetError(f"{what} must be an integer, got {type(x).__name__} {brief(x)}")
    v = operator.index(x)
    if v < 0:
        raise HeadSetError(f"{what} must be >= 0, got {v}")
    return v


def positive_int(x: Any, what: str) -> int:
    v = nonneg_int(x, what)
    if v == 0:
        raise HeadSetError(f"{what} must be >= 1, got 0")
    return v


def score(x: Any, what: str) -> float:
    if isinstance(x, (bool, str)) or x is None:
        raise HeadSetError(f"{what} must be a number, got {type(x).__name__} {brief(x)}")
    try:
        v = float(x)
    except (TypeError, ValueError):
        raise HeadSetError(f"{what} must be a number, got {type(x).__name__} {brief(x)}") from None
    if not math.isfinite(v):
        raise HeadSetError(f"{what} must be finite, got {v}")
    return v


def optional_str(x: Any, what: str) -> str | None:
    if x is not None and not isinstance(x, str):
        raise HeadSetError(f"{what} must be a string or null, got {type(x).__name__} {brief(x)}")
    return x


def head_pair(x: Any, what: str) -> Head:
    """A (layer, head) pair from a label or a length-2 sequence of non-negative ints."""
    if isinstance(x, str):
        return parse_head_label(x)
    # Sets and mappings have no order; anything else must be a length-2 sequence.
    if isinstance(x, (Mapping, set, frozenset, bytes)) or not hasattr(x, "__len__"):
        raise HeadSetError(f"{what} must be a (layer, head) pair, got {type(x).__name__} {brief(x)}")
    items = list(x)
    if len(items) != 2:
        raise HeadSetError(f"{what} must have 2 elements (layer, head), got {len(items)}: {brief(x)}")
    return nonneg_int(items[0], f"{what} layer"), nonneg_int(items[1], f"{what} head")
