"""Per subject: each subject's pooled out-of-fold prediction, and the paired tests on them.

The runs of :func:`fedbn_med.evaluation.runner.run_cell` keep each subject's test
prediction at the selected round (:attr:`~fedbn_med.evaluation.comparison.Cell.predictions`).
Pooled over the folds and averaged over the repetitions, these give one out-of-fold
prediction per subject (:func:`pooled_predictions`), on which FedBN is tested against
each other method subject by subject (:func:`subject_tests`: McNemar on correctness,
DeLong on AUC, stratified by site) with a bootstrap over subjects stratified by site.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from fedbn_med.evaluation.paired_tests import (
    bootstrap_difference,
    bootstrap_repeated_difference,
    delong,
    mcnemar,
)

if TYPE_CHECKING:
    from fedbn_med.evaluation.comparison import Comparison

__all__ = ["pooled_predictions", "prediction_rows", "subject_tests"]


def pooled_predictions(comparison: Comparison, strategy: str, at: str = "best"
                       ) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, int]]:
    """Return each site's pooled out-of-fold predictions of one strategy.

    Returns
    -------
    dict
        ``{site: (subject index, label, P(ASD) averaged over repetitions, repetitions)}``
        over the subjects that were tested; empty when the cells kept no predictions.
    """
    if at != "best":
        raise ValueError(f"Predictions are kept at the best round only, got at={at!r}.")
    sums: dict[str, dict[int, list[float]]] = {}
    labels: dict[str, dict[int, int]] = {}
    for c in comparison.cells:
        if c.strategy != strategy:
            continue
        for site, p in c.predictions.items():
            for i, y, q in zip(p.index.tolist(), p.labels.tolist(), p.prob.tolist()):
                sums.setdefault(site, {}).setdefault(i, []).append(q)
                labels.setdefault(site, {})[i] = y
    out = {}
    for site in comparison.sites:
        if site not in sums:
            continue
        index = np.array(sorted(sums[site]), dtype=np.int64)
        y = np.array([labels[site][i] for i in index], dtype=np.int64)
        prob = np.array([np.mean(sums[site][i]) for i in index])
        reps = min(len(v) for v in sums[site].values())
        out[site] = (index, y, prob, reps)
    return out


def subject_tests(comparison: Comparison, a: str, b: str, *, n_boot: int = 2000
                  ) -> dict[str, float] | None:
    """Return the subject-level paired tests of a against b, or None without predictions.

    McNemar on correctness (threshold 0.5) and DeLong on AUC stratified by site take
    each subject's out-of-fold P(ASD) averaged over the repetitions (one prediction
    per subject). The bootstrap estimates what the cells do, the mean over
    repetitions of the site-mean balanced accuracy difference of each repetition's
    pooled out-of-fold predictions, resampling subjects within each site once per
    bootstrap for every repetition alike. The AUC bootstrap resamples subjects within
    each site too, on the repetition-averaged P(ASD), and differences the site-mean AUC
    (the tables' AUC, where DeLong's is the AUC of the sites' pooled subjects).
    """
    oa, ob = pooled_predictions(comparison, a), pooled_predictions(comparison, b)
    sites = [s for s in oa if s in ob and np.array_equal(oa[s][0], ob[s][0])]
    if not sites:
        return None
    y = np.concatenate([oa[s][1] for s in sites])
    pa = np.concatenate([oa[s][2] for s in sites])
    pb = np.concatenate([ob[s][2] for s in sites])
    strata = np.concatenate([[s] * len(oa[s][0]) for s in sites])
    truth = y == 1
    mc = mcnemar((pa >= 0.5) == truth, (pb >= 0.5) == truth)
    dl = delong(y, pa, pb, strata=strata)
    dl_low, dl_high = dl.interval()
    rep_a, rep_b, tested = _by_repetition(comparison, a, b, {s: oa[s][0] for s in sites})
    bal, bal_low, bal_high = bootstrap_repeated_difference(y, rep_a, rep_b, strata, tested,
                                                           n_boot=n_boot)
    auc, auc_low, auc_high = bootstrap_difference(y, pa, pb, strata, "auc", n_boot=n_boot)
    return {"subjects": float(y.size), "mcnemar_a_only": float(mc.a_only),
            "mcnemar_b_only": float(mc.b_only), "mcnemar_p": mc.p_value,
            "delong_auc_diff": dl.difference, "delong_ci_low": dl_low,
            "delong_ci_high": dl_high, "delong_p": dl.p_value,
            "bootstrap_bal_acc_diff": bal, "bootstrap_ci_low": bal_low,
            "bootstrap_ci_high": bal_high, "bootstrap_auc_diff": auc,
            "bootstrap_auc_ci_low": auc_low, "bootstrap_auc_ci_high": auc_high}


def _by_repetition(comparison: Comparison, a: str, b: str, index: Mapping[str, np.ndarray]
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (pred a, pred b, tested): ``(repetitions, subjects)`` over ``index``."""
    seeds = sorted({c.seed for c in comparison.cells if c.strategy in (a, b)})
    offsets, start = {}, 0
    for site, idx in index.items():
        offsets[site] = (start, {int(i): k for k, i in enumerate(idx.tolist())})
        start += idx.size
    preds = np.zeros((2, len(seeds), start), dtype=bool)
    tested = np.zeros((2, len(seeds), start), dtype=bool)
    for c in comparison.cells:
        if c.strategy not in (a, b) or c.seed not in seeds:
            continue
        which, rep = (0 if c.strategy == a else 1), seeds.index(c.seed)
        for site, p in c.predictions.items():
            if site not in offsets:
                continue
            base, where = offsets[site]
            cols = base + np.array([where[int(i)] for i in p.index], dtype=np.int64)
            preds[which, rep, cols] = p.prob >= 0.5
            tested[which, rep, cols] = True
    return preds[0], preds[1], tested[0] & tested[1]


def prediction_rows(comparison: Comparison) -> list[dict[str, object]]:
    """Return one row per (strategy, site, subject): the pooled out-of-fold prediction."""
    out: list[dict[str, object]] = []
    for strategy in comparison.strategies:
        for site, (index, y, prob, reps) in pooled_predictions(comparison, strategy).items():
            out += [{"strategy": strategy, "site": site, "subject": int(i),
                     "label": int(t), "prob_asd": round(float(p), 6), "repetitions": reps}
                    for i, t, p in zip(index, y, prob)]
    return out

