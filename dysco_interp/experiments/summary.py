"""`evaluate`'s summary: per length and method, each metric's mean and, against vanilla on the
same instances, the paired difference with its interval, the instances it moved and the exact
sign-flip p; and the notes that keep a first table from misleading."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dysco_interp.analysis.bootstrap import NO_CI
from dysco_interp.analysis.report import fmt_p
from dysco_interp.analysis.result_tables import paired_deltas

TABLE_WIDTH = 100  # columns `format_table` fits in

# A bootstrap of a handful of pairs draws from a handful of values: its percentile interval is
# far too narrow and looks significant (two instances gave [+0.25, +0.50] on the default model).
# The summary prints no interval below this many pairs, and says why.
SUMMARY_MIN_N = 10


def summary_notes(summary: Mapping[tuple, Mapping[str, Any]], metrics: Iterable[str], extraction: str | None,
                  teacher_forced: bool, baseline: str = "vanilla") -> list[str]:
    """What the summary's numbers cannot show, one line each: rows under `SUMMARY_MIN_N` instances
    (no interval), and free-decoding rows where no answer block was found (`extraction` 0), whose
    other scores are 0 for want of an answer to read."""
    notes = []
    small = sorted({row["n"] for (_, method), row in summary.items()
                    if method != baseline and row["n"] < SUMMARY_MIN_N})
    if small:
        notes.append(f"n = {', '.join(map(str, small))}: too few instances for an interval ({NO_CI}; at least "
                     f"{SUMMARY_MIN_N} are needed); these rows are an example, not evidence")
    if not teacher_forced and extraction in set(metrics):
        empty = [f"{method} at {length}" if length is not None else method
                 for (length, method), row in summary.items() if row.get(extraction) == 0]
        if empty:
            notes.append(f"{extraction} 0 for {', '.join(empty)}: no answer block was found in any output, so the "
                         "other scores are 0 because nothing could be read, not because the answers were wrong; "
                         "--teacher-forced scores the model's predictions along the gold answer instead")
    return notes


def summarise(records: Iterable[dict], metrics: Iterable[str], baseline: str = "vanilla") -> dict[tuple, dict]:
    """Per (length, method), the baseline first: the instance count, each metric's mean and, when `baseline` ran on the
    same instances, the paired difference to it with its 95% bootstrap interval, the instances it
    made better and worse, and the exact sign-flip p (`delta_<metric>`: (mean, lo, hi, better,
    worse, p); lo and hi None under `SUMMARY_MIN_N` pairs)."""
    metrics = list(metrics)
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        groups[(r["length"], r["method"])].append(r)
    out = {}
    # the baseline first at each length: the rows below it are compared with it
    for key, rows in sorted(groups.items(), key=lambda kv: (kv[0][0] or 0, kv[0][1] != baseline, kv[0][1])):
        row: dict[str, Any] = {"n": len(rows)}
        for m in metrics:
            values = [float(r[m]) for r in rows if r.get(m) is not None]
            row[m] = sum(values) / len(values) if values else None
        reference = groups.get((key[0], baseline), [])
        if key[1] != baseline and reference:
            for m, delta in paired_deltas(rows, reference, metrics).items():
                if delta is not None:  # one pair has no interval (a bootstrap of it is one point)
                    interval = (delta["lo"], delta["hi"]) if delta["n"] >= SUMMARY_MIN_N else (None, None)
                    row[f"delta_{m}"] = (delta["mean"], *interval, delta["better"], delta["worse"], delta["p"])
        out[key] = row
    return out


TESTED = "better/worse"  # the row under a difference's CI: instances it moved, and the sign-flip p


def format_table(summary: Mapping[tuple, Mapping[str, Any]], metrics: Iterable[str], baseline: str = "vanilla",
                 width: int = TABLE_WIDTH) -> str:
    """The summary as text at most `width` columns wide: each metric's mean per (length, method)
    and, under a method other than `baseline`, its paired difference to it, that difference's
    95% CI ("n too small" under `SUMMARY_MIN_N` paired instances), and the instances it made better
    and worse with the exact sign-flip p. Metrics that do not fit side by side go on in another
    block below, under the same row labels."""
    metrics = list(metrics)
    rows = list(summary.items())
    label = max([len(f"- {baseline}"), len(TESTED), *(len(method) for (_, method), _ in rows)])
    lead = 7 + 1 + label + 1 + 4  # length, method, n
    cell = len(f"[{-1:+.3f}, {-1:+.3f}]")

    def tested(d: Sequence | None) -> str:
        return "" if d is None else f"{d[3]}↑{d[4]}↓ p={fmt_p(d[5])}"

    columns = [max(cell, len(m), *(len(tested(row.get(f"delta_{m}"))) for _, row in rows)) for m in metrics]
    blocks: list[list[int]] = [[]]
    used = lead
    for i, w in enumerate(columns):
        if blocks[-1] and used + 2 + w > width:
            blocks.append([])
            used = lead
        blocks[-1].append(i)
        used += 2 + w

    def line(length: Any, method: str, n: Any, block: Sequence[int], cells: Sequence[str]) -> str:
        return (f"{length:>7} {method:{label}} {n:>4}"
                + "".join(f"  {c:>{columns[i]}}" for i, c in zip(block, cells))).rstrip()

    lines: list[str] = []
    for block in blocks:
        header = line("length", "method", "n", block, [metrics[i] for i in block])
        lines += ([""] if lines else []) + [header, "-" * len(header)]
        for (length, method), row in rows:
            lines.append(line("-" if length is None else length, method, row["n"], block,
                              ["-" if row[metrics[i]] is None else f"{row[metrics[i]]:.3f}" for i in block]))
            deltas = [row.get(f"delta_{metrics[i]}") for i in block]
            if any(deltas):
                gains = ["" if d is None else f"{d[0]:+.3f}" for d in deltas]
                intervals = ["" if d is None else NO_CI if d[1] is None else f"[{d[1]:+.3f}, {d[2]:+.3f}]"
                             for d in deltas]
                lines += [line("", f"- {baseline}", "", block, gains), line("", "95% CI", "", block, intervals),
                          line("", TESTED, "", block, [tested(d) for d in deltas])]
    return "\n".join(lines)
