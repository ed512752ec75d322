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
logistic regression on mean head motion (FD) alone (:func:`reference_cells`).

Intervals account for what the cells share: the corrected resampled t
(:func:`fedbn_med.evaluation.stats.corrected_t_interval`, Nadeau-Bengio / Bouckaert-Frank) over
the cells, with the naive t beside it for the paired differences. The runs of
:func:`run_cell` also keep each subject's test prediction at the selected round; pooled
over the folds and averaged over the repetitions, these give one out-of-fold prediction
per subject, on which FedBN is tested against each other method subject by subject
(McNemar on correctness, DeLong on AUC, stratified by site) with a bootstrap over
subjects stratified by site.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedbn_med.evaluation.stats import (
    bootstrap_repeated_difference,
    corrected_t_interval,
    delong,
    mcnemar,
    naive_t_interval,
)

if TYPE_CHECKING:
    from fedbn_med.spec import RunSpec
    from fedbn_med.tasks.abide.sites import SiteConfig
    from fedbn_med.tasks.abide.splits import Split
    from fedbn_med.training.trainer import SiteData

__all__ = [
    "AT", "MAJORITY", "METRICS", "MOTION", "Cell", "Comparison", "PreparedSite",
    "SitePredictions", "add_reference_rows", "best_round", "compare", "format_interval",
    "format_stats", "interval", "prepare_sites", "reference_cells", "run_cell", "run_comparison",
    "scores_at",
]

logger = logging.getLogger(__name__)

#: The two rounds a run is scored at.
AT = ("best", "last")
#: Scores of every table; the first two are the headline.
METRICS = ("balanced_accuracy", "auc", "accuracy")
_METRICS = METRICS
#: The reference rows of every table.
MAJORITY = "Majority class"
MOTION = "Motion only (mean FD)"
REFERENCES = (MAJORITY, MOTION)
_NAMES = {"balanced_accuracy": "balanced accuracy", "auc": "AUC", "accuracy": "accuracy"}


def _site_rows(rows: Iterable[Mapping[str, object]], rnd: int) -> dict[str, Mapping]:
    return {str(r["site"]): r for r in rows if int(r["round"]) == rnd}  # type: ignore[call-overload]


def _mean_over_sites(rows: Iterable[Mapping[str, object]], rnd: int, key: str) -> float:
    values = [float(r[key]) for r in _site_rows(rows, rnd).values()
              if key in r and math.isfinite(float(r[key]))]
    return float(np.mean(values)) if values else math.nan


def best_round(rows: Sequence[Mapping[str, object]], metric: str = "loss") -> int:
    """Return the round with the best mean validation ``metric`` over the sites.

    ``loss`` is best when lowest, any other metric when highest; ties go to the earliest
    round. Rows without a validation loss fall back to the validation accuracy; a run
    without validation scores (no site has a validation split) to its last round.
    """
    rounds = sorted({int(r["round"]) for r in rows})  # type: ignore[call-overload]
    if not rounds:
        raise ValueError("A run with no rounds has no best round.")
    sign = -1.0 if metric == "loss" else 1.0
    best, best_value = rounds[-1], -math.inf
    for rnd in rounds:
        value = sign * _mean_over_sites(rows, rnd, f"val_{metric}")
        if math.isfinite(value) and value > best_value:
            best, best_value = rnd, value
    if metric == "loss" and best_value == -math.inf:
        return best_round(rows, "accuracy")
    return best


def scores_at(rows: Sequence[Mapping[str, object]], rnd: int, metric: str
              ) -> dict[str, float]:
    """Return each site's test ``metric`` at round ``rnd``, and their ``"mean"``."""
    per_site = {site: float(r[f"test_{metric}"])
                for site, r in _site_rows(rows, rnd).items() if f"test_{metric}" in r}
    finite = [v for v in per_site.values() if math.isfinite(v)]
    return {**per_site, "mean": float(np.mean(finite)) if finite else math.nan}


def interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """Return (mean, low, high): the mean and its naive Student-t interval.

    With fewer than two finite values the bounds are NaN. For cross-validation cells,
    which share subjects, use :meth:`Comparison.difference` with ``corrected=True``.
    """
    return naive_t_interval(values, level)


@dataclass(frozen=True, eq=False)
class SitePredictions:
    """One site's test predictions in one run: subject index (in the site), label, P(ASD)."""

    index: np.ndarray
    labels: np.ndarray
    prob: np.ndarray


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
                  metrics: Sequence[str] = METRICS) -> Cell:
        """Score a run's per-round rows at its best (validation loss) and its last round.

        ``metrics`` are the task's scores (``test_<metric>`` in the rows): by default
        :data:`METRICS`; the MRI task's are Dice.
        """
        best = best_round(rows)
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

        ``corrected=False`` gives the naive t-interval over the cells, ``True`` the
        corrected resampled t, which accounts for the subjects the cells share.
        """
        va, vb = self.values(a, at, metric), self.values(b, at, metric)
        diffs = {k: va[k] - vb[k] for k in va if k in vb}
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

    # -- per subject ---------------------------------------------------------------------
    def out_of_fold(self, strategy: str, at: str = "best"
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
        for c in self.cells:
            if c.strategy != strategy:
                continue
            for site, p in c.predictions.items():
                for i, y, q in zip(p.index.tolist(), p.labels.tolist(), p.prob.tolist()):
                    sums.setdefault(site, {}).setdefault(i, []).append(q)
                    labels.setdefault(site, {})[i] = y
        out = {}
        for site in self.sites:
            if site not in sums:
                continue
            index = np.array(sorted(sums[site]), dtype=np.int64)
            y = np.array([labels[site][i] for i in index], dtype=np.int64)
            prob = np.array([np.mean(sums[site][i]) for i in index])
            reps = min(len(v) for v in sums[site].values())
            out[site] = (index, y, prob, reps)
        return out

    def subject_tests(self, a: str, b: str, *, n_boot: int = 2000
                      ) -> dict[str, float] | None:
        """Return the subject-level paired tests of a against b, or None without predictions.

        McNemar on correctness (threshold 0.5) and DeLong on AUC stratified by site take
        each subject's out-of-fold P(ASD) averaged over the repetitions (one prediction
        per subject). The bootstrap estimates what the cells do, the mean over
        repetitions of the site-mean balanced accuracy difference of each repetition's
        pooled out-of-fold predictions, resampling subjects within each site once per
        bootstrap for every repetition alike.
        """
        oa, ob = self.out_of_fold(a), self.out_of_fold(b)
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
        rep_a, rep_b, tested = self._by_repetition(a, b, {s: oa[s][0] for s in sites})
        bal, bal_low, bal_high = bootstrap_repeated_difference(y, rep_a, rep_b, strata, tested,
                                                               n_boot=n_boot)
        return {"subjects": float(y.size), "mcnemar_a_only": float(mc.a_only),
                "mcnemar_b_only": float(mc.b_only), "mcnemar_p": mc.p_value,
                "delong_auc_diff": dl.difference, "delong_ci_low": dl_low,
                "delong_ci_high": dl_high, "delong_p": dl.p_value,
                "bootstrap_bal_acc_diff": bal, "bootstrap_ci_low": bal_low,
                "bootstrap_ci_high": bal_high}

    def _by_repetition(self, a: str, b: str, index: Mapping[str, np.ndarray]
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Return (pred a, pred b, tested): ``(repetitions, subjects)`` over ``index``."""
        seeds = sorted({c.seed for c in self.cells if c.strategy in (a, b)})
        offsets, start = {}, 0
        for site, idx in index.items():
            offsets[site] = (start, {int(i): k for k, i in enumerate(idx.tolist())})
            start += idx.size
        preds = np.zeros((2, len(seeds), start), dtype=bool)
        tested = np.zeros((2, len(seeds), start), dtype=bool)
        for c in self.cells:
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

    # -- tables --------------------------------------------------------------------------
    def table(self, at: str, metric: str = "balanced_accuracy") -> str:
        """Return a markdown table: per site and mean, mean [corrected 95 % CI], in %."""
        header = ["method", *self.sites, "mean"]
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for strategy in self.strategies:
            row = [strategy]
            for site in (*self.sites, "mean"):
                row.append(format_stats(*self.corrected(self.values(strategy, at, metric,
                                                                    site))))
            lines.append("| " + " | ".join(row) + " |")
        return "\n".join(lines)

    def difference_table(self) -> str:
        """Return a markdown table of the paired differences, naive and corrected, in pp."""
        lines = ["| difference | metric | at | mean (pp) | naive 95 % CI (pp) | "
                 "corrected 95 % CI (pp) | cells |", "|---|---|---|---|---|---|---|"]
        for a, b in self.pairs():
            for metric in self.metric_names:
                for at in AT:
                    mean, low, high, n = self.difference(a, b, at, metric)
                    _, c_low, c_high, _ = self.difference(a, b, at, metric, corrected=True)
                    if not math.isfinite(mean):
                        continue
                    lines.append(f"| {a} - {b} | {metric} | {at} | {100 * mean:+.1f} | "
                                 f"{_interval_text(low, high)} | "
                                 f"{_interval_text(c_low, c_high)} | {n} |")
        return "\n".join(lines)

    def subject_table(self, n_boot: int = 2000) -> str:
        """Return the subject-level paired tests of FedBN against each method (markdown)."""
        lines = ["| difference | subjects | McNemar: only A / only B right, p | "
                 "DeLong AUC diff (pp) [95 % CI], p | bootstrap balanced acc diff (pp) "
                 "[95 % CI] |", "|---|---|---|---|---|"]
        any_row = False
        for a, b in self.pairs():
            t = self.subject_tests(a, b, n_boot=n_boot)
            if t is None:
                continue
            any_row = True
            auc = format_stats(t["delong_auc_diff"], t["delong_ci_low"], t["delong_ci_high"],
                               signed=True)
            bal = format_stats(t["bootstrap_bal_acc_diff"], t["bootstrap_ci_low"],
                               t["bootstrap_ci_high"], signed=True)
            lines.append(
                f"| {a} - {b} | {int(t['subjects'])} | {int(t['mcnemar_a_only'])} / "
                f"{int(t['mcnemar_b_only'])}, p = {t['mcnemar_p']:.3f} | {auc}, "
                f"p = {t['delong_p']:.3f} | {bal} |")
        return "\n".join(lines) if any_row else ""

    def report(self) -> str:
        """Return every table of the comparison, with how it was made."""
        folds = sorted({c.fold for c in self.cells})
        seeds = sorted({c.seed for c in self.cells})
        how = ("each repetition re-draws every site's split" if self.resplit else
               "the repetitions share each fold's split")
        parts = [(f"{len(folds)} fold(s) x {len(seeds)} repetition(s) = "
                  f"{len(folds) * len(seeds)} cells per method ({how}); each run's result "
                  "is its round with the lowest mean validation loss. Each cell in %: mean "
                  "[95 % CI] over the cells, corrected for the subjects the cells share "
                  f"(Nadeau-Bengio, n_test/n_train = {self.test_train_ratio:.3f})."
                  + (f" '{MAJORITY}' and '{MOTION}' are fitted on each site's training split."
                     if any(c.reference for c in self.cells) else ""))]
        for metric in self.metric_names:
            parts.append(f"Test {_NAMES.get(metric, metric)} at the best-validation round:"
                         f"\n\n{self.table('best', metric)}")
        head = self.metric_names[0]
        parts.append(f"Test {_NAMES.get(head, head)} at the last round:\n\n"
                     f"{self.table('last', head)}")
        if self.pairs():
            parts.append("Paired differences of the site-mean test scores, cell by cell:"
                         "\n\n" + self.difference_table())
            subjects = self.subject_table()
            if subjects:
                parts.append("Subject-level paired tests on the pooled out-of-fold "
                             "predictions (McNemar and DeLong: each subject's P(ASD) "
                             "averaged over the repetitions; bootstrap: each repetition's "
                             "predictions, subjects resampled within sites):\n\n"
                             + subjects)
        rounds = [c.best_round for c in self.cells if not c.reference]
        if rounds:
            last = next(c.last_round for c in self.cells if not c.reference)
            parts.append(f"Best-validation rounds: median {int(np.median(rounds))}, range "
                         f"{min(rounds)} to {max(rounds)} (last round {last}).")
        return "\n\n".join(parts)

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

    def prediction_rows(self) -> list[dict[str, object]]:
        """Return one row per (strategy, site, subject): the pooled out-of-fold prediction."""
        out: list[dict[str, object]] = []
        for strategy in self.strategies:
            for site, (index, y, prob, reps) in self.out_of_fold(strategy).items():
                out += [{"strategy": strategy, "site": site, "subject": int(i),
                         "label": int(t), "prob_asd": round(float(p), 6), "repetitions": reps}
                        for i, t, p in zip(index, y, prob)]
        return out


