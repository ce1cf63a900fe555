"""Exact paired statistics (analysis.paired, analysis.multiplicity, analysis.equivalence) checked
against scipy.stats and exact rational arithmetic on fixed inputs."""

import json
from dataclasses import replace
from fractions import Fraction
from itertools import product

import numpy as np
import pytest
from scipy import stats

from dysco_interp.analysis.bootstrap import NO_CI
from dysco_interp.analysis.equivalence import tost
from dysco_interp.analysis.margins import margin_of
from dysco_interp.analysis.multiplicity import bh_q_values, fill_q
from dysco_interp.analysis.paired import (
    EXACT_MAX,
    N_DRAWS,
    PairedComparison,
    paired_comparison,
    paired_differences,
    sign_flip_test,
    with_q,
)
from dysco_interp.analysis.report import equivalent, fmt_delta, fmt_p
from dysco_interp.analysis.result_tables import paired_deltas
from dysco_interp.errors import ConfigError


def scipy_exact_p(differences) -> float:
    """scipy's paired permutation test of the mean difference, every sign pattern enumerated."""
    d = np.asarray(differences, dtype=float)
    return stats.permutation_test((d, np.zeros_like(d)), lambda x, y, axis: np.mean(x - y, axis=axis),
                                  permutation_type="samples", vectorized=True, n_resamples=np.inf,
                                  alternative="two-sided").pvalue


def rational_p(decimals: list[str]) -> Fraction:
    """The sign-flip p in exact arithmetic: no rounding, so ties are ties."""
    d = [Fraction(s) for s in decimals if Fraction(s) != 0]
    observed = abs(sum(d))
    hits = sum(abs(sum(s * v for s, v in zip(signs, d))) >= observed for signs in product((1, -1), repeat=len(d)))
    return Fraction(hits, 2 ** len(d))


# ---------------------------------------------------------------------------- sign-flip p


@pytest.mark.parametrize("differences", [
    [0.3, -0.1, 0.25, 0.4, 0.05, -0.2, 0.15, 0.6],
    [-0.8, 0.1, 0.35, 1.2, -0.05, 0.4, 0.9, 0.02, 0.3, -0.6, 0.7, 0.2],
    [0.0, 0.5, 0.0, -0.25, 1.0, 0.75, 0.0, 0.5],  # zeros flip to themselves
    [-2.5, -0.125, -1.0, 0.375, -0.75],
], ids=["mixed", "log-p-like", "with-zeros", "mostly-worse"])
def test_sign_flip_p_is_scipys_exact_permutation_test(differences):
    test = sign_flip_test(differences)
    assert test.draws is None and test.nonzero == sum(v != 0 for v in differences)
    assert test.p == pytest.approx(scipy_exact_p(differences), rel=1e-12)


@pytest.mark.parametrize("better, worse", [(4, 0), (0, 3), (6, 1), (5, 5), (9, 3), (14, 6)])
def test_differences_of_plus_minus_one_give_the_two_sided_sign_test(better, worse):
    d = [1.0] * better + [-1.0] * worse + [0.0] * 5
    assert sign_flip_test(d).p == pytest.approx(stats.binomtest(better, better + worse).pvalue, rel=1e-12)


def test_four_better_none_worse_is_p_one_eighth_though_the_bootstrap_excludes_0():
    c = paired_comparison([1.0] * 4 + [0.0] * 16)
    assert (c.better, c.worse, c.same, c.n) == (4, 0, 16, 20)
    assert c.lo > 0  # the percentile bootstrap calls it significant
    assert c.p == 0.125 == stats.binomtest(4, 4).pvalue and c.draws is None


def test_enumeration_stops_at_exact_max_then_monte_carlo_takes_over():
    rng = np.random.default_rng(7)
    signs = np.where(rng.random(EXACT_MAX + 1) < 0.7, 1.0, -1.0)
    exact = sign_flip_test(signs[:EXACT_MAX])
    assert exact.draws is None
    assert exact.p == pytest.approx(stats.binomtest(int((signs[:EXACT_MAX] > 0).sum()), EXACT_MAX).pvalue, rel=1e-12)
    drawn = sign_flip_test(signs)
    assert drawn.draws == N_DRAWS and drawn.nonzero == EXACT_MAX + 1
    binomial = stats.binomtest(int((signs > 0).sum()), EXACT_MAX + 1).pvalue
    assert abs(drawn.p - binomial) < 6 * np.sqrt(binomial * (1 - binomial) / N_DRAWS)


