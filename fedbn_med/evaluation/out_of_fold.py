"""Per subject: each subject's pooled out-of-fold prediction, and the paired tests on them.

The runs of :func:`fedbn_med.evaluation.runner.run_cell` keep each subject's test
prediction at the selected round (:attr:`~fedbn_med.evaluation.comparison.Cell.predictions`).
Pooled over the folds and averaged over the repetitions, these give one out-of-fold
prediction per subject (:func:`pooled_predictions`), on which FedBN is tested against
each other method subject by subject (:func:`subject_tests`): McNemar on correctness of
those pooled predictions; DeLong on AUC and a bootstrap of the AUC on each repetition's
predictions, each subject ranked only within its own site and test fold (one model's
scores); a bootstrap of the balanced accuracy. Both bootstraps resample subjects within
sites.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from fedbn_med.evaluation.fold_auc import bootstrap_fold_auc_difference
from fedbn_med.evaluation.paired_tests import (
    DeLong,
    bootstrap_repeated_difference,
    delong,
    mcnemar,
    two_sided_p,
)

if TYPE_CHECKING:
    from fedbn_med.evaluation.comparison import Comparison

__all__ = ["cell_prediction_rows", "pooled_predictions", "prediction_rows", "subject_tests"]


def pooled_predictions(comparison: Comparison, strategy: str, at: str = "best"
                       ) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, int]]:
    """Return each site's pooled out-of-fold predictions of one strategy.

    Returns
    -------
    dict
        ``{site: (subject index, label, P(ASD) averaged over repetitions, repetitions)}``
        over the subjects that were tested; empty when the cells kept no predictions.
    """
    return {site: (index, y, prob, reps)
            for site, (index, y, prob, _, reps) in _pooled(comparison, strategy, at).items()}


def _pooled(comparison: Comparison, strategy: str, at: str = "best"
            ) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]]:
    """Return :func:`pooled_predictions` with each subject's mean threshold beside P(ASD).

    A pooled subject is predicted ASD when its mean P(ASD) is at least the mean of the
    thresholds its runs predicted with (0.5 throughout unless ``threshold=site_prior``).
    """
    if at != "best":
        raise ValueError(f"Predictions are kept at the best round only, got at={at!r}.")
    sums: dict[str, dict[int, list[float]]] = {}
    cuts: dict[str, dict[int, list[float]]] = {}
    labels: dict[str, dict[int, int]] = {}
    for c in comparison.cells:
        if c.strategy != strategy:
            continue
        for site, p in c.predictions.items():
            for i, y, q in zip(p.index.tolist(), p.labels.tolist(), p.prob.tolist()):
                sums.setdefault(site, {}).setdefault(i, []).append(q)
                cuts.setdefault(site, {}).setdefault(i, []).append(float(p.threshold))
                labels.setdefault(site, {})[i] = y
    out = {}
    for site in comparison.sites:
        if site not in sums:
            continue
        index = np.array(sorted(sums[site]), dtype=np.int64)
        y = np.array([labels[site][i] for i in index], dtype=np.int64)
        prob = np.array([np.mean(sums[site][i]) for i in index])
        cut = np.array([np.mean(cuts[site][i]) for i in index])
        reps = min(len(v) for v in sums[site].values())
        out[site] = (index, y, prob, cut, reps)
    return out


def subject_tests(comparison: Comparison, a: str, b: str, *, n_boot: int = 2000
                  ) -> dict[str, float] | None:
    """Return the subject-level paired tests of a against b, or None without predictions.

    McNemar on correctness takes each subject's out-of-fold P(ASD) averaged over the
    repetitions (one prediction per subject), predicted ASD at and above the mean of the
    thresholds its runs predicted with (each run's own: 0.5, or the site's with
    ``threshold=site_prior``); the balanced accuracy bootstrap predicts each run's
    subjects at that run's threshold.

    The AUC tests rank a subject only against subjects of its own site *and test fold*:
    a site's pooled predictions come from one model per fold, and scores of different
    models need not share a scale. A constant model shows why it matters: the majority
    class predicts its training part's prevalence, which runs against its test fold's
    under stratified folds, so its AUC over a site's pooled folds is below 50 %.
    DeLong's test is computed per repetition with (site, fold) strata, combined by
    stratum size, and its differences averaged over the repetitions with the mean of
    their standard errors (the repetitions share their subjects: correlation 1 at
    most, so this standard error is not too small). The AUC bootstrap resamples
    subjects within each site, once per bootstrap for every repetition alike, and
    differences the mean over cells of the site-mean AUC, each site's AUC within its
    test fold: the tables' AUC.

    The balanced accuracy bootstrap estimates what the cells do, the mean over
    repetitions of the site-mean balanced accuracy difference of each repetition's
    pooled out-of-fold predictions, on the same resamples.
    """
    oa, ob = _pooled(comparison, a), _pooled(comparison, b)
    sites = [s for s in oa if s in ob and np.array_equal(oa[s][0], ob[s][0])]
    if not sites:
        return None
    y = np.concatenate([oa[s][1] for s in sites])
    pa = np.concatenate([oa[s][2] >= oa[s][3] for s in sites])
    pb = np.concatenate([ob[s][2] >= ob[s][3] for s in sites])
    strata = np.concatenate([[s] * len(oa[s][0]) for s in sites])
    truth = y == 1
    mc = mcnemar(pa == truth, pb == truth)
    index = {s: oa[s][0] for s in sites}
    prob_a, prob_b, fold, cut_a, cut_b = _by_repetition(comparison, a, b, index)
    tested = fold >= 0
    dl = _repeated_delong(y, prob_a, prob_b, strata, fold)
    dl_low, dl_high = dl.interval()
    bal, bal_low, bal_high = bootstrap_repeated_difference(
        y, prob_a >= cut_a, prob_b >= cut_b, strata, tested, n_boot=n_boot)
    auc, auc_low, auc_high = bootstrap_fold_auc_difference(y, prob_a, prob_b, strata, fold,
                                                           n_boot=n_boot)
    return {"subjects": float(y.size), "mcnemar_a_only": float(mc.a_only),
            "mcnemar_b_only": float(mc.b_only), "mcnemar_p": mc.p_value,
            "delong_auc_diff": dl.difference, "delong_ci_low": dl_low,
            "delong_ci_high": dl_high, "delong_p": dl.p_value,
            "bootstrap_bal_acc_diff": bal, "bootstrap_ci_low": bal_low,
            "bootstrap_ci_high": bal_high, "bootstrap_auc_diff": auc,
            "bootstrap_auc_ci_low": auc_low, "bootstrap_auc_ci_high": auc_high}


def _repeated_delong(y: np.ndarray, prob_a: np.ndarray, prob_b: np.ndarray,
                     sites: np.ndarray, fold: np.ndarray) -> DeLong:
    """Return DeLong's test with (site, fold) strata, averaged over the repetitions.

    Each repetition's stratified test gives a difference and a standard error; the
    result is their means (see :func:`subject_tests`). NaN fields when no repetition has
    a stratum with two subjects of each class.
    """
    parts = []
    for r in range(fold.shape[0]):
        keep = fold[r] >= 0
        strata = np.char.add(np.char.add(sites[keep].astype(str), "/"),
                             fold[r, keep].astype(str))
        one = delong(y[keep], prob_a[r, keep], prob_b[r, keep], strata=strata)
        if math.isfinite(one.difference):
            parts.append(one)
    if not parts:
        return DeLong(math.nan, math.nan, math.nan, math.nan, math.nan)
    auc_a, auc_b, diff, se = (float(np.mean([getattr(p, f) for p in parts]))
                              for f in ("auc_a", "auc_b", "difference", "se"))
    return DeLong(auc_a, auc_b, diff, se, two_sided_p(diff, se))


def _by_repetition(comparison: Comparison, a: str, b: str, index: Mapping[str, np.ndarray]
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Return P(ASD) of a and b, the test fold, and a's and b's thresholds.

    Each is ``(repetitions, subjects)`` over ``index``. The fold is -1 where a repetition
    did not test a subject with both methods.

    Raises
    ------
    ValueError
        If a and b tested a subject in different folds of the same repetition (their
        cells do not pair).
    """
    seeds = sorted({c.seed for c in comparison.cells if c.strategy in (a, b)})
    offsets, start = {}, 0
    for site, idx in index.items():
        offsets[site] = (start, {int(i): k for k, i in enumerate(idx.tolist())})
        start += idx.size
    prob = np.zeros((2, len(seeds), start))
    cut = np.full((2, len(seeds), start), 0.5)
    fold = np.full((2, len(seeds), start), -1, dtype=np.int64)
    for c in comparison.cells:
        if c.strategy not in (a, b) or c.seed not in seeds:
            continue
        which = [k for k, name in enumerate((a, b)) if name == c.strategy]  # both if a == b
        rep = seeds.index(c.seed)
        for site, p in c.predictions.items():
            if site not in offsets:
                continue
            base, where = offsets[site]
            cols = base + np.array([where[int(i)] for i in p.index], dtype=np.int64)
            for k in which:
                prob[k, rep, cols] = p.prob
                cut[k, rep, cols] = p.threshold
                fold[k, rep, cols] = c.fold
    both = (fold[0] >= 0) & (fold[1] >= 0)
    clash = np.argwhere(both & (fold[0] != fold[1]))
    if clash.size:
        rep, col = (int(v) for v in clash[0])
        site = next(s for s, (base, where) in offsets.items()
                    if base <= col < base + len(where))
        subject = int(index[site][col - offsets[site][0]])
        raise ValueError(
            f"'{a}' and '{b}' tested subject {subject} of site {site} in different folds "
            f"of repetition (seed) {seeds[rep]}: fold {fold[0, rep, col]} and fold "
            f"{fold[1, rep, col]}. Their cells must share each (fold, seed) split.")
    return prob[0], prob[1], np.where(both, fold[0], -1), cut[0], cut[1]


