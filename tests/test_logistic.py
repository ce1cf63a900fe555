"""Logistic regression by Newton's method against scipy's optimiser and closed forms, its
separation flag, its cluster-resampled odds ratios, and the step account's controlled contrasts."""

import math

import numpy as np
import pytest

from dysco_interp.analysis.bootstrap import percentiles
from dysco_interp.analysis.logistic import cluster_rows, design, fit_logistic, odds_ratios, penalized_loglik
from dysco_interp.analysis.step_controls import Predictor, eligible, mantel_haenszel, step_model, stratified_contrast
from dysco_interp.analysis.step_signals import Signal
from dysco_interp.errors import ConfigError


def data(n=400, seed=1):
    rng = np.random.default_rng(seed)
    x = np.column_stack([rng.integers(0, 2, n), rng.normal(-3, 2, n), rng.exponential(1.0, n)])
    eta = -2 + 1.5 * x[:, 0] + 0.6 * (x[:, 1] + 3) - 0.8 * x[:, 2]
    y = (rng.random(n) < 1 / (1 + np.exp(-eta))).astype(float)
    return design(x.T), y


def test_the_newton_fit_finds_the_maximum_scipy_finds_on_the_same_penalised_likelihood():
    from scipy.optimize import minimize

    X, y = data()
    fit = fit_logistic(X, y, ridge=0.5)  # a ridge large enough to matter, so both must use the same one

    def neg(b):
        return -penalized_loglik(b, X, y, ridge=0.5)

    def grad(b):
        p = 1 / (1 + np.exp(-(X @ b)))
        g = X.T @ (y - p) - 0.5 * np.r_[0.0, b[1:]]
        return -g

    ref = minimize(neg, np.zeros(X.shape[1]), jac=grad, method="BFGS", options={"gtol": 1e-10})
    assert fit.converged and not fit.separated
    np.testing.assert_allclose(fit.coef, ref.x, atol=1e-5)
    assert fit.loglik == pytest.approx(-ref.fun, abs=1e-8)


def test_one_binary_predictor_gives_the_two_by_two_tables_odds_ratio():
    # 30 of 100 exposed and 10 of 200 unexposed: OR = (30/70) / (10/190), intercept = log(10/190)
    x = [1] * 100 + [0] * 200
    y = [1] * 30 + [0] * 70 + [1] * 10 + [0] * 190
    fit = fit_logistic(design([x]), y)
    assert fit.coef[1] == pytest.approx(math.log((30 / 70) / (10 / 190)), abs=1e-3)
    assert fit.coef[0] == pytest.approx(math.log(10 / 190), abs=1e-4)
    assert not fit.separated


def test_a_predictor_that_splits_events_from_non_events_is_flagged_and_held_finite():
    x = [0, 0, 0, 1, 1, 1, 0, 1]
    y = [0, 0, 0, 1, 1, 1, 0, 1]
    fit = fit_logistic(design([x]), y)
    assert fit.converged and fit.separated and np.isfinite(fit.coef).all() and fit.coef[1] > 5
    assert list(fit.runs_off) == [-1, 1]  # the intercept to minus infinity, the slope to plus
    # quasi-complete: every unexposed row a non-event, so their log-odds run to minus infinity
    quasi = fit_logistic(design([x + [1]]), y + [0])
    assert quasi.separated and list(quasi.runs_off) == [-1, 1]
    # an event and a non-event on each side remove it
    assert not fit_logistic(design([x + [1, 0]]), y + [0, 1]).separated


def test_inputs_that_cannot_be_fitted_are_refused():
    with pytest.raises(ConfigError, match="0/1"):
        fit_logistic(design([[1.0, 2.0]]), [0, 2])
    with pytest.raises(ConfigError, match="positive"):
        fit_logistic(design([[1.0, 2.0]]), [0, 1], ridge=0)
    with pytest.raises(ConfigError, match="finite"):
        design([[1.0, float("nan")]])
    with pytest.raises(ConfigError, match="one value per row"):
        design([[1.0, 2.0], [1.0]])


