"""Subject-level AUC tests rank each subject within its own site and test fold.

A site's pooled out-of-fold predictions come from one model per fold. A model that
predicts its training part's prevalence for every subject (the majority-class row) has
an AUC below 50 % over a site's pooled folds under stratified folds, which made every
learned method look better against it. These tests build such a comparison by hand.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedbn_med.evaluation.comparison import Cell, Comparison, SitePredictions
from fedbn_med.evaluation.fold_auc import bootstrap_fold_auc_difference
from fedbn_med.evaluation.metrics import roc_auc
from fedbn_med.evaluation.paired_tests import delong

SITES = ("S1", "S2")
N_FOLDS = 5


def _labels(n: int, positives: int, seed: int) -> np.ndarray:
    y = np.array([1] * positives + [0] * (n - positives))
    return np.random.default_rng(seed).permutation(y)


def _folds(y: np.ndarray, seed: int) -> np.ndarray:
    """Stratified folds whose test prevalence differs from fold to fold."""
    rng = np.random.default_rng(seed)
    fold = np.empty(y.size, dtype=np.int64)
    for cls in (0, 1):
        idx = rng.permutation(np.flatnonzero(y == cls))
        fold[idx] = np.arange(idx.size) % N_FOLDS
    return fold


def _cell(strategy: str, fold: int, seed: int, preds: dict[str, SitePredictions]) -> Cell:
    aucs = {s: roc_auc(p.labels, p.prob) for s, p in preds.items()}
    finite = [v for v in aucs.values() if math.isfinite(v)]
    scores = {at: {"auc": {**aucs, "mean": float(np.mean(finite))}} for at in ("best", "last")}
    return Cell(strategy, fold, seed, 1, 1, scores, preds)


def _comparison(repetitions: int = 2) -> Comparison:
    comparison = Comparison(sites=SITES, metric_names=("auc",))
    labels = {"S1": _labels(31, 17, 0), "S2": _labels(26, 9, 1)}
    rng = np.random.default_rng(5)
    for seed in range(repetitions):
        folds = {s: _folds(y, 10 + seed) for s, y in labels.items()}
        for k in range(N_FOLDS):
            learned, majority = {}, {}
            for s, y in labels.items():
                test = np.flatnonzero(folds[s] == k)
                train = np.flatnonzero(folds[s] != k)
                signal = 0.4 * y[test] + rng.normal(scale=0.5, size=test.size)
                learned[s] = SitePredictions(test, y[test], 1 / (1 + np.exp(-signal)))
                # the majority-class row: its training part's prevalence, for everyone
                majority[s] = SitePredictions(test, y[test],
                                              np.full(test.size, y[train].mean()))
            comparison.add(_cell("fedbn", k, seed, learned))
            comparison.add(_cell("Majority class", k, seed, majority))
    return comparison


def test_a_prevalence_predictor_is_below_chance_pooled_and_at_chance_within_folds() -> None:
    comparison = _comparison()
    pooled = comparison.out_of_fold("Majority class")
    # the bias the fix removes: pooled over folds, the constant ranks against the labels
    assert np.mean([roc_auc(y, p) for _, y, p, _ in pooled.values()]) < 0.45
    tests = comparison.subject_tests("fedbn", "Majority class", n_boot=200)
    assert tests is not None
    learned = comparison.subject_tests("fedbn", "fedbn", n_boot=200)
    assert learned is not None and learned["delong_auc_diff"] == 0.0
    # each fold's constant scores exactly 50 %: the difference is the learned AUC - 0.5
    cells = comparison.values("fedbn", "best", "auc")
    assert tests["bootstrap_auc_diff"] == pytest.approx(np.mean(list(cells.values())) - 0.5)
    assert tests["bootstrap_auc_ci_low"] < tests["bootstrap_auc_diff"] < tests[
        "bootstrap_auc_ci_high"]


def test_the_auc_bootstrap_estimates_what_the_cells_do() -> None:
    comparison = _comparison(repetitions=3)
    tests = comparison.subject_tests("fedbn", "Majority class", n_boot=200)
    mean, _, _, cells = comparison.difference("fedbn", "Majority class", "best", "auc")
    assert cells == 3 * N_FOLDS and tests is not None
    assert tests["bootstrap_auc_diff"] == pytest.approx(mean)


def test_delong_is_stratified_by_site_and_fold_and_averaged_over_repetitions() -> None:
    comparison = _comparison(repetitions=2)
    tests = comparison.subject_tests("fedbn", "Majority class", n_boot=200)
    assert tests is not None
    by_seed = []
    for seed in (0, 1):
        y, a, b, strata = [], [], [], []
        for c in comparison.cells:
            if c.seed != seed or c.strategy != "fedbn":
                continue
            other = next(o for o in comparison.cells if o.strategy == "Majority class"
                         and (o.fold, o.seed) == (c.fold, c.seed))
            for s in SITES:
                y.append(c.predictions[s].labels)
                a.append(c.predictions[s].prob)
                b.append(other.predictions[s].prob)
                strata += [f"{s}/{c.fold}"] * c.predictions[s].index.size
        by_seed.append(delong(np.concatenate(y), np.concatenate(a), np.concatenate(b),
                              strata=np.array(strata)))
    assert all(d.auc_b == pytest.approx(0.5) for d in by_seed)
    assert tests["delong_auc_diff"] == pytest.approx(np.mean([d.difference for d in by_seed]))
    se = np.mean([d.se for d in by_seed])
    assert tests["delong_ci_high"] - tests["delong_ci_low"] == pytest.approx(2 * 1.959964 * se,
                                                                             rel=1e-4)


def test_fold_auc_bootstrap_checks_its_input() -> None:
    y = np.array([0, 1, 0, 1])
    p = np.array([[0.1, 0.9, 0.2, 0.8]])
    fold = np.array([[0, 0, 1, 1]])
    site = np.array(["A"] * 4)
    assert bootstrap_fold_auc_difference(y, p, p, site, fold, n_boot=100) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="n_boot must be at least 100"):
        bootstrap_fold_auc_difference(y, p, p, site, fold, n_boot=10)
    with pytest.raises(ValueError, match=r"Expected \(repetitions, 4\) scores and folds"):
        bootstrap_fold_auc_difference(y, p, p, site, fold[:, :3], n_boot=100)
    # subjects out of every fold (-1) leave nothing to score
    diff, low, high = bootstrap_fold_auc_difference(y, p, 1 - p, site, -np.ones_like(fold),
                                                    n_boot=100)
    assert math.isnan(diff) and math.isnan(low) and math.isnan(high)


def test_unpaired_folds_are_named():
    comparison = _comparison(repetitions=1)
    moved = [Cell(c.strategy, (c.fold + 1) % N_FOLDS, c.seed, 1, 1, c.scores, c.predictions)
             if c.strategy == "Majority class" else c for c in comparison.cells]
    broken = Comparison(sites=SITES, cells=moved, metric_names=("auc",))
    with pytest.raises(ValueError, match=r"'fedbn' and 'Majority class' tested subject \d+ of "
                                         r"site S1 in different folds of repetition \(seed\) 0"):
        broken.subject_tests("fedbn", "Majority class", n_boot=100)
