"""A method against a baseline on the same instances: the mean difference with its bootstrap
interval, how many instances got better and worse, and an exact sign-flip p-value (numpy only).

d_i = method_i - baseline_i per instance (the caller pairs them; `paired_differences` checks the
lengths). Every metric the tables compare is higher-is-better, so d_i > 0 counts as better.

The sign-flip (paired permutation) test: under "the method changes nothing", each d_i is as
likely to have come out -d_i, so the observed sum is one of the 2^m sums of +-d_i over the m
nonzero differences (a zero flips to itself and changes no sum). Two-sided p is the share of
those sums at least as far from 0 as the observed one. Unlike the percentile bootstrap, it stays
honest when few instances changed: 4 of 20 better and none worse gives p = 2/16 = 0.125, where
the bootstrap interval excludes 0.

- m <= `EXACT_MAX` (20): every sign pattern is enumerated (2^19 sums with the first sign fixed,
  the other half being their negatives), so p is exact.
- beyond: `N_DRAWS` seeded random patterns; p = (b + 1) / (N + 1) with b the draws at least as
  extreme, counting the observed pattern itself once, so p is never 0 and never below what N
  draws can show (1e-5 for 100000, under BH's 0.05 / m for tables of up to a few thousand cells).

Sums that are equal in exact arithmetic can differ in the last bits once summed in another
order; a sum counts as at least as extreme within `REL_TOL` of sum |d_i|, so the observed
pattern always counts itself and ties with it count too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar, overload

import numpy as np

from dysco_interp.analysis.bootstrap import bootstrap_ci, finite_values
from dysco_interp.analysis.equivalence import tost
from dysco_interp.analysis.multiplicity import bh_q_values, significant
from dysco_interp.errors import ConfigError

EXACT_MAX = 20  # nonzero differences enumerated exactly: 2^19 sums, 4 MB and some milliseconds
# the most a caller may ask to enumerate: 2^23 sums and their temporaries stay under a GB
EXACT_LIMIT = 24
N_DRAWS = 100_000
# far above the rounding of a sum of m terms (about m * 1e-16 of sum |d|), far below any gap
# between two sums that could move a p-value
REL_TOL = 1e-9
CHUNK_ELEMENTS = 1 << 21  # random signs drawn per block: 16 MB as float64


@dataclass(frozen=True)
class SignFlip:
    """A two-sided sign-flip p-value over `nonzero` changed instances; `draws` None when exact."""

    p: float
    nonzero: int
    draws: int | None


@dataclass(frozen=True)
class PairedComparison:
    """A paired difference over n instances: mean and bootstrap interval (lo, hi), instances better
    (d > 0), worse (d < 0) and the same, the sign-flip p (`draws` None when enumerated exactly),
    and the BH q over the table's family once `with_q` has filled it."""

    mean: float
    lo: float
    hi: float
    n: int
    better: int
    worse: int
    same: int
    p: float
    draws: int | None
    q: float | None = None
    margin: float | None = None  # with a margin: the TOST p of equivalence within it, and its q
    eq_p: float | None = None
    eq_q: float | None = None

    def as_dict(self, digits: int = 5) -> dict:
        # p and q keep significant digits: rounding 2e-6 to 5 decimals would print p = 0
        out = {"mean": round(self.mean, digits), "lo": round(self.lo, digits), "hi": round(self.hi, digits),
               "n": self.n, "better": self.better, "worse": self.worse, "same": self.same,
               "p": significant(self.p, digits), "draws": self.draws,
               "q": None if self.q is None else significant(self.q, digits)}
        if self.margin is not None:  # only then, so comparisons without a margin keep their old records
            out |= {"margin": self.margin, "eq_p": None if self.eq_p is None else significant(self.eq_p, digits),
                    "eq_q": None if self.eq_q is None else significant(self.eq_q, digits)}
        return out


def paired_differences(baseline: Sequence[float], method: Sequence[float]) -> np.ndarray:
    """method - baseline per instance, both lists in the same instance order."""
    x = finite_values(baseline, "baseline values")
    y = finite_values(method, "method values")
    if x.size != y.size:
        raise ConfigError(f"paired values need one baseline value per instance: {x.size} baseline, {y.size} method")
    return y - x