def prediction_rows(comparison: Comparison) -> list[dict[str, object]]:
    """Return one row per (strategy, site, subject): the pooled out-of-fold prediction."""
    out: list[dict[str, object]] = []
    for strategy in comparison.strategies:
        for site, (index, y, prob, cut, reps) in _pooled(comparison, strategy).items():
            out += [{"strategy": strategy, "site": site, "subject": int(i),
                     "label": int(t), "prob_asd": float(p), "threshold": float(h),
                     "repetitions": reps}
                    for i, t, p, h in zip(index, y, prob, cut)]
    return out


def cell_prediction_rows(comparison: Comparison) -> list[dict[str, object]]:
    """Return one row per (strategy, fold, seed, site, subject): that run's P(ASD).

    The predictions every subject-level test is computed from, before pooling: with them
    a test can be recomputed (or a new one run) without training again. Rows follow the
    comparison's cells in order; a cell without recorded predictions adds none. Each row
    has the run's threshold at that site; numbers keep full precision (a rounded
    P(ASD) next to its threshold can change the predicted class).
    """
    return [{"strategy": c.strategy, "fold": c.fold, "seed": c.seed, "site": site,
             "subject": int(i), "label": int(t), "prob_asd": float(p),
             "threshold": float(pred.threshold)}
            for c in comparison.cells
            for site, pred in c.predictions.items()
            for i, t, p in zip(pred.index, pred.labels, pred.prob)]
