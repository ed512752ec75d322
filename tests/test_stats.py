"""Honest intervals and paired subject-level tests (evaluation.intervals, .paired_tests)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from fedbn_med.evaluation.intervals import (
    corrected_half_width,
    corrected_half_width_floor,
    corrected_t_interval,
    naive_t_interval,
)
from fedbn_med.evaluation.metrics import roc_auc
from fedbn_med.evaluation.paired_tests import (
    balanced_accuracy,
    bootstrap_difference,
    delong,
    mcnemar,
)


def test_corrected_interval_inflates_the_naive_one_by_the_nadeau_bengio_factor() -> None:
    values = [0.01, 0.03, -0.02, 0.04, 0.00, 0.02, 0.05, -0.01, 0.03, 0.01]
    mean, low, high = naive_t_interval(values)
    c_mean, c_low, c_high = corrected_t_interval(values, 0.25)
    assert c_mean == mean == pytest.approx(np.mean(values))
    j = len(values)
    factor = math.sqrt((1 / j + 0.25) / (1 / j))
    assert (c_high - c_low) / (high - low) == pytest.approx(factor)
    half = scipy_stats.t.ppf(0.975, j - 1) * np.std(values, ddof=1) * math.sqrt(1 / j + 0.25)
    assert c_high - c_mean == pytest.approx(half)


def test_corrected_interval_needs_a_positive_ratio() -> None:
    with pytest.raises(ValueError, match=r"test_train_ratio must be a positive number "
                                         r"\(n_test / n_train, 0.25 for 5 folds\), got 0"):
        corrected_t_interval([0.1, 0.2], 0)
    with pytest.raises(ValueError, match=r"level must be in \(0, 1\), such as 0.95, got 95"):
        corrected_t_interval([0.1, 0.2], 0.25, level=95)
    assert math.isnan(corrected_t_interval([0.1], 0.25)[1])


def test_mcnemar_counts_discordant_subjects_and_is_exact() -> None:
    a = np.array([1, 1, 1, 1, 1, 1, 0, 0, 1, 0], dtype=bool)
    b = np.array([0, 0, 0, 0, 0, 1, 1, 0, 1, 0], dtype=bool)
    result = mcnemar(a, b)
    assert (result.a_only, result.b_only) == (5, 1)
    assert result.p_value == pytest.approx(scipy_stats.binomtest(5, 6, 0.5).pvalue)
    assert mcnemar(a, a).p_value == 1.0
    with pytest.raises(ValueError, match="McNemar needs the same subjects"):
        mcnemar(a, b[:5])


def _delong_brute(y: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """DeLong's variance of AUC(a) - AUC(b) from the definition (pairwise kernels)."""
    pos, neg = y == 1, y == 0
    out = []
    for s in (a, b):
        psi = (s[pos][:, None] > s[neg][None, :]) + 0.5 * (s[pos][:, None] == s[neg][None, :])
        out.append((psi.mean(), psi.mean(axis=1), psi.mean(axis=0)))
    m, n = int(pos.sum()), int(neg.sum())
    v10 = np.stack([o[1] for o in out])
    v01 = np.stack([o[2] for o in out])
    s = np.cov(v10) / m + np.cov(v01) / n
    return out[0][0] - out[1][0], s[0, 0] + s[1, 1] - 2 * s[0, 1]


def test_delong_matches_its_definition() -> None:
    rng = np.random.default_rng(0)
    y = (rng.random(60) < 0.4).astype(int)
    a = np.round(y * 0.8 + rng.normal(size=60), 1)  # rounding makes ties
    b = np.round(y * 0.3 + rng.normal(size=60), 1)
    result = delong(y, a, b)
    diff, var = _delong_brute(y, a, b)
    assert result.auc_a == pytest.approx(roc_auc(y, a))
    assert result.difference == pytest.approx(diff)
    assert result.se == pytest.approx(math.sqrt(var))
    assert result.p_value == pytest.approx(2 * scipy_stats.norm.sf(abs(diff) / math.sqrt(var)))
    low, high = result.interval()
    assert low < diff < high
    same = delong(y, a, a)
    assert same.difference == 0 and same.p_value == 1.0


def test_delong_stratified_by_site_weighs_sites_by_size() -> None:
    rng = np.random.default_rng(1)
    y = np.tile([0, 1], 30)
    site = np.array(["A"] * 40 + ["B"] * 20)
    a = y + rng.normal(size=60)
    b = y * 0.2 + rng.normal(size=60) + 10 * (site == "B")  # a shift B's AUC does not see
    result = delong(y, a, b, strata=site)
    parts = [delong(y[site == s], a[site == s], b[site == s]) for s in ("A", "B")]
    assert result.difference == pytest.approx((40 * parts[0].difference
                                               + 20 * parts[1].difference) / 60)
    assert result.se == pytest.approx(math.sqrt((40 / 60) ** 2 * parts[0].se ** 2
                                                + (20 / 60) ** 2 * parts[1].se ** 2))
    with pytest.raises(ValueError, match="DeLong needs one label and two scores per subject"):
        delong(y, a, b[:3])