def sign_flip_test(differences: Sequence[float], *, exact_max: int = EXACT_MAX, n_draws: int = N_DRAWS,
                   seed: int = 0) -> SignFlip:
    """Two-sided sign-flip p of the mean difference: exact for at most `exact_max` nonzero
    differences, else from `n_draws` random sign patterns drawn with `seed`."""
    d = finite_values(differences, "differences")
    if isinstance(exact_max, bool) or not isinstance(exact_max, int) or not 0 <= exact_max <= EXACT_LIMIT:
        raise ConfigError(f"exact_max must be an integer in [0, {EXACT_LIMIT}], got {exact_max!r}")
    if isinstance(n_draws, bool) or not isinstance(n_draws, int) or n_draws < 1:
        raise ConfigError(f"n_draws must be an integer >= 1, got {n_draws!r}")
    d = d[d != 0]
    m = int(d.size)
    if m == 0:  # nothing changed: every sign pattern gives the observed sum 0
        return SignFlip(1.0, 0, None)
    threshold = abs(float(d.sum())) - REL_TOL * float(np.abs(d).sum())
    if m <= exact_max:
        sums = d[:1]
        for v in d[1:]:
            sums = np.concatenate([sums + v, sums - v])
        return SignFlip(float(np.count_nonzero(np.abs(sums) >= threshold)) / sums.size, m, None)
    rng = np.random.default_rng(seed)
    total = float(d.sum())
    rows = max(1, CHUNK_ELEMENTS // m)
    extreme = 0
    for start in range(0, n_draws, rows):
        k = min(rows, n_draws - start)
        bits = rng.integers(0, 256, size=(k, (m + 7) // 8), dtype=np.uint8)
        flipped = np.unpackbits(bits, axis=1, count=m).astype(float)
        extreme += int(np.count_nonzero(np.abs(total - 2 * (flipped @ d)) >= threshold))
    return SignFlip((extreme + 1) / (n_draws + 1), m, n_draws)


def paired_comparison(differences: Sequence[float], *, level: float = 0.95, n_boot: int = 2000, seed: int = 0,
                      exact_max: int = EXACT_MAX, n_draws: int = N_DRAWS,
                      margin: float | None = None) -> PairedComparison:
    """The mean of `differences` (method - baseline per instance) with its percentile-bootstrap
    interval (`bootstrap_ci`'s conventions), the instances better, worse and the same, and the
    sign-flip p (`sign_flip_test`); q stays None until `with_q` sees the whole table. With a
    `margin` (`analysis.margins`), also the TOST p of equivalence within it (`equivalence.tost`)."""
    ci = bootstrap_ci(differences, level=level, n_boot=n_boot, seed=seed)
    test = sign_flip_test(differences, exact_max=exact_max, n_draws=n_draws, seed=seed)
    d = np.asarray(differences, dtype=float)
    better, worse = int((d > 0).sum()), int((d < 0).sum())
    eq_p = None if margin is None else tost(d, margin=margin).p
    return PairedComparison(ci.mean, ci.lo, ci.hi, ci.n, better, worse, ci.n - better - worse, test.p, test.draws,
                            margin=margin, eq_p=eq_p)


K = TypeVar("K")


@overload
def with_q(comparisons: Mapping[K, PairedComparison]) -> dict[K, PairedComparison]: ...
@overload
def with_q(comparisons: Sequence[PairedComparison]) -> list[PairedComparison]: ...
def with_q(comparisons):
    """The comparisons of one table with q filled: BH over all their p-values (`bh_q_values`), and
    eq_q likewise over the equivalence p-values of those with a margin. A mapping comes back as a
    dict with the same keys, a sequence as a list in the same order."""
    items = list(comparisons.values()) if isinstance(comparisons, Mapping) else list(comparisons)
    filled = [replace(c, q=q) for c, q in zip(items, bh_q_values([c.p for c in items]))]
    with_margin = [i for i, c in enumerate(filled) if c.eq_p is not None]
    for i, q in zip(with_margin, bh_q_values([filled[i].eq_p for i in with_margin])):
        filled[i] = replace(filled[i], eq_q=q)
    return dict(zip(comparisons, filled)) if isinstance(comparisons, Mapping) else filled
