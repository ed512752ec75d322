"""The grid, the scores and the decision rule of ``defaults_sweep.py`` (no torch here).

An *axis* is one default of the main job; its *values* are run one at a time around the
current default (coordinate-wise), every other setting left at its default. A value
that resolves to the current default shares the default's runs. The stopping rule is an
axis whose values score the default's runs at another round, so it runs nothing.

The selection criterion, fixed before any result was seen, is :data:`CRITERION`: the
mean over cells of the site-mean validation AUC at each run's best-validation-loss
round (:func:`fedbn_med.evaluation.comparison.best_round`). Test scores are reported beside it and
take no part in any choice (:func:`choose`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["AXES", "CRITERION", "QUICK_AXES", "SCORES", "WINDOW_STEP", "Summary", "Value",
           "cell_scores", "choose", "combine_intervals", "summarise"]

#: The selection criterion (a validation score; higher is better).
CRITERION = "val_auc"
#: What each run records at its selected round (means over the sites).
SCORES = ("val_auc", "val_balanced_accuracy", "val_loss", "test_balanced_accuracy",
          "test_auc", "test_accuracy")
#: Volumes between window starts in the windowed feature transform (the published
#: pipeline uses 1, every window; 16 keeps a sweep affordable on 2 cores).
WINDOW_STEP = 16


@dataclass(frozen=True)
class Value:
    """One value of an axis: the settings it changes and the round a run is scored at.

    ``changes`` are :meth:`fedbn_med.spec.RunSpec.replace` keywords (task settings by
    their names too); ``at`` is ``"best"`` (the best-validation-loss round) or ``"last"``.
    """

    axis: str
    label: str
    changes: tuple[tuple[str, object], ...] = ()
    at: str = "best"

    @property
    def settings(self) -> dict[str, object]:
        """Return the changes as keywords."""
        return dict(self.changes)


def _v(axis: str, label: str, at: str = "best", **changes: object) -> Value:
    return Value(axis, label, tuple(sorted(changes.items())), at)


#: The full grid, one axis at a time around the current default.
AXES: dict[str, tuple[Value, ...]] = {
    "optimiser": (
        _v("optimiser", "SGD lr 1e-2", optimizer="sgd", lr=1e-2),
        _v("optimiser", "SGD lr 3e-3", optimizer="sgd", lr=3e-3),
        _v("optimiser", "SGD lr 1e-3", optimizer="sgd", lr=1e-3),
        _v("optimiser", "SGD lr 3e-2", optimizer="sgd", lr=3e-2),
        _v("optimiser", "Adam lr 1e-4", optimizer="adam", lr=1e-4),
        _v("optimiser", "Adam lr 1e-3", optimizer="adam", lr=1e-3),
        _v("optimiser", "Adam lr 1e-5, wd 5e-2 (paper)", optimizer="adam", lr=1e-5,
           weight_decay=5e-2),
    ),
    "weight decay": (
        _v("weight decay", "0", weight_decay=0.0),
        _v("weight decay", "5e-4", weight_decay=5e-4),
        _v("weight decay", "5e-2", weight_decay=5e-2),
    ),
    "dropout": (
        _v("dropout", "0", dropout=0.0),
        _v("dropout", "0.2", dropout=0.2),
        _v("dropout", "0.5", dropout=0.5),
    ),
    "local epochs": (
        _v("local epochs", "1", local_epochs=1),
        _v("local epochs", "2", local_epochs=2),
        _v("local epochs", "4", local_epochs=4),
    ),
    "stopping rule": (
        _v("stopping rule", "best-validation-loss round", at="best"),
        _v("stopping rule", "last round", at="last"),
    ),
    "features": (
        _v("features", "whole series", connectivity="correlation", windows=0,
           harmonize="none"),
        _v("features", "per-site z", connectivity="correlation", windows=0,
           harmonize="site_z"),
        _v("features", f"windows 32 (step {WINDOW_STEP})", connectivity="correlation",
           windows=32, window_step=WINDOW_STEP, harmonize="none"),
        _v("features", f"windows 32 (step {WINDOW_STEP}) + per-site z",
           connectivity="correlation", windows=32, window_step=WINDOW_STEP,
           harmonize="site_z"),
        _v("features", "tangent space (site's own reference)", connectivity="tangent",
           windows=0, harmonize="none"),
        _v("features", "tangent space + per-site z", connectivity="tangent", windows=0,
           harmonize="site_z"),
    ),
    # added on 2026-12-05, after outer-test comparisons of groups A and B with mean FD
    # regressed out (real_compare --fd-regression) had been seen: the rule decides
    "motion": (
        _v("motion", "kept in the features", fd_regression=False),
        _v("motion", "mean FD regressed out", fd_regression=True),
    ),
    "model": (
        _v("model", "MLP 16-16 (paper)", model="mlp"),
        _v("model", "linear", model="linear"),
        _v("model", "linear, wd 5e-2", model="linear", weight_decay=5e-2),
        _v("model", "linear, wd 5e-1", model="linear", weight_decay=5e-1),
        _v("model", "linear, tangent space", model="linear", connectivity="tangent",
           windows=0, harmonize="none"),
        _v("model", "linear, tangent space, wd 5e-1", model="linear",
           connectivity="tangent", windows=0, harmonize="none", weight_decay=5e-1),
        # added after the first nested runs: a pooled scikit-learn logistic regression
        # chose its strongest penalty there (C = 1e-4, about wd 100 at these sizes)
        _v("model", "linear, tangent space, wd 10", model="linear",
           connectivity="tangent", windows=0, harmonize="none", weight_decay=10.0),
        _v("model", "linear, tangent space, wd 100", model="linear",
           connectivity="tangent", windows=0, harmonize="none", weight_decay=100.0),
    ),
}

#: ``--quick``: two values of three axes.
QUICK_AXES: dict[str, tuple[Value, ...]] = {
    "optimiser": tuple(v for v in AXES["optimiser"]
                       if v.label in ("SGD lr 3e-3", "Adam lr 1e-3")),
    "stopping rule": AXES["stopping rule"],
    "features": tuple(v for v in AXES["features"]
                      if v.label in ("whole series", f"windows 32 (step {WINDOW_STEP})")),
}


def cell_scores(rows: Sequence[Mapping[str, object]], rnd: int) -> dict[str, float]:
    """Return the mean over sites of each of :data:`SCORES` at round ``rnd``."""
    out = {}
    for key in SCORES:
        vals = [float(r[key]) for r in rows  # type: ignore[arg-type]
                if int(r["round"]) == rnd and key in r  # type: ignore[call-overload]
                and math.isfinite(float(r[key]))]  # type: ignore[arg-type]
        out[key] = float(np.mean(vals)) if vals else math.nan
    return out


@dataclass(frozen=True)
class Summary:
    """One value's figures in one group: means over its cells, and the test intervals."""

    cells: int
    val: dict[str, float]
    #: test metric -> (mean, low, high), corrected resampled t over the cells
    test: dict[str, tuple[float, float, float]]
    #: every one of :data:`SCORES`: its mean over the cells (the nested criterion's too)
    means: dict[str, float] = field(default_factory=dict)

    def score(self, name: str) -> float:
        """Return the mean over the cells of one of :data:`SCORES` (NaN if not kept)."""
        return {**self.val, **self.means}.get(name, math.nan)