def test_bootstrap_difference_is_site_mean_and_stratified() -> None:
    rng = np.random.default_rng(2)
    y = np.tile([0, 1], 40)
    site = np.repeat(["A", "B"], 40)
    good = np.where(y == 1, 0.8, 0.2) + rng.normal(scale=0.3, size=80)
    bad = rng.random(80)
    diff, low, high = bootstrap_difference(y, good, bad, site, n_boot=300)
    expected = np.mean([balanced_accuracy(y[site == s], good[site == s])
                        - balanced_accuracy(y[site == s], bad[site == s]) for s in "AB"])
    assert diff == pytest.approx(expected)
    assert low < diff < high and low > 0
    assert bootstrap_difference(y, good, good, site, n_boot=100) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="Unknown metric 'f1'. Valid: balanced_accuracy, auc"):
        bootstrap_difference(y, good, bad, site, "f1")
    with pytest.raises(ValueError, match="n_boot must be at least 100"):
        bootstrap_difference(y, good, bad, site, n_boot=10)


def test_corrected_interval_covers_where_the_naive_one_does_not() -> None:
    """Cells that share most of their data: the naive interval under-covers."""
    rng = np.random.default_rng(3)
    naive_hits = corrected_hits = 0
    trials, cells = 300, 15
    for _ in range(trials):
        shared = rng.normal(scale=0.02)  # what every cell of one data set shares
        values = shared + rng.normal(scale=0.02, size=cells)
        naive_hits += naive_t_interval(values)[1] <= 0 <= naive_t_interval(values)[2]
        _, low, high = corrected_t_interval(values, 1.0)
        corrected_hits += low <= 0 <= high
    assert naive_hits / trials < 0.8
    assert corrected_hits / trials > 0.9


def test_repeated_bootstrap_estimates_the_mean_over_repetitions() -> None:
    from fedbn_med.evaluation.paired_tests import bootstrap_repeated_difference

    rng = np.random.default_rng(4)
    y = np.tile([0, 1], 30)
    site = np.repeat(["A", "B"], 30)
    a = rng.random((3, 60)) < np.where(y == 1, 0.8, 0.3)  # three repetitions
    b = rng.random((3, 60)) < 0.5
    diff, low, high = bootstrap_repeated_difference(y, a, b, site, n_boot=400)
    expected = np.mean([np.mean([balanced_accuracy(y[site == s], a[r, site == s])
                                 - balanced_accuracy(y[site == s], b[r, site == s])
                                 for s in "AB"]) for r in range(3)])
    assert diff == pytest.approx(expected)
    assert low < diff < high
    tested = np.ones((3, 60), dtype=bool)
    tested[1, :10] = False  # a repetition that did not test some subjects
    part = bootstrap_repeated_difference(y, a, b, site, tested, n_boot=100)[0]
    keep = site == "A"
    keep1 = keep & tested[1]
    first = np.mean([balanced_accuracy(y[m], a[r, m]) - balanced_accuracy(y[m], b[r, m])
                     for r, m in ((0, keep), (1, keep1), (2, keep))])
    second = np.mean([balanced_accuracy(y[~keep], a[r, ~keep])
                      - balanced_accuracy(y[~keep], b[r, ~keep]) for r in range(3)])
    assert part == pytest.approx(np.mean([first, second]))
    assert bootstrap_repeated_difference(y, a, a, site, n_boot=100) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match=r"Expected \(repetitions, 60\) predictions"):
        bootstrap_repeated_difference(y, a, b[:2], site)
    with pytest.raises(ValueError, match="Unknown metric 'auc'. Valid: balanced_accuracy"):
        bootstrap_repeated_difference(y, a, b, site, metric="auc")


@pytest.mark.parametrize("successes, n", [(0, 10), (8, 12), (12, 12), (27, 56), (1, 1)])
def test_wilson_interval_equals_scipys(successes: int, n: int) -> None:
    from fedbn_med.evaluation.intervals import wilson_interval

    want = scipy_stats.binomtest(successes, n).proportion_ci(0.95, method="wilson")
    assert wilson_interval(successes, n) == pytest.approx((want.low, want.high), abs=1e-12)
    # a rate times n that is whole only up to rounding is taken as the count
    assert wilson_interval(successes / n * n, n) == pytest.approx((want.low, want.high))


def test_a_t_interval_is_shown_within_what_the_figure_can_be() -> None:
    from fedbn_med.evaluation.tables import format_stats

    # three cells: the corrected t-interval of a rate passes 0 and 100 %
    mean, low, high = corrected_t_interval([0.2, 0.9, 0.95], 0.25)
    assert low < 0 and high > 1
    assert format_stats(mean, low, high) == f"{100 * mean:.1f} [0.0, 100.0]"
    gap = corrected_t_interval([-0.6, 0.9, 0.1], 0.25)
    assert gap[1] < -1 and gap[2] > 1
    assert format_stats(*gap, signed=True).endswith("[-100.0, +100.0]")
    # a bound inside the range is left as it is; other scales are not clipped by default
    assert format_stats(0.5, 0.4, 0.6) == "50.0 [40.0, 60.0]"
    assert format_stats(10.0, -3.0, 23.0, scale=1.0) == "10.0 [-3.0, 23.0]"
    assert format_stats(10.0, -3.0, 23.0, scale=1.0, bounds=(0.0, math.inf)) == \
        "10.0 [0.0, 23.0]"


def test_the_design_half_width_is_the_intervals_and_its_floor_is_its_limit() -> None:
    values = [0.61, 0.55, 0.70, 0.58, 0.66, 0.52, 0.63]
    _, low, high = corrected_t_interval(values, 0.25)
    sd = float(np.std(values, ddof=1))
    assert corrected_half_width(sd, 0.25, len(values)) == pytest.approx((high - low) / 2)
    floor = corrected_half_width_floor(sd, 0.25)
    assert floor < corrected_half_width(sd, 0.25, 10_000) < floor * 1.001
    assert math.isnan(corrected_half_width(sd, 0.25, 1))
    assert math.isnan(corrected_half_width_floor(math.nan, 0.25))
