"""Fix and break rates controlled for how hard a step was (pure: classified steps in, models and
contrasts out).

A rate by one signal (`step_signals`) mixes that signal with the step's difficulty: the steps
where the QRHeads miss the gold edge are mostly steps where the base model gives the gold city
almost no probability, which a bias on a few keys cannot lift to the top. Two controls, over the
rows of `step_signals.classified`:
- a logistic model of the event (fixed, among the steps the base got wrong; broken, among those
  it got right) on several predictors at once, with odds ratios whose intervals resample
  instances (`logistic.odds_ratios`);
- a stratified contrast, free of any model: the event's rate with and without an exposure (say,
  the gold edge ranked first) within bins of a difficulty signal, with each bin's counts, and the
  Mantel-Haenszel rate ratio pooled over the bins.

Steps are clustered by task instance: the two models of a study read the same instances, whose
text sets how hard each step is for both, so one instance's steps are resampled together.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from dysco_interp.analysis.bootstrap import percentiles
from dysco_interp.analysis.logistic import design, odds_ratios
from dysco_interp.analysis.step_signals import Signal, cluster_ratio
from dysco_interp.errors import ConfigError

EVENTS = {"fix": ("fixed", False), "break": ("broken", True)}  # event class, whether the base was right


@dataclass(frozen=True)
class Predictor:
    """One column of a model: a value per classified row (None leaves the row out)."""

    key: str
    label: str
    value: Callable[[Mapping], float | None]


def eligible(rows: Sequence[Mapping], event: str, base: str = "vanilla") -> tuple[list[Mapping], list[int]]:
    """The rows that can show `event` ("fix": the base was wrong; "break": it was right) and, per
    row, whether they do."""
    if event not in EVENTS:
        raise ConfigError(f"event must be one of {sorted(EVENTS)}, got {event!r}")
    cls, base_right = EVENTS[event]
    mine = [r for r in rows if bool(r["step"]["correct"][base]) == base_right]
    return mine, [int(r["class"] == cls) for r in mine]


def step_model(rows: Sequence[Mapping], event: str, predictors: Sequence[Predictor], n_boot: int = 2000,
               seed: int = 0) -> dict | None:
    """The logistic model of `event` on `predictors` over the eligible rows that have every
    predictor, with odds ratios and instance-resampled intervals (`logistic.odds_ratios`); None
    when the event never or always happens there (nothing to model)."""
    mine, y = eligible(rows, event)
    values = [[p.value(r) for p in predictors] for r in mine]
    keep = [i for i, v in enumerate(values) if all(x is not None for x in v)]
    if len({y[i] for i in keep}) < 2:
        return None
    X = design([[float(values[i][j]) for i in keep] for j in range(len(predictors))])  # type: ignore[arg-type]
    out = odds_ratios(X, [y[i] for i in keep], [mine[i]["instance"] for i in keep], [p.key for p in predictors],
                      n_boot=n_boot, seed=seed)
    return {"event": event, "labels": {p.key: p.label for p in predictors}, "left_out": len(mine) - len(keep), **out}


def _log_ratio(exposed_rate: np.ndarray, other_rate: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(exposed_rate) - np.log(other_rate)  # infinite: no event on one side; NaN: on neither


def mantel_haenszel(counts: np.ndarray) -> np.ndarray:
    """The Mantel-Haenszel rate ratio (exposed over not) pooled over strata, as a log, from counts
    [..., stratum, (exposed events, exposed steps, other events, other steps)]."""
    a, n1, c, n0 = (counts[..., k] for k in range(4))
    total = np.maximum(n1 + n0, 1)
    return _log_ratio((a * n0 / total).sum(axis=-1), (c * n1 / total).sum(axis=-1))


def _ratio(log: float) -> float | None:
    # None: infinite or undefined (JSON has no infinity)
    return None if not log < np.inf else round(float(np.exp(log)), 5)


def stratified_contrast(rows: Sequence[Mapping], event: str, exposed: Callable[[Mapping], bool], stratum: Signal,
                        n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> dict:
    """Within each bin of `stratum` (read from the step): the rate of `event` among eligible rows
    with and without `exposed`, with counts and instance-resampled intervals; and the
    Mantel-Haenszel rate ratio over the bins with its interval. A ratio with no event to divide
    by is None (infinite)."""
    mine, y = eligible(rows, event)
    bins = stratum.bins()
    per_instance: dict[str, np.ndarray] = defaultdict(lambda: np.zeros((len(bins), 4)))
    for r, hit in zip(mine, y):
        b = stratum.bin_of(r["step"])
        if b is None:
            continue
        col = 0 if exposed(r) else 2
        per_instance[r["instance"]][b, col:col + 2] += (hit, 1)
    counts = np.stack(list(per_instance.values())) if per_instance else np.zeros((0, len(bins), 4))
    out_bins = []
    for b, label in enumerate(bins):
        sub = counts[:, b, :]
        exp_rate = cluster_ratio([(x[0], x[1]) for x in sub if x[1]], n_boot, seed)
        other_rate = cluster_ratio([(x[2], x[3]) for x in sub if x[3]], n_boot, seed)
        ratio = None
        if exp_rate and other_rate and other_rate["events"]:
            a, n1, c, n0 = exp_rate["events"], exp_rate["eligible"], other_rate["events"], other_rate["eligible"]
            ratio = round(a * n0 / (n1 * c), 5)
        out_bins.append({"bin": label, "exposed": exp_rate, "other": other_rate, "ratio": ratio})
    pooled = float(mantel_haenszel(counts.sum(axis=0)))
    rng = np.random.default_rng(seed)
    draws = mantel_haenszel(counts[rng.integers(0, len(counts), size=(n_boot, len(counts)))].sum(axis=1))
    tail = (1 - level) / 2 * 100
    defined = draws[~np.isnan(draws)]
    lo, hi = percentiles(defined, [tail, 100 - tail])
    return {"event": event, "stratum": stratum.key, "stratum_label": stratum.label, "bins": out_bins,
            "mantel_haenszel": {"ratio": _ratio(pooled), "lo": _ratio(lo), "hi": _ratio(hi),
                                "resamples_infinite": int(np.isinf(defined).sum()),
                                "resamples_undefined": int(len(draws) - len(defined)), "n_boot": n_boot,
                                "seed": seed}}


__all__ = ["EVENTS", "Predictor", "eligible", "mantel_haenszel", "step_model", "stratified_contrast"]
