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

This module holds the :class:`Comparison` of cells with its intervals and MLflow figures,
and rebuilds one from its per-subject rows (:func:`comparison_from_predictions`); it
re-exports how one run is scored (:func:`best_round`, :func:`scores_at`, from
:mod:`fedbn_med.evaluation.selection`) and its :class:`Cell` (from
:mod:`fedbn_med.evaluation.cells`). The rest of the protocol lives beside it:

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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from fedbn_med.evaluation.cells import (
    AT,
    MAJORITY,
    METRICS,
    MOTION,
    REFERENCES,
    RIDGE_POOLED,
    RIDGE_SITE,
    Cell,
    SitePredictions,
    interval,
)
from fedbn_med.evaluation.intervals import corrected_t_interval
from fedbn_med.evaluation.pairing import paired_differences
from fedbn_med.evaluation.selection import RunningBest, best_round, scores_at

logger = logging.getLogger(__name__)

__all__ = [
    "AT", "MAJORITY", "METRICS", "MOTION", "REFERENCES", "RIDGE_POOLED", "RIDGE_SITE", "Cell",
    "Comparison", "RunningBest", "SitePredictions", "best_round", "comparison_from_predictions",
    "interval", "scores_at",
]


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


def comparison_from_predictions(rows: Iterable[Mapping[str, object]],
                                sites: Sequence[str] | None = None, *, n_folds: int = 5,
                                source: str = "rows") -> Comparison:
    """Rebuild a comparison's per-subject part from its cell prediction rows.

    The rows are :meth:`Comparison.cell_prediction_rows`' (written to a file). The cells
    hold only their predictions (no per-round scores): enough for
    :meth:`Comparison.subject_tests`, :meth:`Comparison.out_of_fold` and the subject-level
    table, which come out as they did from the runs. ``sites`` fixes the column order (default: the
    order the rows name them); ``n_folds`` is the split's; ``source`` names the rows in
    errors.

    Raises
    ------
    ValueError
        Naming ``source`` and the row (a csv reader's own line), for a missing field, a
        number that does not parse, a label other than 0/1 or that differs between runs, a
        probability outside [0, 1] or a subject listed twice in one cell, a threshold
        outside [0, 1] or two in one run at one site; and when ``sites`` are not the
        rows' sites. Rows without a ``threshold`` (files published before it was
        recorded) were predicted at 0.5.
    """
    per_cell: dict[tuple[str, int, int], dict[str, dict[int, tuple[int, float]]]] = {}
    cuts: dict[tuple[str, int, int, str], float] = {}
    order: list[str] = []
    truth: dict[tuple[str, int], int] = {}
    for count, row in enumerate(rows, start=2):  # line 1 of a file is its header
        n = getattr(rows, "line_num", count)  # a csv reader knows the file's own line
        try:
            key = (str(row["strategy"]), int(str(row["fold"])), int(str(row["seed"])))
            site, subject = str(row["site"]), int(str(row["subject"]))
            label, prob = int(str(row["label"])), float(str(row["prob_asd"]))
            cut = float(str(row.get("threshold") or 0.5))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{source}, row {n}: expected strategy, fold, seed, site, "
                             f"subject, label and prob_asd ({err})") from None
        if label not in (0, 1) or not 0.0 <= prob <= 1.0 or not 0.0 <= cut <= 1.0:
            raise ValueError(f"{source}, row {n}: label must be 0 or 1, prob_asd and "
                             f"threshold in [0, 1], got {label}, {prob} and {cut}")
        run = (key[0], key[1], key[2], site)
        if cuts.setdefault(run, cut) != cut:
            raise ValueError(f"{source}, row {n}: threshold {cut} differs from "
                             f"{cuts[run]} of the same run ({key[0]}, fold "
                             f"{key[1]}, seed {key[2]}) at site {site}")
        cell = per_cell.setdefault(key, {}).setdefault(site, {})
        if subject in cell:
            raise ValueError(f"{source}, row {n}: subject {subject} of site {site} is "
                             f"listed twice for {key[0]}, fold {key[1]}, seed {key[2]}")
        if truth.setdefault((site, subject), label) != label:
            raise ValueError(f"{source}, row {n}: subject {subject} of site {site} has label "
                             f"{label} here and {truth[(site, subject)]} in another run")
        cell[subject] = (label, prob)
        if site not in order:
            order.append(site)
    if sites is not None and set(sites) != set(order):
        raise ValueError(f"{source}: its predictions are of sites {', '.join(order)}, the "
                         f"comparison's are {', '.join(sites)}")
    comparison = Comparison(sites=tuple(sites or order), n_folds=n_folds)
    for (strategy, fold, seed), by_site in per_cell.items():
        preds = {}
        for site, subjects in by_site.items():
            index = np.array(sorted(subjects), dtype=np.int64)
            preds[site] = SitePredictions(
                index, np.array([subjects[i][0] for i in index], dtype=np.int64),
                np.array([subjects[i][1] for i in index]), cuts[(strategy, fold, seed, site)])
        comparison.add(Cell(strategy, fold, seed, 0, 0, {}, preds))
    return comparison
