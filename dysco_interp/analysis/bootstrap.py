"""Percentile-bootstrap confidence intervals for a mean over instances (numpy only).

Instances are resampled with replacement `n_boot` times; the interval is the (1-level)/2
and 1-(1-level)/2 percentiles (numpy's linear interpolation) of the resampled means.
Seeded, so a figure or table regenerated from the same records shows the same intervals.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dysco_interp.errors import ConfigError

# Fewer instances have no interval worth printing: every resample of one value is that value.
MIN_CI_N = 2
NO_CI = "n too small"  # what a table prints in place of such an interval


@dataclass(frozen=True)
class BootstrapCI:
    """A mean with its bootstrap interval over n instances."""

    mean: float
    lo: float
    hi: float
    n: int

    def as_dict(self, digits: int = 5) -> dict:
        return {"mean": round(self.mean, digits), "lo": round(self.lo, digits), "hi": round(self.hi, digits),
                "n": self.n}


def finite_values(values: Sequence[float], what: str) -> np.ndarray:
    """`values` as a 1-D float array; ConfigError naming `what` unless a non-empty flat list of finite numbers."""
    try:
        x = np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        raise ConfigError(f"{what} must be a flat list of numbers") from None
    if x.ndim != 1 or x.size == 0:
        raise ConfigError(f"{what} must be a non-empty flat list of numbers, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ConfigError(f"{what} must be finite numbers")
    return x


def bootstrap_ci(values: Sequence[float], level: float = 0.95, n_boot: int = 2000, seed: int = 0) -> BootstrapCI:
    """Mean of `values` and its percentile-bootstrap interval at `level`."""
    x = finite_values(values, "bootstrap values")
    if not (isinstance(level, (int, float)) and 0 < level < 1):
        raise ConfigError(f"level must be in (0, 1), got {level!r}")
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 1:
        raise ConfigError(f"n_boot must be an integer >= 1, got {n_boot!r}")
    mean = float(x.mean())
    if np.all(x == x[0]):  # every resample has the same mean
        return BootstrapCI(mean, mean, mean, int(x.size))
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(n_boot, x.size))].mean(axis=1)
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(means, [tail, 100 - tail])
    return BootstrapCI(mean, float(lo), float(hi), int(x.size))


def percentiles(values: Sequence[float], qs: Sequence[float]) -> list[float]:
    """numpy's linear percentiles of `values` (NaN left out) where infinite values count: a
    percentile that falls on or next to an infinity is that infinity (numpy's interpolation gives
    NaN there)."""
    x = np.sort(np.asarray(values, dtype=float))
    x = x[~np.isnan(x)]
    if not len(x):
        return [float("nan")] * len(qs)
    out = []
    for q in qs:
        h = (len(x) - 1) * q / 100
        a, b = x[int(np.floor(h))], x[int(np.ceil(h))]
        if np.isinf(a) or np.isinf(b):
            out.append(float(a if np.isinf(a) and a < 0 else b))  # the infinity beside it (sorted: -inf first)
        else:
            out.append(float(a + (b - a) * (h - np.floor(h))))
    return out
