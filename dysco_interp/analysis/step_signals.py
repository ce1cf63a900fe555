"""Fix and break rates of a steered method as functions of per-step signals (pure: step
records in, rates out).

A step-account record (`studies.step_account`) holds one instance's route steps, each with
what the QRHeads saw of the gold edge, DySCO's selection, and every method's pick, margin and
correctness (`analysis.step_mechanism.StepMechanism`). Here each step gets its class (fixed,
broken, both right, both wrong: `step_classes.class_of`) and its signals; the rates within a
signal's bins are P(fixed | the base was wrong) and P(broken | the base was right). Steps of
one instance are not independent, so an interval resamples instances (a cluster bootstrap of
the ratio of summed events to summed eligible steps).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from dysco_interp.analysis.step_classes import class_of


@dataclass(frozen=True)
class Signal:
    """One per-step signal, cut into bins by `edges` (a value v falls in the first bin whose upper
    edge is > v; the last bin is open)."""

    key: str
    label: str
    edges: tuple[float, ...]
    value: Callable[[Mapping], float | None]
    labels: tuple[str, ...] | None = None  # the bins' names, for integer signals (ranks)

    def bins(self) -> list[str]:
        if self.labels is not None:
            return list(self.labels)
        cuts = [f"{e:g}" for e in self.edges]
        return [f"< {cuts[0]}"] + [f"{a}–{b}" for a, b in zip(cuts, cuts[1:])] + [f"≥ {cuts[-1]}"]

    def bin_of(self, step: Mapping) -> int | None:
        v = self.value(step)
        if v is None:
            return None
        return next((i for i, e in enumerate(self.edges) if v < e), len(self.edges))


def _base_pick_rank(step: Mapping, base: str = "vanilla") -> float | None:
    # where the QRHeads put the edge the base wrongly named: only for its wrong, resolved picks
    if step["correct"][base]:
        return None
    rank = step.get("pick_ranks", {}).get(base)
    return None if rank is None else float(rank)


SIGNALS: tuple[Signal, ...] = (
    Signal("qr_rank", "QRHeads' rank of the gold edge", (2, 4, 11), lambda s: s["qr_rank"],
           ("1", "2–3", "4–10", "≥ 11")),
    Signal("qr_mass", "QRHead attention on the gold edge", (0.01, 0.05, 0.2), lambda s: s["qr_mass"]),
    Signal("qr_top_share", "top edge's share of the QRHeads' edge attention", (0.2, 0.4, 0.7),
           lambda s: s.get("qr_top_share")),
    Signal("qr_entropy", "entropy of the QRHeads' edge attention (normalised)", (0.5, 0.7, 0.85),
           lambda s: s.get("qr_entropy")),
    Signal("selected_mass", "relevance mass of DySCO's selected keys", (0.1, 0.2, 0.4),
           lambda s: s.get("selected_mass")),
    Signal("gold_selected_share", "gold edge's share of the selected keys", (0.01, 0.5),
           lambda s: s.get("gold_selected_share")),
    Signal("base_margin", "vanilla's margin (top-1 minus top-2 log p)", (0.5, 1, 2),
           lambda s: s.get("margin", {}).get("vanilla")),
    Signal("base_pick_rank", "QRHeads' rank of the edge vanilla wrongly named", (2, 4), _base_pick_rank,
           ("1", "2–3", "≥ 4")),
)


def classified(records: Iterable[Mapping], base: str = "vanilla", other: str = "dysco") -> list[dict]:
    """One row per route step: model, length, instance, step, class, and the step itself."""
    rows = []
    for r in records:
        for s in r["steps"]:
            if base in s["correct"] and other in s["correct"]:
                rows.append({"model": r["model"], "task": "path_traversal", "length": r["length"],
                             "instance": r["instance"], "step_index": s["step"],
                             "class": class_of(bool(s["correct"][base]), bool(s["correct"][other])), "step": s})
    return rows


def cluster_ratio(pairs: Sequence[tuple[float, float]], n_boot: int = 2000, seed: int = 0) -> dict | None:
    """sum(events) / sum(eligible) over clusters (instances) given as (events, eligible), with a
    percentile interval from resampling the clusters; None when nothing is eligible."""
    x = np.asarray(pairs, dtype=float).reshape(-1, 2)
    if x[:, 1].sum() == 0:
        return None
    mean = float(x[:, 0].sum() / x[:, 1].sum())
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(x), size=(n_boot, len(x)))
    ev, el = x[idx, 0].sum(axis=1), x[idx, 1].sum(axis=1)
    ratios = ev[el > 0] / el[el > 0]
    lo, hi = np.percentile(ratios, [2.5, 97.5]) if len(ratios) else (mean, mean)
    return {"mean": round(mean, 5), "lo": round(float(lo), 5), "hi": round(float(hi), 5),
            "events": int(x[:, 0].sum()), "eligible": int(x[:, 1].sum()), "clusters": int(len(x))}


def rates_by_bin(rows: Sequence[Mapping], signal: Signal, n_boot: int = 2000) -> list[dict]:
    """Per bin of `signal`: P(fixed | base wrong) and P(broken | base right), each with its interval."""
    out = []
    for b, label in enumerate(signal.bins()):
        per_instance: dict[tuple, list[int]] = defaultdict(lambda: [0, 0, 0, 0])  # fixed, wrong, broken, right
        for r in rows:
            if signal.bin_of(r["step"]) != b:
                continue
            c = per_instance[(r["model"], r["length"], r["instance"])]
            wrong = r["class"] in ("fixed", "both wrong")
            c[0] += r["class"] == "fixed"
            c[1] += wrong
            c[2] += r["class"] == "broken"
            c[3] += not wrong
        counts = list(per_instance.values())
        out.append({"bin": label, "steps": sum(c[1] + c[3] for c in counts),
                    "fix": cluster_ratio([(c[0], c[1]) for c in counts], n_boot) if counts else None,
                    "break": cluster_ratio([(c[2], c[3]) for c in counts], n_boot) if counts else None})
    return out


__all__ = ["SIGNALS", "Signal", "classified", "cluster_ratio", "rates_by_bin"]