def _metric_name(label: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in label)


def _interval_text(low: float, high: float) -> str:
    if not (math.isfinite(low) and math.isfinite(high)):
        return "n/a (one cell)"
    return f"[{100 * low:+.1f}, {100 * high:+.1f}]"


def format_stats(mean: float, low: float, high: float, *, scale: float = 100.0,
                 digits: int = 1, signed: bool = False) -> str:
    """Format ``mean [low, high]`` (times ``scale``: percent by default).

    Without bounds (one value) only the mean is written; without a mean, ``n/a``.
    """
    if not math.isfinite(mean):
        return "n/a"
    spec = f"{'+' if signed else ''}.{digits}f"
    if not (math.isfinite(low) and math.isfinite(high)):
        return f"{scale * mean:{spec}}"
    return f"{scale * mean:{spec}} [{scale * low:{spec}}, {scale * high:{spec}}]"


def format_interval(values: Sequence[float], **options: object) -> str:
    """Format the mean of ``values`` and its naive 95 % interval (:func:`format_stats`)."""
    return format_stats(*interval(values), **options)  # type: ignore[arg-type]


# -- reference rows ----------------------------------------------------------------------
def _scored_rows(site: str, labels: np.ndarray, prob: np.ndarray) -> dict[str, object]:
    from fedbn_med.evaluation.metrics import classification_metrics

    eps = 1e-7
    p = np.clip(prob, eps, 1 - eps)
    loss = float(-np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p)))
    scores = classification_metrics(labels, prob, loss)
    return {"round": 0, "site": site, **{f"test_{k}": v for k, v in scores.items()}}


