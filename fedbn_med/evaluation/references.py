"""The reference rows of every comparison: the majority class and motion alone (mean FD).

Both are fitted per site on that site's training split of the same (fold, seed) as the
methods (:func:`reference_cells`), so they are paired with them cell by cell; for runs
made elsewhere (over Flower) :func:`add_reference_rows` draws the splits here exactly as
every site draws them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np

from fedbn_med.evaluation.cell_data import prepare_sites
from fedbn_med.evaluation.comparison import MAJORITY, REFERENCES, Cell, Comparison, SitePredictions

if TYPE_CHECKING:
    from fedbn_med.spec import RunSpec
    from fedbn_med.tasks.abide.splits import Split

__all__ = ["ScoredOn", "SplitSite", "add_reference_rows", "reference_cells"]

#: Which subjects of each site a reference row is scored on (it is fitted on "train").
ScoredOn = Literal["test", "val"]


class SplitSite(Protocol):
    """What a reference row reads of a site: its split, labels and mean FD.

    :class:`~fedbn_med.evaluation.cell_data.PreparedSite` is one; a nested design passes
    its inner split with the same labels and FD.
    """

    @property
    def split(self) -> Split:
        """The site's training, validation and test indices."""
    @property
    def labels(self) -> np.ndarray:
        """Every subject's diagnosis (1 = ASD)."""
    @property
    def mean_fd(self) -> np.ndarray:
        """Every subject's mean framewise displacement (NaN where unknown)."""


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


def reference_cells(fold: int, seed: int, sites: Mapping[str, SplitSite], *,
                    scored_on: ScoredOn = "test") -> list[Cell]:
    """Return the majority-class and the motion-only cells of one (fold, seed).

    Both are fitted per site on that site's training split: the majority class scores
    every test subject with the training share of ASD (so it predicts the training
    majority, balanced accuracy 0.5, AUC 0.5); the motion-only row is a logistic
    regression of the diagnosis on mean framewise displacement (missing FD imputed by
    the training median; a site without FD gets the majority row's scores).

    ``scored_on="val"`` scores them on each site's validation subjects instead, for
    tables that read no test split (the cells' scores are then validation scores).
    """
    if scored_on not in ("test", "val"):
        raise ValueError(f"scored_on must be 'test' or 'val', got {scored_on!r}.")
    cells = []
    for name in REFERENCES:
        rows, preds = [], {}
        for site, s in sites.items():
            train, y = s.split.train, s.labels
            test = s.split.test if scored_on == "test" else s.split.val
            if name == MAJORITY:
                prob = np.full(test.size, float(np.mean(y[train])))
            else:
                prob = _motion_scores(s.mean_fd, y, train, test)
            rows.append(_scored_rows(site, y[test], prob))
            preds[site] = SitePredictions(test.copy(), y[test].copy(), prob)
        n_train = sum(s.split.train.size + s.split.val.size for s in sites.values())
        n_test = sum(getattr(s.split, scored_on).size for s in sites.values())
        cells.append(Cell.from_rows(name, fold, seed, rows, predictions=preds,
                                    n_train=n_train, n_test=n_test, reference=True))
    return cells


def add_reference_rows(comparison: Comparison, spec: RunSpec,
                       cells: Iterable[tuple[int, int]], *, scored_on: ScoredOn = "test"
                       ) -> None:
    """Add the majority-class and motion-only cells of every (fold, seed) to a comparison.

    For comparisons whose runs happened elsewhere (over Flower): the splits are drawn
    here exactly as every site draws them, from the same data. ``scored_on``: as in
    :func:`reference_cells`.
    """
    for fold, seed in cells:
        prepared = prepare_sites(spec.replace(fold=fold, seed=seed))
        for cell in reference_cells(fold, seed, prepared, scored_on=scored_on):
            comparison.add(cell)