def test_monte_carlo_p_is_close_to_exact_seeded_and_never_0():
    d = [0.3, -0.1, 0.25, 0.4, 0.05, -0.2, 0.15, 0.6, -0.35, 0.45, 0.1, -0.05, 0.2, 0.3]
    exact = scipy_exact_p(d)
    drawn = sign_flip_test(d, exact_max=8, n_draws=40_000, seed=3)
    assert drawn.draws == 40_000
    assert abs(drawn.p - exact) < 6 * np.sqrt(exact * (1 - exact) / 40_000)
    assert drawn == sign_flip_test(d, exact_max=8, n_draws=40_000, seed=3)
    # the observed pattern counts once: (b + 1) / (N + 1)
    assert drawn.p * 40_001 == pytest.approx(round(drawn.p * 40_001))
    # 40 instances all better: the exact p is 2 / 2^40, far below what 1000 draws can show
    assert sign_flip_test(np.linspace(0.1, 3, 40), n_draws=1000).p == 1 / 1001


def test_floating_ties_count_the_observed_statistic():
    # 0.1 + 0.2 - 0.3 is 5.6e-17 in floating point and 0 in fact: every pattern is as extreme
    assert sign_flip_test([0.1, 0.2, -0.3]).p == 1.0 == rational_p(["0.1", "0.2", "-0.3"])
    # the observed 0.1 + 0.2 - 0.3 + 0.7 is met again by -0.1 - 0.2 + 0.3 + 0.7, rounded otherwise
    assert rational_p(["0.1", "0.2", "-0.3", "0.7"]) == Fraction(10, 16)
    for decimals in (["0.1", "0.2", "-0.3", "0.7"], ["0.1", "0.2", "0.3", "-0.6", "0.7", "0.3", "-0.4"]):
        assert sign_flip_test([float(s) for s in decimals]).p == float(rational_p(decimals))
        assert sign_flip_test([float(s) for s in decimals]).p == pytest.approx(scipy_exact_p(decimals), rel=1e-12)


def test_nothing_changed_or_one_change_is_p_one():
    unchanged = paired_comparison([0.0] * 12)
    assert (unchanged.mean, unchanged.p, unchanged.better, unchanged.worse, unchanged.same) == (0.0, 1.0, 0, 0, 12)
    assert sign_flip_test([0.0] * 12).nonzero == 0
    one = paired_comparison([0.0] * 9 + [-0.5])  # +-0.5 are the only two sums, both as extreme
    assert (one.p, one.better, one.worse, one.same) == (1.0, 0, 1, 9)
    single = paired_comparison([0.4])
    assert (single.n, single.p, single.lo, single.hi) == (1, 1.0, 0.4, 0.4)


# ---------------------------------------------------------------------------- comparisons and q


def test_a_comparison_pairs_method_minus_baseline():
    d = paired_differences([0.5, 0.25, 1.0, 0.0], [0.75, 0.25, 0.5, 0.0])
    assert d.tolist() == [0.25, 0.0, -0.5, 0.0]
    c = paired_comparison(d, n_boot=500, seed=4)
    assert (c.better, c.worse, c.same, c.n) == (1, 1, 2, 4)
    assert c.mean == -0.0625 and c.lo <= c.mean <= c.hi
    assert c == paired_comparison(d, n_boot=500, seed=4) and c.q is None


@pytest.mark.parametrize("p", [
    [0.01, 0.04, 0.03, 0.5, 0.2],
    [0.125, 0.125, 0.001, 1.0, 0.0, 0.049, 0.6, 0.125],  # ties, 0 and 1
    [0.3],
])
def test_bh_q_values_are_scipys_false_discovery_control(p):
    np.testing.assert_allclose(bh_q_values(p), stats.false_discovery_control(p, method="bh"), rtol=1e-12)