def test_a_slope_that_runs_off_in_some_resamples_gives_its_interval_an_infinite_end():
    # 2 of 40 clusters hold the only events among the unexposed: about 1 resample in 8 has none
    x = [1, 1, 0, 0] * 40
    y = [v for c in range(40) for v in (int(c < 20), 0, int(c < 2), 0)]
    out = odds_ratios(design([x]), y, [i // 4 for i in range(160)], ["exposed"], n_boot=400)
    o = out["odds_ratios"]["exposed"]
    assert o["or"] == pytest.approx((20 / 60) / (2 / 78), rel=1e-3)
    assert out["boot_separated"] > 20 and o["hi"] is None and 1 < o["lo"] < o["or"]
    assert percentiles([1.0, 2.0, np.inf], [0, 50, 75, 100]) == [1.0, 2.0, np.inf, np.inf]
    assert percentiles([-np.inf, 0.0, float("nan")], [25]) == [-np.inf]
    np.testing.assert_allclose(percentiles(np.arange(11.0), [2.5, 97.5]), np.percentile(np.arange(11.0), [2.5, 97.5]))


def test_odds_ratios_resample_whole_clusters_and_are_seeded():
    X, y = data(n=300)
    clusters = [i // 3 for i in range(300)]
    assert [list(r) for r in cluster_rows(["b", "a", "b"])] == [[0, 2], [1]]
    out = odds_ratios(X, y, clusters, ["first", "logp", "margin"], n_boot=200, seed=3)
    assert out == odds_ratios(X, y, clusters, ["first", "logp", "margin"], n_boot=200, seed=3)
    assert out["clusters"] == 100 and out["n"] == 300 and out["boot_failed"] == 0
    fit = fit_logistic(X, y)
    for j, name in enumerate(["first", "logp", "margin"], start=1):
        o = out["odds_ratios"][name]
        assert o["or"] == pytest.approx(math.exp(fit.coef[j]), rel=1e-4) and o["lo"] < o["or"] < o["hi"]
    # the data were drawn with these effects: each interval holds its odds ratio
    assert out["odds_ratios"]["first"]["lo"] < math.exp(1.5) < out["odds_ratios"]["first"]["hi"]
    assert out["odds_ratios"]["margin"]["hi"] < 1 < out["odds_ratios"]["logp"]["lo"]
    # each row copied three times and the copies resampled together: copies add no information, so
    # the interval is about as wide as the original rows' alone
    rows = odds_ratios(X, y, list(range(300)), ["first", "logp", "margin"], n_boot=200, seed=3)
    copies = odds_ratios(np.repeat(X, 3, axis=0), np.repeat(y, 3), np.repeat(np.arange(300), 3),
                         ["first", "logp", "margin"], n_boot=200, seed=3)
    width = {k: math.log(v["hi"] / v["lo"]) for k, v in rows["odds_ratios"].items()}
    for k, v in copies["odds_ratios"].items():
        assert math.log(v["hi"] / v["lo"]) == pytest.approx(width[k], rel=0.35)


def step(vanilla, dysco, rank, logp, margin=0.5):
    return {"correct": {"vanilla": vanilla, "dysco": dysco}, "qr_rank": rank,
            "logprob": {"vanilla": logp}, "margin": {"vanilla": margin}}


def row(instance, s, model="m"):
    cls = {(False, True): "fixed", (True, False): "broken", (True, True): "both right", (False, False): "both wrong"}
    return {"model": model, "length": 1024, "instance": instance, "step": s,
            "class": cls[(s["correct"]["vanilla"], s["correct"]["dysco"])]}


def test_the_stratified_contrast_counts_each_bin_and_pools_the_ratio_by_mantel_haenszel():
    rows = []
    for i in range(20):  # hard steps: never fixed; easy steps: fixed more often where the gold edge is first
        rows += [row(f"i{i}", step(False, False, 1, -9.0)), row(f"i{i}", step(False, False, 5, -9.0)),
                 row(f"i{i}", step(False, i < 10, 1, -1.0)), row(f"i{i}", step(False, i < 2, 7, -1.0)),
                 row(f"i{i}", step(True, True, 1, -0.1))]
    logp = Signal("logp", "vanilla log p", (-6.0,), lambda s: s["logprob"]["vanilla"])
    out = stratified_contrast(rows, "fix", lambda r: r["step"]["qr_rank"] == 1, logp, n_boot=200)
    hard, easy = out["bins"]
    assert hard["exposed"]["eligible"] == 20 and hard["exposed"]["events"] == 0 and hard["ratio"] is None
    assert easy["exposed"]["events"] == 10 and easy["other"]["events"] == 2 and easy["ratio"] == pytest.approx(5.0)
    # the hard bin has no events, so the pooled ratio is the easy bin's
    assert out["mantel_haenszel"]["ratio"] == pytest.approx(5.0)
    # the 2 unexposed fixes come from 2 of 20 instances: about 1 resample in 8 has neither, an infinite
    # ratio, so the upper end is infinite (None)
    mh = out["mantel_haenszel"]
    assert mh["lo"] < 5.0 and mh["hi"] is None and mh["resamples_infinite"] > 0.05 * 200
    # two strata of equal size with ratios 2 and 8 pool between them; a zero denominator is infinite
    counts = np.array([[2, 10, 1, 10], [8, 10, 1, 10]], dtype=float)
    assert 2 < math.exp(float(mantel_haenszel(counts))) < 8
    assert mantel_haenszel(np.array([[1.0, 10, 0, 10]])) == np.inf


def test_the_step_model_fits_the_eligible_steps_clustered_by_instance():
    rng = np.random.default_rng(0)
    rows = []
    for i in range(60):
        for k in range(4):
            first = bool(rng.random() < 0.5)
            logp = float(rng.normal(-4, 2))
            fixed = bool(rng.random() < 1 / (1 + math.exp(-(-1 + 2 * first + 0.7 * (logp + 4)))))
            rows.append(row(f"i{i}", step(False, fixed, 1 if first else 3, logp), model="a" if k < 2 else "b"))
        rows.append(row(f"i{i}", step(True, True, 1, -0.1)))
    mine, y = eligible(rows, "fix")
    assert len(mine) == 240 and sum(y) == sum(r["class"] == "fixed" for r in rows)
    preds = [Predictor("qr_first", "gold edge first", lambda r: float(r["step"]["qr_rank"] == 1)),
             Predictor("logp", "vanilla log p", lambda r: r["step"]["logprob"]["vanilla"])]
    out = step_model(rows, "fix", preds, n_boot=100)
    assert out["clusters"] == 60 and out["n"] == 240 and out["left_out"] == 0  # the two models' steps pool
    assert out["odds_ratios"]["qr_first"]["lo"] > 1 and out["odds_ratios"]["logp"]["lo"] > 1
    assert step_model([r for r in rows if r["class"] != "fixed"], "fix", preds) is None
    with pytest.raises(ConfigError, match="event"):
        eligible(rows, "both")
