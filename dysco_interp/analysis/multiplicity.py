"""Benjamini-Hochberg q-values over a family of p-values (numpy only).

The family is the comparisons one table reports: a reader scanning a table for cells whose
interval excludes 0 runs every test in it at once, so a cell's evidence is its q, not its p.
BH bounds the expected share of false discoveries when the tests are independent or positively
dependent; comparisons of several methods against one baseline on the same instances are
positively dependent in practice (Benjamini-Yekutieli would be the choice under any dependence,
at a cost of about ln m in power).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from dysco_interp.analysis.bootstrap import finite_values
from dysco_interp.errors import ConfigError

# a difference a sentence or a count may call an effect: it survives Benjamini-Hochberg at this false
# discovery rate
FDR = 0.05


def bh_q_values(p_values: Sequence[float]) -> list[float]:
    """Each p-value's BH q-value, in the order given: min over j >= rank of p_(j) * m / j, at most 1.

    An empty family has no q-values. q is the smallest false discovery rate at which the
    comparison would be declared a discovery.
    """
    if len(p_values) == 0:
        return []
    p = finite_values(p_values, "p-values")
    if ((p < 0) | (p > 1)).any():
        raise ConfigError(f"p-values must lie in [0, 1], got {p[(p < 0) | (p > 1)].tolist()}")
    order = np.argsort(p, kind="stable")
    m = p.size
    scaled = p[order] * m / np.arange(1, m + 1)
    # a smaller p never gets a larger q than a larger p: the running minimum from the top rank down
    monotone = np.minimum.accumulate(scaled[::-1])[::-1]
    q = np.empty(m)
    q[order] = np.minimum(monotone, 1.0)
    return q.tolist()


def significant(x: float, digits: int) -> float:
    """`x` to `digits` significant digits: p- and q-values keep them where rounding to decimals
    would print 2e-6 as 0."""
    return float(f"{x:.{digits}g}")


def fill_q(estimates: Iterable[dict], digits: int = 5) -> None:
    """Set `q` on every tested estimate (a dict with a `p`, as `PairedComparison.as_dict` gives) of
    one family, in place, to `digits` significant digits; likewise `eq_q` from the equivalence
    tests' `eq_p` where a margin was set (a separate family: equivalence claims are discoveries too)."""
    estimates = [e for e in estimates if e]  # once: a generator is read a single time
    for p_key, q_key in (("p", "q"), ("eq_p", "eq_q")):
        tested = [e for e in estimates if e.get(p_key) is not None]
        for e, q in zip(tested, bh_q_values([e[p_key] for e in tested])):
            e[q_key] = significant(q, digits)
