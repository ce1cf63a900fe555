"""Logistic regression by Newton's method (numpy only), with odds ratios whose intervals come from
resampling clusters.

The fit maximises the log-likelihood minus `ridge`/2 times the squared slopes (the intercept is
not penalised) by Newton steps (iteratively reweighted least squares), halving a step that does
not raise the objective. The ridge is there for stability only: it keeps the Hessian invertible
and every coefficient finite. At the default (1e-4, a Gaussian prior of sd 100 on each slope) it
moves the slopes of data without separation by about 1e-4 (the step account's models against
the unpenalised optimum), below the digits a table prints.

Separation: when some combination of the predictors splits the events from the non-events, the
maximum-likelihood slopes are infinite and only the ridge holds them. The fit is then redone
with a ridge 100 times smaller; without separation the linear predictor barely moves, while the
separated points' linear predictor grows by about log 100 = 4.6, so a move above
SEPARATION_SHIFT flags the data as separated, and each coefficient that moves the linear
predictor by more than half that over its column's range as running off to infinity.

Intervals: rows of one cluster (the steps of one instance) are not independent, so the clusters
are resampled with replacement and the model refitted. In a resample whose data are separated,
a slope that runs off counts as the infinity it runs to (an odds ratio of 0 or infinity): dropping
it would narrow the interval, and an interval that reaches it has an infinite end. Resamples
whose Newton steps did not converge are left out; both counts are reported.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from dysco_interp.analysis.bootstrap import percentiles
from dysco_interp.errors import ConfigError

RIDGE = 1e-4
SEPARATION_SHIFT = 1.0  # on the linear predictor (log-odds) scale
MAX_ITER = 100
TOL = 1e-9  # on the largest Newton step of a coefficient


@dataclass(frozen=True)
class LogisticFit:
    """Coefficients (intercept first), the penalised log-likelihood at them, and how the fit went:
    `runs_off` is +1 or -1 for a coefficient that separation sends to that infinity, else 0."""

    coef: np.ndarray
    loglik: float
    iterations: int
    converged: bool
    separated: bool
    runs_off: np.ndarray


def penalized_loglik(beta: np.ndarray, X: np.ndarray, y: np.ndarray, ridge: float = RIDGE) -> float:
    """sum_i [y_i eta_i - log(1 + e^eta_i)] - ridge/2 * |beta[1:]|^2, where eta = X beta and X's
    first column is the intercept."""
    eta = X @ beta
    return float(y @ eta - np.logaddexp(0.0, eta).sum() - ridge / 2 * beta[1:] @ beta[1:])


def design(columns: Sequence[Sequence[float]]) -> np.ndarray:
    """A design matrix: a column of ones, then `columns` (each one value per row)."""
    cols = [np.asarray(c, dtype=float) for c in columns]
    n = len(cols[0]) if cols else 0
    if any(len(c) != n for c in cols):
        raise ConfigError("every predictor needs one value per row")
    X = np.column_stack([np.ones(n), *cols])
    if not np.all(np.isfinite(X)):
        raise ConfigError("predictors must be finite numbers")
    return X


def newton(X: np.ndarray, y: np.ndarray, ridge: float, start: np.ndarray | None = None) -> tuple[np.ndarray, int, bool]:
    """The penalised maximum, the Newton steps taken and whether they converged."""
    penalty = np.full(X.shape[1], ridge)
    penalty[0] = 0.0
    beta = np.zeros(X.shape[1]) if start is None else start.copy()
    value = penalized_loglik(beta, X, y, ridge)
    for it in range(1, MAX_ITER + 1):
        p = 0.5 * (1.0 + np.tanh(X @ beta / 2))  # the logistic function, without overflow
        grad = X.T @ (y - p) - penalty * beta
        # a tiny floor keeps the intercept's direction invertible when every p reaches 0 or 1
        hess = (X * (p * (1 - p))[:, None]).T @ X + np.diag(penalty) + 1e-12 * np.eye(X.shape[1])
        step = np.linalg.solve(hess, grad)
        t = 1.0
        while (new := penalized_loglik(beta + t * step, X, y, ridge)) < value - 1e-12 * abs(value):
            t /= 2
            if t < 1e-8:  # no step raises the objective: at its maximum up to rounding, or stuck
                return beta, it, bool(np.max(np.abs(grad)) < 1e-6)
        beta, value = beta + t * step, new
        if np.max(np.abs(t * step)) < TOL:
            return beta, it, True
    return beta, MAX_ITER, False


def fit_logistic(X: np.ndarray, y: Sequence[float], ridge: float = RIDGE) -> LogisticFit:
    """Logistic regression of the 0/1 outcome `y` on `X` (from `design`), penalised by `ridge`."""
    X = np.asarray(X, dtype=float)
    yy = np.asarray(y, dtype=float)
    if X.ndim != 2 or len(yy) != len(X) or not np.isin(yy, (0.0, 1.0)).all():
        raise ConfigError("fit_logistic needs a 2-D design and one 0/1 outcome per row")
    if not ridge > 0:
        raise ConfigError(f"the ridge must be positive (it keeps every coefficient finite), got {ridge!r}")
    beta, iterations, converged = newton(X, yy, ridge)
    smaller, _, _ = newton(X, yy, ridge / 100, start=beta)
    moved = smaller - beta
    separated = bool(np.max(np.abs(X @ moved)) > SEPARATION_SHIFT)
    span = np.where(np.ptp(X, axis=0) > 0, np.ptp(X, axis=0), 1.0)  # the intercept's column is constant
    runs_off = np.sign(moved) * (separated & (np.abs(moved) * span > SEPARATION_SHIFT / 2))
    return LogisticFit(beta, penalized_loglik(beta, X, yy, ridge), iterations, converged, separated, runs_off)


def cluster_rows(clusters: Sequence[Hashable]) -> list[np.ndarray]:
    """The row indices of each cluster, clusters in order of first appearance."""
    rows: dict[Hashable, list[int]] = {}
    for i, c in enumerate(clusters):
        rows.setdefault(c, []).append(i)
    return [np.asarray(r) for r in rows.values()]


def odds_ratios(X: np.ndarray, y: Sequence[float], clusters: Sequence[Hashable], names: Sequence[str],
                n_boot: int = 2000, seed: int = 0, level: float = 0.95, ridge: float = RIDGE) -> dict:
    """The fit's odds ratio per predictor (one per column of X after the intercept, named by
    `names`) with percentile intervals from resampling `clusters` (one label per row); n_boot 0
    gives the fit alone (each interval is its estimate)."""
    if len(names) != X.shape[1] - 1 or len(clusters) != len(X):
        raise ConfigError("odds_ratios needs one name per predictor and one cluster label per row")
    yy = np.asarray(y, dtype=float)
    fit = fit_logistic(X, yy, ridge)
    groups = cluster_rows(clusters)
    rng = np.random.default_rng(seed)
    draws, separated, failed = [], 0, 0
    for _ in range(n_boot):
        idx = np.concatenate([groups[g] for g in rng.integers(0, len(groups), size=len(groups))])
        f = fit_logistic(X[idx], yy[idx], ridge)
        if not f.converged:
            failed += 1
            continue
        separated += f.separated
        draws.append(np.where(f.runs_off > 0, np.inf, np.where(f.runs_off < 0, -np.inf, f.coef)))
    tail = (1 - level) / 2 * 100
    ends = np.asarray([percentiles(col, [tail, 100 - tail]) for col in np.asarray(draws).T]) if draws else None
    lo, hi = (fit.coef, fit.coef) if ends is None else (ends[:, 0], ends[:, 1])

    def odds(b: float) -> float | None:  # None: infinite (JSON has no infinity)
        return None if b == np.inf else round(float(np.exp(b)), 5)

    return {"n": int(len(yy)), "events": int(yy.sum()), "clusters": len(groups), "ridge": ridge,
            "converged": fit.converged, "separated": fit.separated, "loglik": round(fit.loglik, 4),
            "n_boot": n_boot, "seed": seed, "boot_separated": int(separated), "boot_failed": int(failed),
            "intercept": round(float(fit.coef[0]), 5),
            "odds_ratios": {name: {"or": odds(fit.coef[j]), "lo": odds(lo[j]), "hi": odds(hi[j]),
                                   "coef": round(float(fit.coef[j]), 5)}
                            for j, name in enumerate(names, start=1)}}


__all__ = ["LogisticFit", "RIDGE", "cluster_rows", "design", "fit_logistic", "odds_ratios", "penalized_loglik"]