def _motion_scores(fd: np.ndarray, y: np.ndarray, train: np.ndarray, test: np.ndarray
                   ) -> np.ndarray:
    """Return P(ASD) of the test subjects from a logistic regression on mean FD."""
    from sklearn.linear_model import LogisticRegression

    prevalence = float(np.mean(y[train]))
    known = train[np.isfinite(fd[train])]
    if known.size < 4 or np.unique(y[known]).size < 2:
        return np.full(test.size, prevalence)
    fill = float(np.median(fd[known]))
    x_train = np.where(np.isfinite(fd[train]), fd[train], fill)
    x_test = np.where(np.isfinite(fd[test]), fd[test], fill)
    center, scale = float(x_train.mean()), float(x_train.std()) or 1.0
    model = LogisticRegression().fit(((x_train - center) / scale)[:, None], y[train])
    return model.predict_proba(((x_test - center) / scale)[:, None])[:, 1]


def reference_cells(fold: int, seed: int, sites: Mapping[str, PreparedSite]) -> list[Cell]:
    """Return the majority-class and the motion-only cells of one (fold, seed).

    Both are fitted per site on that site's training split: the majority class scores
    every test subject with the training share of ASD (so it predicts the training
    majority, balanced accuracy 0.5, AUC 0.5); the motion-only row is a logistic
    regression of the diagnosis on mean framewise displacement (missing FD imputed by
    the training median; a site without FD gets the majority row's scores).
    """
    cells = []
    for name in REFERENCES:
        rows, preds = [], {}
        for site, s in sites.items():
            train, test, y = s.split.train, s.split.test, s.labels
            if name == MAJORITY:
                prob = np.full(test.size, float(np.mean(y[train])))
            else:
                prob = _motion_scores(s.mean_fd, y, train, test)
            rows.append(_scored_rows(site, y[test], prob))
            preds[site] = SitePredictions(test.copy(), y[test].copy(), prob)
        n_train = sum(s.split.train.size + s.split.val.size for s in sites.values())
        n_test = sum(s.split.test.size for s in sites.values())
        cells.append(Cell.from_rows(name, fold, seed, rows, predictions=preds,
                                    n_train=n_train, n_test=n_test, reference=True))
    return cells


