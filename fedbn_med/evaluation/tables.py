"""The text of a comparison: its markdown tables, its report, and the ``mean [CI]`` format.

Every markdown table of the package and of the benchmarks is drawn by
:func:`markdown_table`.

Scores are in % and differences in percentage points; every interval of a score table is
the corrected one (:meth:`fedbn_med.evaluation.comparison.Comparison.corrected`), the
difference table shows the naive one beside it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from fedbn_med.evaluation.cells import AT, MAJORITY, MOTION, RIDGE_POOLED, RIDGE_SITE, interval

if TYPE_CHECKING:
    from fedbn_med.evaluation.comparison import Comparison

__all__ = ["difference_table", "format_interval", "format_stats", "markdown_table", "report",
           "score_table", "subject_table"]

_NAMES = {"balanced_accuracy": "balanced accuracy", "auc": "AUC", "accuracy": "accuracy"}


def score_table(comparison: Comparison, at: str, metric: str = "balanced_accuracy") -> str:
    """Return a markdown table: per site and mean, mean [corrected 95 % CI], in %."""
    columns = (*comparison.sites, "mean")
    return markdown_table(
        ["method", *columns],
        ([strategy, *[format_stats(*comparison.corrected(
            comparison.values(strategy, at, metric, site))) for site in columns]]
         for strategy in comparison.strategies))


def difference_table(comparison: Comparison) -> str:
    """Return a markdown table of the paired differences, naive and corrected, in pp."""
    header = ["difference", "metric", "at", "mean (pp)", "naive 95 % CI (pp)",
              "corrected 95 % CI (pp)", "cells"]
    body = []
    for a, b in comparison.pairs():
        for metric in comparison.metric_names:
            for at in AT:
                mean, low, high, n = comparison.difference(a, b, at, metric)
                _, c_low, c_high, _ = comparison.difference(a, b, at, metric, corrected=True)
                if not math.isfinite(mean):
                    continue
                body.append([f"{a} - {b}", metric, at, f"{100 * mean:+.1f}",
                             _interval_text(low, high), _interval_text(c_low, c_high), n])
    return markdown_table(header, body)


def subject_table(comparison: Comparison, n_boot: int = 2000) -> str:
    """Return the subject-level paired tests of FedBN against each method (markdown)."""
    header = ["difference", "subjects", "McNemar: only A / only B right, p",
              "DeLong AUC diff (pp) [95 % CI], p", "bootstrap AUC diff (pp) [95 % CI]",
              "bootstrap balanced acc diff (pp) [95 % CI]"]
    body = []
    for a, b in comparison.pairs():
        t = comparison.subject_tests(a, b, n_boot=n_boot)
        if t is None:
            continue
        auc = format_stats(t["delong_auc_diff"], t["delong_ci_low"], t["delong_ci_high"],
                           signed=True)
        boot_auc = format_stats(t["bootstrap_auc_diff"], t["bootstrap_auc_ci_low"],
                                t["bootstrap_auc_ci_high"], signed=True)
        bal = format_stats(t["bootstrap_bal_acc_diff"], t["bootstrap_ci_low"],
                           t["bootstrap_ci_high"], signed=True)
        body.append([f"{a} - {b}", int(t["subjects"]),
                     f"{int(t['mcnemar_a_only'])} / {int(t['mcnemar_b_only'])}, "
                     f"p = {t['mcnemar_p']:.3f}", f"{auc}, p = {t['delong_p']:.3f}",
                     boot_auc, bal])
    return markdown_table(header, body) if body else ""


def report(comparison: Comparison) -> str:
    """Return every table of the comparison, with how it was made."""
    folds = sorted({c.fold for c in comparison.cells})
    seeds = sorted({c.seed for c in comparison.cells})
    how = ("each repetition re-draws every site's split" if comparison.resplit else
           "the repetitions share each fold's split")
    parts = [(f"{len(folds)} fold(s) x {len(seeds)} repetition(s) = "
              f"{len(folds) * len(seeds)} cells per method ({how}); each run's result "
              "is its round with the lowest mean validation loss. Each cell in %: mean "
              "[95 % CI] over the cells, corrected for the subjects the cells share "
              f"(Nadeau-Bengio, n_test/n_train = {comparison.test_train_ratio:.3f})."
              + (f" '{MAJORITY}' and '{MOTION}' are fitted on each site's training split;"
                 f" '{RIDGE_POOLED}' and '{RIDGE_SITE}' are ridge regressions on whole-series"
                 " connectivity z-scored per site, fitted on every subject outside the test"
                 " fold (every site's, or the site's own), the penalty chosen by"
                 " leave-one-out among them."
                 if any(c.reference for c in comparison.cells) else ""))]
    for metric in comparison.metric_names:
        parts.append(f"Test {_NAMES.get(metric, metric)} at the best-validation round:"
                     f"\n\n{score_table(comparison, 'best', metric)}")
    head = comparison.metric_names[0]
    parts.append(f"Test {_NAMES.get(head, head)} at the last round:\n\n"
                 f"{score_table(comparison, 'last', head)}")
    if comparison.pairs():
        parts.append("Paired differences of the site-mean test scores, cell by cell:"
                     "\n\n" + difference_table(comparison))
        subjects = subject_table(comparison)
        if subjects:
            parts.append("Subject-level paired tests on the out-of-fold predictions "
                         "(McNemar: each subject's P(ASD) averaged over the repetitions; "
                         "DeLong and the AUC bootstrap rank each subject only among its "
                         "own site's test fold, one model's scores, in each repetition; "
                         "both bootstraps resample subjects within sites and difference "
                         "the cells' site-mean score):\n\n"
                         + subjects)
        elif any(c.reference for c in comparison.cells):  # ABIDE: say why they are absent
            parts.append("No subject-level tests: no run kept its test subjects' "
                         "predictions (over Flower they stay at each site). "
                         "`--compare --engine inprocess` keeps them on one machine, and "
                         "so do the benchmarks.")
    rounds = [c.best_round for c in comparison.cells if not c.reference]
    if rounds:
        last = next(c.last_round for c in comparison.cells if not c.reference)
        parts.append(f"Best-validation rounds: median {int(np.median(rounds))}, range "
                     f"{min(rounds)} to {max(rounds)} (last round {last}).")
    return "\n\n".join(parts)


def markdown_table(header: Sequence[object], rows: Iterable[Sequence[object]]) -> str:
    """Return a markdown table: the header, its rule and one line per row (cells as ``str``)."""
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    return "\n".join(lines)


def _interval_text(low: float, high: float) -> str:
    if not (math.isfinite(low) and math.isfinite(high)):
        return "n/a (one cell)"
    return f"[{100 * low:+.1f}, {100 * high:+.1f}]"


def format_stats(mean: float, low: float, high: float, *, scale: float = 100.0,
                 digits: int = 1, signed: bool = False,
                 bounds: tuple[float, float] | None | str = "rate") -> str:
    """Format ``mean [low, high]`` (times ``scale``: percent by default).

    Without bounds (one value) only the mean is written; without a mean, ``n/a``.
    A t-interval is symmetric and, with few cells, can reach past what the figure can
    be; its bounds are clipped to ``bounds`` (unscaled). The default ``"rate"`` means
    [0, 1] for a rate and [-1, 1] for a difference of rates (``signed``) when ``scale``
    is 100, and no clipping otherwise; None never clips.
    """
    if not math.isfinite(mean):
        return "n/a"
    if bounds == "rate":
        bounds = ((-1.0, 1.0) if signed else (0.0, 1.0)) if scale == 100.0 else None
    if isinstance(bounds, tuple):
        low, high = max(low, bounds[0]), min(high, bounds[1])
    spec = f"{'+' if signed else ''}.{digits}f"
    if not (math.isfinite(low) and math.isfinite(high)):
        return f"{scale * mean:{spec}}"
    return f"{scale * mean:{spec}} [{scale * low:{spec}}, {scale * high:{spec}}]"


def format_interval(values: Sequence[float], **options: object) -> str:
    """Format the mean of ``values`` and its naive 95 % interval (:func:`format_stats`)."""
    return format_stats(*interval(values), **options)  # type: ignore[arg-type]

