"""The reference rows of every comparison: majority class, motion alone, linear models.

The majority class and the motion-only row (mean FD) are fitted per site on that site's
training split of the same (fold, seed) as the methods (:func:`reference_cells`), so they
are paired with them cell by cell; for runs made elsewhere (over Flower)
:func:`add_reference_rows` draws the splits here exactly as every site draws them.

The two linear rows answer "does it beat a linear model on the same features?": ridge
regression of the diagnosis on every subject's whole-series connectivity, each feature
z-scored with its own site's training mean and standard deviation, the penalty chosen by
leave-one-out over the training subjects alone (:func:`ridge_probabilities`). "Pooled"
fits one model on every site's training subjects; "site only" one per site.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np

from fedbn_med.evaluation.cell_data import prepare_sites
from fedbn_med.evaluation.comparison import (
    MAJORITY,
    MOTION,
    REFERENCES,
    RIDGE_POOLED,
    RIDGE_SITE,
    Cell,
    Comparison,
    SitePredictions,
)

if TYPE_CHECKING:
    from fedbn_med.spec import RunSpec
    from fedbn_med.tasks.abide.splits import Split

__all__ = ["RIDGE_ALPHAS", "ScoredOn", "SplitSite", "add_reference_rows", "reference_cells",
           "ridge_probabilities"]

#: The ridge penalties leave-one-out chooses from (features z-scored per site: a subject's
#: squared norm is about the number of features, 6105 for the Harvard-Oxford atlas).
RIDGE_ALPHAS = tuple(float(a) for a in np.logspace(0, 6, 13))

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
    @property
    def features(self) -> np.ndarray:
        """Every subject's whole-series connectivity, ``(n_subjects, n_features)``."""


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


def _site_z(x: np.ndarray, fit: np.ndarray) -> np.ndarray:
    """Return ``x`` z-scored with the mean and standard deviation of its rows ``fit``."""
    center = x[fit].mean(axis=0)
    scale = x[fit].std(axis=0)
    return (x - center) / np.where(scale > 0, scale, 1.0)


def ridge_probabilities(sites: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
                        scored: Mapping[str, np.ndarray], *, pooled: bool
                        ) -> dict[str, np.ndarray]:
    """Return each site's P(ASD) of its ``scored`` subjects from ridge regression.

    Parameters
    ----------
    sites : mapping of site name to (features, labels, fit)
        Every subject's features and labels, and the indices of the subjects the model
        is fitted on (the training part). Each site's features are z-scored with the
        mean and standard deviation of its own ``fit`` subjects.
    scored : mapping of site name to indices
        The subjects to predict; none of them may be among the site's ``fit`` subjects.
    pooled : bool
        One model on every site's ``fit`` subjects (True), or one per site.

    Returns
    -------
    dict of site name to numpy.ndarray
        The ridge's prediction of the 0/1 label, clipped to [0, 1]: its 0.5 threshold is
        :class:`sklearn.linear_model.RidgeClassifier`'s decision. The penalty is chosen
        from :data:`RIDGE_ALPHAS` by leave-one-out over the ``fit`` subjects only
        (:class:`sklearn.linear_model.RidgeCV`); a site with fewer than 4 such subjects
        or one class is given its training prevalence.
    """
    from sklearn.linear_model import RidgeCV

    z: dict[str, np.ndarray] = {}
    for site, (x, _, fit) in sites.items():
        if np.intersect1d(fit, scored[site]).size:  # the model never reads a scored subject
            raise ValueError(f"Site {site}: subjects to score are among those fitted on.")
        z[site] = _site_z(np.asarray(x, dtype=np.float64), fit)

    def fitted(names: Sequence[str]) -> RidgeCV | None:
        x = np.concatenate([z[n][sites[n][2]] for n in names])
        y = np.concatenate([sites[n][1][sites[n][2]] for n in names]).astype(np.float64)
        if y.size < 4 or np.unique(y).size < 2:
            return None
        return RidgeCV(alphas=RIDGE_ALPHAS).fit(x, y)

    def predict(model: RidgeCV | None, site: str) -> np.ndarray:
        idx = scored[site]
        if model is None:
            fit = sites[site][2]
            return np.full(idx.size, float(np.mean(sites[site][1][fit])) if fit.size else 0.5)
        return np.clip(model.predict(z[site][idx]), 0.0, 1.0)

    if pooled:
        model = fitted(list(sites))
        return {site: predict(model, site) for site in sites}
    return {site: predict(fitted([site]), site) for site in sites}


def reference_cells(fold: int, seed: int, sites: Mapping[str, SplitSite], *,
                    scored_on: ScoredOn = "test") -> list[Cell]:
    """Return the reference cells of one (fold, seed): :data:`REFERENCES`, in that order.

    The majority-class and motion-only rows are fitted per site on that site's training
    split: the majority class scores every test subject with the training share of ASD
    (so it predicts the training majority, balanced accuracy 0.5, AUC 0.5); the
    motion-only row is a logistic regression of the diagnosis on mean framewise
    displacement (missing FD imputed by the training median; a site without FD gets the
    majority row's scores). The two ridge rows (:func:`ridge_probabilities`) are fitted on
    every subject outside the scored part (training and validation subjects when scoring
    the test split), pooled over the sites or at each site alone.

    ``scored_on="val"`` scores them on each site's validation subjects instead, for
    tables that read no test split (the cells' scores are then validation scores; the
    ridge rows are then fitted on the training split alone).
    """
    if scored_on not in ("test", "val"):
        raise ValueError(f"scored_on must be 'test' or 'val', got {scored_on!r}.")
    scored = {site: s.split.test if scored_on == "test" else s.split.val
              for site, s in sites.items()}
    fit_on = {site: (np.concatenate([s.split.train, s.split.val]) if scored_on == "test"
                     else s.split.train).astype(np.int64) for site, s in sites.items()}
    linear = {site: (s.features, s.labels, fit_on[site]) for site, s in sites.items()}
    ridge = {RIDGE_POOLED: ridge_probabilities(linear, scored, pooled=True),
             RIDGE_SITE: ridge_probabilities(linear, scored, pooled=False)}
    cells = []
    for name in REFERENCES:
        rows, preds = [], {}
        for site, s in sites.items():
            train, y, test = s.split.train, s.labels, scored[site]
            if name == MAJORITY:
                prob = np.full(test.size, float(np.mean(y[train])))
            elif name == MOTION:
                prob = _motion_scores(s.mean_fd, y, train, test)
            else:
                prob = ridge[name][site]
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
    """Add the reference cells (:data:`REFERENCES`) of every (fold, seed) to a comparison.

    For comparisons whose runs happened elsewhere (over Flower): the splits are drawn
    here exactly as every site draws them, from the same data. ``scored_on``: as in
    :func:`reference_cells`.
    """
    for fold, seed in cells:
        prepared = prepare_sites(spec.replace(fold=fold, seed=seed))
        for cell in reference_cells(fold, seed, prepared, scored_on=scored_on):
            comparison.add(cell)