def test_with_q_fills_one_tables_family():
    diffs = {("16K", "small-budget"): [0.1, 0.2, 0.05, 0.3, -0.02, 0.15],
             ("16K", "paper"): [-0.1, 0.05, -0.2, 0.0, -0.15, -0.05],
             ("31K", "paper"): [0.0, 0.1, -0.1, 0.05, 0.0, -0.05]}
    table = {k: paired_comparison(d) for k, d in diffs.items()}
    filled = with_q(table)
    assert list(filled) == list(table)
    expected = stats.false_discovery_control([c.p for c in table.values()], method="bh")
    assert [c.q for c in filled.values()] == pytest.approx(expected.tolist(), rel=1e-12)
    assert [c.q for c in with_q(list(table.values()))] == [c.q for c in filled.values()]
    assert all(c.q is None for c in table.values())  # frozen: the originals are untouched
    assert with_q([]) == [] and with_q({}) == {}


def test_as_dict_keeps_small_p_and_is_json():
    c = PairedComparison(0.1234567, 0.05, 0.2, 200, 150, 40, 10, 2.34567e-6, 100_000, 4.5e-5)
    d = c.as_dict()
    assert (d["mean"], d["p"], d["q"], d["draws"]) == (0.12346, 2.3457e-6, 4.5e-5, 100_000)
    assert json.loads(json.dumps(d, allow_nan=False)) == d


def test_fmt_paired_in_the_tables_delta_style():
    c = PairedComparison(0.05, 0.008, 0.1, 30, 6, 1, 23, 0.125, None)
    assert fmt_delta(c.as_dict()) == "+0.050 [+0.008, +0.100] 6↑1↓ p=0.12"
    assert fmt_delta(replace(c, q=0.3).as_dict()) == "+0.050 [+0.008, +0.100] 6↑1↓ p=0.12 q=0.30"
    assert fmt_delta(paired_comparison([1.0]).as_dict()) == f"+1.000 ({NO_CI}) 1↑0↓ p=1.0"
    assert fmt_delta(None) == "-"
    assert [fmt_p(p) for p in (1.0, 0.3, 0.0034, 1 / 100_001)] == ["1.0", "0.30", "0.0034", "1.0e-05"]


# ---------------------------------------------------------------------------- equivalence


@pytest.mark.parametrize("differences, margin, equivalent, not_worse", [
    ([0.01, -0.02, 0.03, 0.0, 0.015, -0.01, 0.02, 0.005, -0.005, 0.01], 0.05, True, True),
    ([0.01, -0.15, 0.03, 0.0, 0.015, -0.12, 0.02, 0.005, -0.18, 0.01], 0.05, False, False),
    ([0.04, 0.06, 0.03, 0.05, 0.045, 0.055], 0.05, False, True),  # does not hurt, may help by the margin
    ([-0.3, 0.1, -0.2, 0.05, -0.25, -0.1], 0.1, False, False),
])
def test_tost_is_two_one_sided_t_tests(differences, margin, equivalent, not_worse):
    e = tost(differences, margin=margin)
    lower = stats.ttest_1samp(differences, -margin, alternative="greater").pvalue
    upper = stats.ttest_1samp(differences, margin, alternative="less").pvalue
    assert (e.p_lower, e.p_upper, e.p) == pytest.approx((lower, upper, max(lower, upper)), rel=1e-10)
    assert e.se == pytest.approx(stats.sem(differences), rel=1e-12) and e.n == len(differences)
    # TOST at 0.05 is the 90% t interval lying inside the margin
    lo, hi = stats.t.interval(0.9, len(differences) - 1, loc=np.mean(differences), scale=stats.sem(differences))
    assert e.equivalent() == equivalent == (-margin < lo and hi < margin)
    assert e.not_worse() == not_worse == (lower < 0.05)