def summarise(cells: Sequence[Mapping[str, float]], test_train_ratio: float) -> Summary:
    """Return the :class:`Summary` of one value's cells in one group.

    Each cell maps ``<score>`` (:data:`SCORES`) to its site mean at the value's round.
    """
    from fedbn_med.evaluation.intervals import corrected_t_interval

    def mean(key: str) -> float:
        vals = [c[key] for c in cells if math.isfinite(c[key])]
        return float(np.mean(vals)) if vals else math.nan

    means = {k: mean(k) for k in SCORES}
    val = {k: v for k, v in means.items() if k.startswith("val_")}
    test = {}
    for key in ("test_balanced_accuracy", "test_auc"):
        m = mean(key)
        _, low, high = corrected_t_interval([c[key] for c in cells], test_train_ratio)
        half = (high - low) / 2
        test[key] = (m, m - half, m + half)
    return Summary(len(cells), val, test, means)


def combine_intervals(parts: Sequence[tuple[float, float, float]]
                      ) -> tuple[float, float, float]:
    """Return the mean of independent estimates and its interval.

    The groups share no subject, so the half-widths add in quadrature: the average of
    k estimates has half-width ``sqrt(sum h_i^2) / k``. A part without bounds gives
    none.
    """
    means = [p[0] for p in parts]
    halves = [(p[2] - p[1]) / 2 for p in parts]
    mean = float(np.mean(means)) if parts else math.nan
    if not parts or not all(math.isfinite(h) for h in halves):
        return mean, math.nan, math.nan
    half = math.sqrt(sum(h * h for h in halves)) / len(parts)
    return mean, mean - half, mean + half


def choose(axis: str, values: Sequence[Value], default: Value,
           summaries: Mapping[tuple[str, str], Summary], groups: Sequence[str],
           criterion: str = CRITERION) -> tuple[Value, str]:
    """Return the chosen value of an axis and why, from ``criterion`` only (never test).

    A value replaces the current default only where the evidence agrees across the
    groups: it has the highest ``criterion`` of the axis in every group and beats the
    default in every group. Otherwise the default stays. The stopping rule is not
    chosen here: on validation the best-validation-loss round is picked on the same
    data, so its scores are biased upwards against the last round's; under the nested
    criterion it is judged by ``benchmarks/research/stopping_rule.py``, which compares more rules
    in the same nested design. The protocol's rule stays.

    Parameters
    ----------
    axis : str
        The axis name.
    values : sequence of Value
        The axis's values (the default among them).
    default : Value
        The value that is the current default.
    summaries : mapping
        ``{(value label, group): Summary}``.
    groups : sequence of str
        The groups that must agree.
    criterion : str
        The score compared (one of :data:`SCORES`; :data:`CRITERION` unless the sweep is
        nested: then the inner-test AUC, ``"test_auc"`` of runs that never see an outer
        test subject).
    """
    if axis == "stopping rule":
        if criterion != CRITERION:
            return default, ("kept: the protocol's rule; judged in the same nested design "
                             "by stopping_rule.py")
        return default, ("kept: circular on validation, which picks the round; "
                         "the protocol's rule")
    crit = {(v.label, g): summaries[(v.label, g)].score(criterion) for v in values
            for g in groups if (v.label, g) in summaries}
    best_per_group = []
    for g in groups:
        scored = [(crit[(v.label, g)], v) for v in values
                  if math.isfinite(crit.get((v.label, g), math.nan))]
        if not scored:
            return default, f"kept: no finite {criterion} in group {g}"
        best_per_group.append(max(scored, key=lambda sv: sv[0])[1])
    winners = {v.label for v in best_per_group}
    if len(winners) > 1:
        return default, ("kept: the groups' best values differ (" + ", ".join(
            f"{g}: {v.label}" for g, v in zip(groups, best_per_group)) + ")")
    winner = best_per_group[0]
    if winner.label == default.label:
        return default, "kept: the default is best in every group"
    if not all(crit[(winner.label, g)] > crit[(default.label, g)] for g in groups):
        return default, "kept: the best value does not beat the default in every group"
    return winner, "changed: best in every group"
