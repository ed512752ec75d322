"""A comparison's cells: one run scored at its best and its last round, with its predictions.

A :class:`Cell` is one method on one (fold, seed) of the protocol
(:mod:`fedbn_med.evaluation.comparison`), scored at the round its task's selection picks
(:func:`~fedbn_med.evaluation.selection.best_round`) and at its last round; its
:class:`SitePredictions` are each site's test subjects at the selected round. The labels
of the reference rows and the metrics of every table are named here once, so that the
tables (:mod:`fedbn_med.evaluation.tables`) and the per-subject tests
(:mod:`fedbn_med.evaluation.out_of_fold`) read them without importing the comparison.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from fedbn_med.evaluation.intervals import naive_t_interval
from fedbn_med.evaluation.selection import best_round, scores_at

if TYPE_CHECKING:
    from fedbn_med.tasks import Selection

__all__ = ["AT", "MAJORITY", "METRICS", "MOTION", "REFERENCES", "RIDGE_POOLED", "RIDGE_SITE",
           "Cell", "SitePredictions", "interval"]

#: The two rounds a run is scored at.
AT = ("best", "last")
#: Scores of every table; the first two are the headline.
METRICS = ("balanced_accuracy", "auc", "accuracy")
#: The reference rows of every table.
MAJORITY = "Majority class"
MOTION = "Motion only (mean FD)"
#: Ridge on whole-series connectivity, per-site z-scores, every site's training subjects.
RIDGE_POOLED = "Ridge, pooled (site z)"
#: The same ridge fitted at each site on that site's training subjects alone.
RIDGE_SITE = "Ridge, site only (site z)"
REFERENCES = (MAJORITY, MOTION, RIDGE_POOLED, RIDGE_SITE)


def interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """Return (mean, low, high): the mean and its naive Student-t interval.

    With fewer than two finite values the bounds are NaN. For cross-validation cells,
    which share subjects, use :meth:`Comparison.difference` with ``corrected=True``.
    """
    return naive_t_interval(values, level)


@dataclass(frozen=True, eq=False)
class SitePredictions:
    """One site's test predictions in one run: subject index (in the site), label, P(ASD).

    ``threshold`` is where that run turned a P(ASD) into a predicted ASD at that site
    (0.5, or the site's own with ``threshold=site_prior``): the subject-level tests of
    accuracy and balanced accuracy predict with it.
    """

    index: np.ndarray
    labels: np.ndarray
    prob: np.ndarray
    threshold: float = 0.5

    @property
    def predicted(self) -> np.ndarray:
        """Return the predicted classes (bool, ASD True) at the run's threshold."""
        return np.asarray(self.prob) >= self.threshold


@dataclass(frozen=True)
class Cell:
    """One run of a comparison: a strategy on one (fold, seed), scored at both rounds."""

    strategy: str
    fold: int
    seed: int
    best_round: int
    last_round: int
    #: scores[at][metric][site or "mean"]
    scores: dict[str, dict[str, dict[str, float]]]
    #: each site's test predictions at the best round (empty when not recorded)
    predictions: dict[str, SitePredictions] = field(default_factory=dict)
    #: subjects (all sites) outside and inside the test fold; 0 when unknown
    n_train: int = 0
    n_test: int = 0
    reference: bool = False

    @classmethod
    def from_rows(cls, strategy: str, fold: int, seed: int,
                  rows: Sequence[Mapping[str, object]], *,
                  predictions: Mapping[str, SitePredictions] | None = None,
                  n_train: int = 0, n_test: int = 0, reference: bool = False,
                  metrics: Sequence[str] = METRICS,
                  selection: Selection | None = None) -> Cell:
        """Score a run's per-round rows at its best (validation loss) and its last round.

        ``metrics`` are the task's scores (``test_<metric>`` in the rows): by default
        :data:`METRICS`; the MRI task's are Dice. ``selection`` is the validation metric
        that picks the best round (a task's ``Task.selection``; by default the loss).
        """
        best = (best_round(rows) if selection is None
                else best_round(rows, selection.metric, lower=selection.lower))
        last = max(int(r["round"]) for r in rows)  # type: ignore[call-overload]
        scores = {at: {m: scores_at(rows, rnd, m) for m in metrics}
                  for at, rnd in (("best", best), ("last", last))}
        return cls(strategy, fold, seed, best, last, scores, dict(predictions or {}),
                   n_train, n_test, reference)
