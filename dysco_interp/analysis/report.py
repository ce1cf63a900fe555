"""Markdown and JSON outputs of the analysis scripts (tables with intervals, a command line)."""

from __future__ import annotations

import json
import lzma
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dysco_interp.analysis.bootstrap import MIN_CI_N, NO_CI
from dysco_interp.analysis.margins import EQUIVALENCE_LEVEL
from dysco_interp.atomic import atomic_open, atomic_write_bytes


def fmt_ci(est: Mapping | None, digits: int = 3, sign: str = "") -> str:
    """'0.250 [0.100, 0.400]' from {mean, lo, hi[, n, null]}; '0.250 (n too small)' for fewer than
    `MIN_CI_N` instances; '-' when there is nothing. `sign` "+" prints the signs. A mean that
    left records out (`null`: not measured on them) says over how many values it is."""
    if not est:
        return "-"
    mean = f"{est['mean']:{sign}.{digits}f}"
    of = f" (n={est['n']}; {est['null']} null)" if est.get("null") else ""
    if est.get("n", MIN_CI_N) < MIN_CI_N:
        return f"{mean} ({NO_CI}){of}"
    return f"{mean} [{est['lo']:{sign}.{digits}f}, {est['hi']:{sign}.{digits}f}]{of}"


def fmt_p(p: float) -> str:
    """Two significant digits, trailing zeros kept: '0.12', '0.30', '1.0', '0.0034', '1.0e-05'."""
    return f"{p:#.2g}"


def fmt_delta(est: Mapping | None, digits: int = 3) -> str:
    """A paired difference: '+0.050 [+0.008, +0.100]', and where it was tested
    (`analysis.paired`) the instances better and worse, the sign-flip p and, once the table's
    family is known, the BH q: '+0.050 [+0.008, +0.100] 6↑1↓ p=0.12 q=0.30'."""
    text = fmt_ci(est, digits, sign="+")
    if not est or est.get("p") is None:
        return text
    text = f"{text} {est['better']}↑{est['worse']}↓ p={fmt_p(est['p'])}"
    text = text if est.get("q") is None else f"{text} q={fmt_p(est['q'])}"
    return f"{text} ≡±{est['margin']:g}" if equivalent(est) else text


def equivalent(est: Mapping | None) -> bool:
    """Whether a paired difference is shown equivalent to no change within its metric's margin:
    its TOST q over the table (its p where no table was formed) below `EQUIVALENCE_LEVEL`."""
    if not est or est.get("margin") is None:
        return False
    p = est.get("eq_q") if est.get("eq_q") is not None else est.get("eq_p")
    return p is not None and p < EQUIVALENCE_LEVEL


# what a table's differences carry, said once under each table that prints them
DELTA_LEGEND = ("b↑w↓: instances the method made better and worse; p: exact sign-flip test; q: Benjamini-Hochberg "
                f"over the table; ≡±m: equivalent to no change within ±m (paired t TOST, its BH q over the table "
                f"below {EQUIVALENCE_LEVEL:g}; margins in `analysis/margins.py`).")


def store_notes(unmatched: Sequence[str], dropped: int) -> list[str]:
    """What a reader should know about the stores a table was built from."""
    notes = [f"no store matches {p}" for p in unmatched]
    if dropped:
        notes.append(f"{dropped} repeated records (same method and instance) counted once")
    return notes


def write_report(out: str, result: Mapping, text: str) -> None:
    """OUT.md (the rendered text) and OUT.json (the result), and the text on stdout."""
    write_text(out + ".md", text)
    write_json(out + ".json", result)
    print(text)


def with_footer(parts: list[str], result: Mapping) -> str:
    """A report's markdown: its parts, then its notes and the command that made it.

    A part is a line or a block of lines; the newline that ends a block (as every table from
    `viz.tables.table_markdown` does) is the one the join puts after it.
    """
    if result.get("notes"):
        parts = parts + ["", "Notes:", ""] + [f"- {n}" for n in result["notes"]]
    return "\n".join(p.removesuffix("\n") for p in parts + ["", f"`{result['command']}`"])


def write_text(path: str | Path, text: str) -> Path:
    path = Path(path)
    with atomic_open(path) as f:  # a killed run leaves the previous table, never half of one
        f.write(text if text.endswith("\n") else text + "\n")
    return path


def write_json(path: str | Path, obj: Any) -> Path:
    """`obj` as `json_lines` JSON at `path`; compressed as `xz -9e` when `path` ends in ".xz" (a
    table too large to commit plain, as the stores are)."""
    text = json_lines(obj) + "\n"
    if str(path).endswith(".xz"):
        return atomic_write_bytes(path, lzma.compress(text.encode(), preset=9 | lzma.PRESET_EXTREME))
    return write_text(path, text)


def json_lines(obj: Any, depth: int = 2) -> str:
    """`obj` as JSON with its top `depth` levels one item a line and everything below compact: a
    table row is one line, so a diff shows which rows changed while the committed tables stay a
    third smaller than indented JSON."""
    if depth and isinstance(obj, dict) and obj:
        items = [f"{json.dumps(k)}:{json_lines(v, depth - 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n}"
    if depth and isinstance(obj, list) and obj:
        return "[\n" + ",\n".join(json_lines(v, depth - 1) for v in obj) + "\n]"
    return json.dumps(obj, separators=(",", ":"), allow_nan=False)


def command_line(script: str, argv: Sequence[str]) -> str:
    """The command as a reader would type it from the repository root."""
    import shlex

    # quote globs too, so the recorded command matches the same files when pasted
    return " ".join(["python", script, *(shlex.quote(a) if any(c in a for c in " '\"*?[") else a for a in argv)])
