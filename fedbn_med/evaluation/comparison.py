"""The comparison protocol: repeated, re-split cross-validation with honest intervals.

A comparison trains every strategy on every (fold, repetition) cell. A repetition's
seed derives every site's split seed (:func:`fedbn_med.tasks.abide.splits.repetition_split_seed`),
so the repetitions re-draw each site's stratified split; validation is carved from the
training part only. Every strategy of a cell sees the same splits, so they are paired.

Each run is scored at two rounds:

- ``best``: the round with the lowest mean validation loss over the sites (the earliest
  such round), chosen without looking at any test split: the run's result is that
  round's model (early stopping on validation loss);
- ``last``: the final round.

Headline metrics are balanced accuracy and AUC. Every table carries two reference rows
fitted on each site's training split of the same cell: the majority class, and a
logistic regression on mean head motion (FD) alone
(:func:`fedbn_med.evaluation.references.reference_cells`).

Intervals account for what the cells share: the corrected resampled t
(:func:`fedbn_med.evaluation.intervals.corrected_t_interval`, Nadeau-Bengio /
Bouckaert-Frank) over the cells, with the naive t beside it for the paired differences.

This module holds how one run is scored (:func:`best_round`, :func:`scores_at`), its
:class:`Cell`, and the :class:`Comparison` of cells with its intervals and MLflow
figures. The rest of the protocol lives beside it:

- :mod:`fedbn_med.evaluation.cell_data`: each site's data, split for one (fold, seed),
  with a method's own feature chain;
- :mod:`fedbn_med.evaluation.runner`: running every cell in this process
  (:func:`~fedbn_med.evaluation.runner.run_comparison`,
  :func:`~fedbn_med.evaluation.runner.compare`);
- :mod:`fedbn_med.evaluation.references`: the majority-class and motion-only rows;
- :mod:`fedbn_med.evaluation.out_of_fold`: each subject's pooled out-of-fold prediction
  and the subject-level tests of FedBN against each other method (McNemar, DeLong, a
  bootstrap over subjects stratified by site);
- :mod:`fedbn_med.evaluation.tables`: the markdown tables and the report.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from fedbn_med.evaluation.intervals import corrected_t_interval, naive_t_interval
from fedbn_med.evaluation.pairing import paired_differences
from fedbn_med.evaluation.selection import RunningBest, best_round, scores_at
from fedbn_med.tasks import Selection

logger = logging.getLogger(__name__)

__all__ = [
    "AT", "MAJORITY", "METRICS", "MOTION", "REFERENCES", "RIDGE_POOLED", "RIDGE_SITE", "Cell",
    "Comparison", "RunningBest", "SitePredictions", "best_round", "interval", "scores_at",
]

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


@dataclass
class Comparison:
    """Every cell of a comparison, with its tables and its MLflow figures.

    Parameters
    ----------
    sites : tuple of str
        Column order.
    resplit : bool
        Whether each repetition re-drew the sites' splits. Without it, the repetitions
        of a fold share its test set, so the corrected interval first averages them.
    n_folds : int
        Folds of the split: the ``n_test / n_train`` of the correction is
        ``1 / (n_folds - 1)`` unless the cells carry their subject counts.
    metric_names : tuple of str
        The scores of the tables, headline first (the cells' ``metrics``).
    """

    sites: tuple[str, ...]
    cells: list[Cell] = field(default_factory=list)
    resplit: bool = True
    n_folds: int = 5
    metric_names: tuple[str, ...] = METRICS

    def add(self, cell: Cell) -> None:
        """Add one run's cell."""
        self.cells.append(cell)

    @property
    def strategies(self) -> list[str]:
        """Return the strategies in the order they were first added, references last."""
        names = list(dict.fromkeys(c.strategy for c in self.cells))
        return ([n for n in names if n not in REFERENCES]
                + [n for n in REFERENCES if n in names])

    def values(self, strategy: str, at: str, metric: str, site: str = "mean"
               ) -> dict[tuple[int, int], float]:
        """Return ``{(fold, seed): score}`` of one strategy."""
        return {(c.fold, c.seed): c.scores[at][metric].get(site, math.nan)
                for c in self.cells if c.strategy == strategy}

    @property
    def test_train_ratio(self) -> float:
        """Return ``n_test / n_train`` of a cell, for the corrected interval."""
        known = [c.n_test / c.n_train for c in self.cells if c.n_train > 0 and c.n_test > 0]
        return float(np.mean(known)) if known else 1.0 / (self.n_folds - 1)

    def _collapse(self, values: Mapping[tuple[int, int], float]) -> list[float]:
        """Return the values the corrected interval runs over (one per independent split)."""
        if self.resplit:
            return list(values.values())
        by_fold: dict[int, list[float]] = {}
        for (fold, _), v in values.items():
            if math.isfinite(v):
                by_fold.setdefault(fold, []).append(v)
        return [float(np.mean(v)) for v in by_fold.values()]

    def corrected(self, values: Mapping[tuple[int, int], float], level: float = 0.95
                  ) -> tuple[float, float, float]:
        """Return (mean, low, high) of cell values with the corrected resampled t."""
        mean = float(np.mean([v for v in values.values() if math.isfinite(v)])) if any(
            math.isfinite(v) for v in values.values()) else math.nan
        _, low, high = corrected_t_interval(self._collapse(values), self.test_train_ratio,
                                            level)
        half = (high - low) / 2
        return mean, mean - half, mean + half

    def difference(self, a: str, b: str, at: str, metric: str = "accuracy", *,
                   corrected: bool = False) -> tuple[float, float, float, int]:
        """Return (mean, low, high, cells) of the paired difference a - b.

        Runs pair by their (fold, seed) cell
        (:func:`fedbn_med.evaluation.pairing.paired_differences`); a cell only one side
        ran is left out.
        ``corrected=False`` gives the naive t-interval over the cells, ``True`` the
        corrected resampled t, which accounts for the subjects the cells share.
        """
        diffs = paired_differences(self.values(a, at, metric), self.values(b, at, metric),
                                   require_same=False)
        if corrected:
            return (*self.corrected(diffs), len(diffs))
        return (*interval(list(diffs.values())), len(diffs))

    def pairs(self) -> list[tuple[str, str]]:
        """Return the differences reported: FedBN against every other method run."""
        names = {s.lower(): s for s in self.strategies}
        fedbn = names.get("fedbn")
        if fedbn is None:
            return []
        return [(fedbn, other) for other in self.strategies if other != fedbn]

    # -- per subject (fedbn_med.evaluation.out_of_fold) ----------------------------------
    def out_of_fold(self, strategy: str, at: str = "best"
                    ) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, int]]:
        """Return each site's pooled out-of-fold predictions of one strategy.

        ``{site: (subject index, label, P(ASD) averaged over repetitions, repetitions)}``
        (:func:`fedbn_med.evaluation.out_of_fold.pooled_predictions`).
        """
        from fedbn_med.evaluation.out_of_fold import pooled_predictions

        return pooled_predictions(self, strategy, at)

    def subject_tests(self, a: str, b: str, *, n_boot: int = 2000
                      ) -> dict[str, float] | None:
        """Return the subject-level paired tests of a against b, or None without predictions.

        See :func:`fedbn_med.evaluation.out_of_fold.subject_tests`.
        """
        from fedbn_med.evaluation.out_of_fold import subject_tests

        return subject_tests(self, a, b, n_boot=n_boot)

    def prediction_rows(self) -> list[dict[str, object]]:
        """Return one row per (strategy, site, subject): the pooled out-of-fold prediction."""
        from fedbn_med.evaluation.out_of_fold import prediction_rows

        return prediction_rows(self)

    def cell_prediction_rows(self) -> list[dict[str, object]]:
        """Return one row per (strategy, fold, seed, site, subject): that run's P(ASD)."""
        from fedbn_med.evaluation.out_of_fold import cell_prediction_rows

        return cell_prediction_rows(self)

    # -- text (fedbn_med.evaluation.tables) -----------------------------------------------
    def table(self, at: str, metric: str = "balanced_accuracy") -> str:
        """Return a markdown table: per site and mean, mean [corrected 95 % CI], in %."""
        from fedbn_med.evaluation.tables import score_table

        return score_table(self, at, metric)

    def difference_table(self) -> str:
        """Return a markdown table of the paired differences, naive and corrected, in pp."""
        from fedbn_med.evaluation.tables import difference_table

        return difference_table(self)

    def subject_table(self, n_boot: int = 2000) -> str:
        """Return the subject-level paired tests of FedBN against each method (markdown)."""
        from fedbn_med.evaluation.tables import subject_table

        return subject_table(self, n_boot)

    def report(self) -> str:
        """Return every table of the comparison, with how it was made."""
        from fedbn_med.evaluation.tables import report

        return report(self)

    # -- figures -------------------------------------------------------------------------
    def metrics(self) -> dict[str, float]:
        """Return the comparison's figures as flat MLflow metrics."""
        out: dict[str, float] = {}
        for strategy in self.strategies:
            key = _metric_name(strategy)
            for metric in self.metric_names:
                for at in AT:
                    mean, low, high = self.corrected(self.values(strategy, at, metric))
                    out.update({f"{key}.{metric}.{at}": mean, f"{key}.{metric}.{at}.ci_low": low,
                                f"{key}.{metric}.{at}.ci_high": high})
        for a, b in self.pairs():
            key = f"{_metric_name(a)}_minus_{_metric_name(b)}"
            for metric in self.metric_names:
                for at in AT:
                    mean, low, high, _ = self.difference(a, b, at, metric)
                    _, c_low, c_high, _ = self.difference(a, b, at, metric, corrected=True)
                    out.update({f"{key}.{metric}.{at}": mean,
                                f"{key}.{metric}.{at}.ci_low": low,
                                f"{key}.{metric}.{at}.ci_high": high,
                                f"{key}.{metric}.{at}.corrected_ci_low": c_low,
                                f"{key}.{metric}.{at}.corrected_ci_high": c_high})
        return {k: v for k, v in out.items() if math.isfinite(v)}

    def rows(self) -> list[dict[str, object]]:
        """Return one flat row per cell (for a CSV)."""
        return [{"strategy": c.strategy, "fold": c.fold, "seed": c.seed,
                 "best_round": c.best_round, "last_round": c.last_round,
                 **{f"{metric}_{at}_{site}": round(value, 6)
                    for at in AT for metric in self.metric_names
                    for site, value in c.scores[at][metric].items()}}
                for c in self.cells]


def _metric_name(label: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in label)