def add_reference_rows(comparison: Comparison, spec: RunSpec,
                       cells: Iterable[tuple[int, int]]) -> None:
    """Add the majority-class and motion-only cells of every (fold, seed) to a comparison.

    For comparisons whose runs happened elsewhere (over Flower): the splits are drawn
    here exactly as every site draws them, from the same data.
    """
    for fold, seed in cells:
        prepared = prepare_sites(spec.replace(fold=fold, seed=seed))
        for cell in reference_cells(fold, seed, prepared):
            comparison.add(cell)


# -- running ---------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class PreparedSite:
    """One site's data for one (fold, seed): its tensors, split, labels and mean FD."""

    data: SiteData
    split: Split
    labels: np.ndarray
    mean_fd: np.ndarray


def prepare_sites(spec: RunSpec, sites: Mapping[str, SiteConfig] | None = None
                  ) -> dict[str, PreparedSite]:
    """Load every site of ``spec`` and split it for the spec's fold and repetition seed."""
    import torch

    from fedbn_med.tasks.abide.build import resolve_site_data_dir
    from fedbn_med.tasks.abide.data import load_site_features
    from fedbn_med.tasks.abide.sites import load_sites
    from fedbn_med.tasks.abide.splits import repetition_split_seed, site_splits
    from fedbn_med.training.trainer import SiteData

    sites = sites or load_sites(list(spec.sites))
    out = {}
    for name, site in sites.items():
        feats = load_site_features(resolve_site_data_dir(site, spec), site.abide_site_ids,
                                   name=site.name)
        split = site_splits(feats.labels, n_folds=spec.n_folds, fold=spec.fold,
                            seed=repetition_split_seed(site.split_seed, spec.seed))
        x = torch.tensor(np.asarray(feats.features), dtype=torch.float32)
        y = torch.tensor(np.asarray(feats.labels), dtype=torch.int64)

        def part(idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
            index = torch.as_tensor(np.array(idx, dtype=np.int64))
            return x[index], y[index]  # noqa: B023 - used within this iteration

        data = SiteData(train=part(split.train), val=part(split.val), test=part(split.test))
        out[name] = PreparedSite(data, split, np.asarray(feats.labels),
                                 np.asarray(feats.mean_fd, dtype=np.float64))
    return out


class _BestRoundKeeper:
    """Keep each site's test predictions at the round of lowest mean validation loss."""

    def __init__(self, trainers: Mapping[str, Any], prepared: Mapping[str, PreparedSite]
                 ) -> None:
        self.trainers = trainers
        self.prepared = prepared
        self.best_value = math.inf
        self.best = 0
        self.predictions: dict[str, SitePredictions] = {}

    def __call__(self, rnd: int, metrics: Mapping[str, Mapping[str, float]]) -> None:
        losses = [float(m["val_loss"]) for m in metrics.values()
                  if "val_loss" in m and math.isfinite(float(m["val_loss"]))]
        value = float(np.mean(losses)) if losses else math.inf
        # as best_round: the lowest finite loss, the earliest on ties; none: the last round
        if math.isfinite(self.best_value) and not value < self.best_value:
            return
        self.best, self.best_value = rnd, value
        for site, trainer in self.trainers.items():
            s = self.prepared[site]
            prob = trainer.predict(s.data.test[0]).numpy().astype(np.float64)
            groups = s.data.test_groups
            if groups is not None:  # windows: a subject's P(ASD) is its windows' mean
                of = groups.numpy()
                prob = np.array([prob[of == i].mean() for i in s.split.test])
            self.predictions[site] = SitePredictions(s.split.test.copy(),
                                                     s.labels[s.split.test].copy(), prob)


def _with_features(spec: RunSpec, prepared: Mapping[str, PreparedSite],
                   sites: Mapping[str, SiteConfig]) -> Mapping[str, PreparedSite]:
    """Return the sites' data with the spec's feature chain applied, when it has one.

    :func:`prepare_sites` gives whole-series features, which every method of a cell and
    the reference rows share. A method whose strategy or settings transform them (per-site
    z, ComBat, FD regression, sliding windows) gets its rows built as a run of it builds
    them (:func:`fedbn_med.tasks.abide.build.prepare_site_data`, fitted on the training
    rows only), on the same split.
    """
    from fedbn_med.tasks.abide.build import feature_transform, prepare_site_data

    settings = spec.settings
    if not (getattr(settings, "windows", 0) or getattr(settings, "fd_regression", False)
            or feature_transform(spec) != "none"):
        return prepared
    return {name: dataclasses.replace(p, data=prepare_site_data(sites[name], spec))
            for name, p in prepared.items()}


def run_cell(spec: RunSpec, label: str | None = None,
             prepared: Mapping[str, PreparedSite] | None = None,
             sites: Mapping[str, SiteConfig] | None = None) -> Cell:
    """Run one federation in this process and return its cell with per-subject predictions.

    Parameters
    ----------
    spec : RunSpec
        The run (its ``fold`` and ``seed`` pick the cell; the seed also re-draws splits).
    label : str, optional
        The method's name in the tables (default: the strategy's label).
    prepared : mapping, optional
        The sites' data from :func:`prepare_sites` for this spec (built when omitted).
    sites : mapping of site name to SiteConfig, optional
        Loaded from ``sites/`` when omitted.
    """
    from fedbn_med.tasks.abide.build import build_pooled, build_trainer
    from fedbn_med.tasks.abide.sites import load_sites
    from fedbn_med.training.inprocess import run_in_process

    sites = sites or load_sites(list(spec.sites))
    prepared = _with_features(spec, prepared or prepare_sites(spec, sites), sites)
    trainers = {name: build_trainer(sites[name], spec, prepared[name].data) for name in sites}
    strategy = spec.strategy_obj()
    pooled = build_pooled(trainers, spec) if strategy.pooled else None
    keeper = _BestRoundKeeper(trainers, prepared)
    history = run_in_process(trainers, strategy, spec.rounds, pooled=pooled,
                             weighting=spec.weighting, on_round=keeper)
    cell = Cell.from_rows(
        label or spec.label, spec.fold, spec.seed, history.rows,
        predictions=keeper.predictions,
        n_train=sum(p.split.train.size + p.split.val.size for p in prepared.values()),
        n_test=sum(p.split.test.size for p in prepared.values()))
    if cell.best_round != keeper.best:  # only when no validation loss is finite
        logger.warning("%s fold %d seed %d: predictions kept at round %d, the rows' best "
                       "round is %d.", cell.strategy, spec.fold, spec.seed, keeper.best,
                       cell.best_round)
    return cell


def run_comparison(specs: Mapping[str, RunSpec], folds: Iterable[int],
                   seeds: Iterable[int], *, progress: bool = False,
                   split_seed: int | None = None) -> Comparison:
    """Run every method on every (fold, seed) cell, with the reference rows.

    Parameters
    ----------
    specs : mapping of label to RunSpec
        One spec per method (its fold and seed are replaced cell by cell); all must
        name the same sites and data.
    folds, seeds : iterables of int
        The test folds and the repetition seeds.
    progress : bool
        Show a progress bar over the runs.
    split_seed : int, optional
        Draw every cell's splits as repetition ``split_seed`` does, whatever the cell's
        seed: the seeds then re-initialise the models only, on fixed splits (the design
        this protocol replaces, kept to measure what it got wrong). The comparison is
        marked ``resplit=False``.
    """
    from tqdm.auto import tqdm

    from fedbn_med.tasks.abide.sites import load_sites

    if not specs:
        raise ValueError("A comparison needs at least one method; none was given.")
    first = next(iter(specs.values()))
    for label, spec in specs.items():
        if spec.sites != first.sites or spec.data_dir != first.data_dir:
            raise ValueError(f"Every method of a comparison must run on the same sites and "
                             f"data; '{label}' has sites {', '.join(spec.sites)} and data "
                             f"{spec.data_dir}, the first has {', '.join(first.sites)} and "
                             f"{first.data_dir}.")
    sites = load_sites(list(first.sites))
    comparison = Comparison(sites=tuple(first.sites), n_folds=first.n_folds,
                            resplit=split_seed is None)
    grid = [(f, s) for f in folds for s in seeds]
    bar = tqdm(total=len(grid) * len(specs), desc="compare", unit="run",
               disable=not progress, dynamic_ncols=True)
    try:
        for fold, seed in grid:
            drawn = seed if split_seed is None else split_seed
            prepared = prepare_sites(first.replace(fold=fold, seed=drawn), sites)
            for cell in reference_cells(fold, seed, prepared):
                comparison.add(cell)
            for label, spec in specs.items():
                comparison.add(run_cell(spec.replace(fold=fold, seed=seed), label,
                                        prepared, sites))
                bar.update(1)
    finally:
        bar.close()
    return comparison


def compare(sites: Sequence[str], data_dir: str | Path | None = None,
            strategies: Sequence[str] = ("singleset", "fedavg", "fedprox", "fedbn",
                                         "centralized"),
            *, folds: int = 5, seeds: int = 3, seed: int = 0, progress: bool = False,
            **changes: Any) -> Comparison:
    """Compare strategies on a list of sites from a data folder, under this protocol.

    Parameters
    ----------
    sites : sequence of str
        Site names (files in ``sites/``).
    data_dir : path, optional
        The folder holding ``ABIDE_pcp/``; None: each site's file, else the built-in data.
    strategies : sequence of str
        Strategy names; FedProx gets the paper's mu = 0.01 unless ``mu`` is given.
    folds, seeds : int
        Test folds ``0..folds-1`` and repetitions ``seed..seed+seeds-1``.
    **changes
        Any other run setting (``rounds``, ``lr``, ...), as :meth:`RunSpec.for_task`.
    """
    from fedbn_med.spec import RunSpec

    specs = {}
    for name in strategies:
        mu = changes.get("mu", 1e-2 if name == "fedprox" else None)
        spec = RunSpec.for_task("abide", **{**changes, "strategy": name, "mu": mu,
                                            "sites": tuple(sites),
                                            "data_dir": None if data_dir is None
                                            else Path(data_dir)})
        specs[spec.label] = spec
    return run_comparison(specs, range(folds), range(seed, seed + seeds), progress=progress)
