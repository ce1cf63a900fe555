"""Equivalence of a method and a baseline within a stated margin: the paired t TOST.

A p-value above 0.05 is no evidence that a method does not hurt. Two one-sided tests on the
paired differences d_i = method_i - baseline_i (Schuirmann 1987) are:
- lower: H0 mean <= -margin against mean > -margin; rejecting it backs "does not hurt by
  `margin` or more" (non-inferiority) on its own;
- upper: H0 mean >= +margin against mean < +margin;
and p = max of the two backs "changes the metric by less than `margin`": at level alpha this is
the (1 - 2 alpha) t interval of the mean lying inside (-margin, +margin).

Why t and not permutations: a sign-flip test of "mean = -margin" needs the shifted differences
d_i + margin to be symmetric about 0, which differences of a bounded or discrete metric (step
accuracy changes by -1, 0 or +1 per instance) cannot be; the t test only needs the mean to be
roughly normal, which the tables' 20 to 200 instances give, and it is the test a reader expects.

The margin is the caller's, with no default: what counts as no harm is a property of the metric
(a log-probability and an accuracy live on different scales) and belongs in the sentence it backs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dysco_interp.analysis.bootstrap import finite_values
from dysco_interp.analysis.multiplicity import significant
from dysco_interp.errors import ConfigError


@dataclass(frozen=True)
class Equivalence:
    """A TOST over n paired differences: their mean and standard error (None under two
    instances), the margin, the two one-sided p-values and p = the larger."""

    mean: float
    se: float | None
    n: int
    margin: float
    p_lower: float
    p_upper: float
    p: float

    def not_worse(self, alpha: float = 0.05) -> bool:
        """The mean is above -margin at level alpha (non-inferiority): 'does not hurt'."""
        return self.p_lower < alpha

    def equivalent(self, alpha: float = 0.05) -> bool:
        """The mean is within (-margin, +margin) at level alpha: 'changes nothing'."""
        return self.p < alpha

    def as_dict(self, digits: int = 5) -> dict:
        return {"mean": round(self.mean, digits), "se": None if self.se is None else round(self.se, digits),
                "n": self.n, "margin": self.margin, "p_lower": significant(self.p_lower, digits),
                "p_upper": significant(self.p_upper, digits), "p": significant(self.p, digits)}


def tost(differences: Sequence[float], *, margin: float) -> Equivalence:
    """The paired t TOST of `differences` (method - baseline per instance) within +-`margin`."""
    d = finite_values(differences, "differences")
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not (math.isfinite(margin) and margin > 0):
        raise ConfigError(f"the equivalence margin must be a finite number > 0, got {margin!r}")
    n, mean = int(d.size), float(d.mean())
    if n < 2:  # one difference has no spread to test against: no evidence either way
        return Equivalence(mean, None, n, float(margin), 1.0, 1.0, 1.0)
    if np.all(d == d[0]):
        # no spread: t is infinite, and the test rejects exactly when the common value is inside
        p_lower, p_upper = float(not d[0] > -margin), float(not d[0] < margin)
        return Equivalence(mean, 0.0, n, float(margin), p_lower, p_upper, max(p_lower, p_upper))
    # scipy only here: numpy has no t distribution, and importing scipy costs callers that never
    # test equivalence a third of a second
    from scipy.special import stdtr

    se = float(d.std(ddof=1)) / math.sqrt(n)
    p_lower = float(stdtr(n - 1, -(mean + margin) / se))  # P(T >= (mean + margin) / se)
    p_upper = float(stdtr(n - 1, (mean - margin) / se))  # P(T <= (mean - margin) / se)
    return Equivalence(mean, se, n, float(margin), p_lower, p_upper, max(p_lower, p_upper))