def test_tost_edge_cases_and_its_margin_is_always_stated():
    assert tost([0.02], margin=0.05).p == 1.0 and tost([0.02], margin=0.05).se is None
    inside, outside = tost([0.02] * 5, margin=0.05), tost([-0.1] * 5, margin=0.05)
    assert (inside.p_lower, inside.p_upper, inside.p) == (0.0, 0.0, 0.0)
    assert (outside.p_lower, outside.p_upper, outside.not_worse()) == (1.0, 0.0, False)
    with pytest.raises(TypeError):
        tost([0.1, 0.2])
    for bad in (0, -0.1, float("nan"), float("inf"), True, "0.1"):
        with pytest.raises(ConfigError):
            tost([0.1, 0.2], margin=bad)
    assert json.loads(json.dumps(inside.as_dict(), allow_nan=False)) == inside.as_dict()


def test_a_margin_carries_the_tost_into_each_comparison_and_its_table():
    near = [0.01, -0.02, 0.03, 0.0, 0.015, -0.01, 0.02, 0.005, -0.005, 0.01]
    far = [0.01, -0.15, 0.03, 0.0, 0.015, -0.12, 0.02, 0.005, -0.18, 0.01]
    plain = paired_comparison(near)
    assert plain.eq_p is None and "margin" not in plain.as_dict()  # records without a margin keep their keys
    a, b = paired_comparison(near, margin=0.05), paired_comparison(far, margin=0.05)
    assert a.eq_p == tost(near, margin=0.05).p and b.eq_p == tost(far, margin=0.05).p
    # the equivalence tests are a family of their own, BH-corrected like the sign-flip tests
    filled = with_q([a, plain, b])
    qa, qb = bh_q_values([a.eq_p, b.eq_p])
    assert (filled[0].eq_q, filled[1].eq_q, filled[2].eq_q) == (pytest.approx(qa), None, pytest.approx(qb))
    dicts = [a.as_dict(), plain.as_dict(), b.as_dict()]
    fill_q(iter(dicts))  # a generator, as the table builders pass it
    assert dicts[0]["eq_q"] == pytest.approx(filled[0].eq_q, rel=1e-4) and "eq_q" not in dicts[1]
    assert dicts[0]["q"] == pytest.approx(filled[0].q, rel=1e-4)
    # the table marks only the difference shown equivalent, with its margin
    assert fmt_delta(dicts[0]).endswith(" ≡±0.05") and "≡" not in fmt_delta(dicts[2])
    assert "≡" not in fmt_delta(dicts[1]) and not equivalent(None)


def test_a_table_tests_equivalence_at_each_metrics_own_margin():
    records = [{"id": str(i), "index": i, "tf_logprob": -1.0 + d, "tf_token_accuracy": 0.5, "mystery": 1.0}
               for i, d in enumerate([0.004, -0.003, 0.002, 0.0, 0.001, -0.002])]
    reference = [{**r, "tf_logprob": -1.0, "mystery": 0.5} for r in records]
    deltas = paired_deltas(records, reference, ["tf_logprob", "tf_token_accuracy", "mystery"])
    assert deltas["tf_logprob"]["margin"] == margin_of("tf_logprob") == 0.03
    assert equivalent(deltas["tf_logprob"]) and equivalent(deltas["tf_token_accuracy"])
    assert "margin" not in deltas["mystery"] and margin_of("mystery") is None


# ---------------------------------------------------------------------------- bad input


def test_bad_input_is_a_config_error():
    cases = [
        lambda: paired_differences([1.0, 2.0], [1.0]),
        lambda: paired_differences([], []),
        lambda: paired_differences([1.0, float("nan")], [1.0, 2.0]),
        lambda: paired_comparison([]),
        lambda: paired_comparison([0.1, float("inf")]),
        lambda: sign_flip_test([[0.1, 0.2]]),
        lambda: sign_flip_test([0.1], exact_max=25),
        lambda: sign_flip_test([0.1], exact_max=True),
        lambda: sign_flip_test([0.1], n_draws=0),
        lambda: bh_q_values([0.5, 1.5]),
        lambda: bh_q_values([0.5, float("nan")]),
        lambda: tost([], margin=0.1),
    ]
    for case in cases:
        with pytest.raises(ConfigError):
            case()
    assert bh_q_values([]) == []
