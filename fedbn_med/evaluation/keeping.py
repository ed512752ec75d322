"""Keeping a run's test predictions at its selected round, for the per-subject tests.

:func:`keeping_federation` builds a spec's federation on a cell's prepared sites
(:mod:`fedbn_med.evaluation.cell_data`) with a :class:`BestRoundKeeper`, which holds each
site's test predictions at the round the task's selection picks. A comparison's runs
in this process keep them this way (:func:`fedbn_med.api.engines.spec_launch`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from fedbn_med.evaluation.cell_data import PreparedSite, with_features
from fedbn_med.evaluation.cells import SitePredictions
from fedbn_med.evaluation.selection import RunningBest

if TYPE_CHECKING:
    from fedbn_med.spec import RunSpec
    from fedbn_med.tasks import Selection
    from fedbn_med.tasks.abide.sites import SiteConfig
    from fedbn_med.training.inprocess import Federation

__all__ = ["BestRoundKeeper", "keeping_federation", "subject_counts"]


class BestRoundKeeper:
    """Keep each site's test predictions at the round the task's selection picks.

    Called after each round (a run's ``on_round``); :attr:`predictions` then holds each
    site's :class:`~fedbn_med.evaluation.comparison.SitePredictions` at the round
    selected so far, the run's result when it ends.
    """

    def __init__(self, trainers: Mapping[str, Any], prepared: Mapping[str, PreparedSite],
                 selection: Selection) -> None:
        self.trainers = trainers
        self.prepared = prepared
        self.running = RunningBest(selection.metric, selection.lower)
        self.best = 0
        self.predictions: dict[str, SitePredictions] = {}

    def __call__(self, rnd: int, metrics: Mapping[str, Mapping[str, float]]) -> None:
        """Take round ``rnd``'s validation scores; keep its predictions if it is selected."""
        # best_round's rule, round by round; until a round can be selected, the latest
        # (best_round's fall-back is the last round)
        if not self.running.take(rnd, metrics.values()) and self.running.best:
            return
        self.best = rnd
        for site, trainer in self.trainers.items():
            s = self.prepared[site]
            prob = trainer.predict(s.data.test[0]).numpy().astype(np.float64)
            groups = s.data.test_groups
            if groups is not None:  # windows: a subject's P(ASD) is its windows' mean
                of = groups.numpy()
                lost = [int(i) for i in s.split.test if not (of == i).any()]
                if lost:
                    raise RuntimeError(f"Site {site}: test subject(s) {lost[:3]} have no row in "
                                       "the site's test data, whose rows were built on "
                                       "another split.")
                prob = np.array([prob[of == i].mean() for i in s.split.test])
            decide = getattr(trainer.objective, "decision_threshold", None)
            with trainer.scoring_bn():  # the BN statistics the site scored with
                threshold = 0.5 if decide is None else float(
                    decide(trainer.model, s.data, trainer.device))
            self.predictions[site] = SitePredictions(s.split.test.copy(),
                                                     s.labels[s.split.test].copy(), prob,
                                                     threshold)


def keeping_federation(spec: RunSpec, prepared: Mapping[str, PreparedSite],
                       sites: Mapping[str, SiteConfig] | None = None
                       ) -> tuple[Federation, BestRoundKeeper, Mapping[str, PreparedSite]]:
    """Build ``spec``'s federation on a cell's prepared sites, with its predictions' keeper.

    The sites' rows go through the spec's own feature chain (:func:`with_features`);
    pass the keeper as the run's ``on_round``. Returns the federation, the keeper and the
    sites as the spec's features made them.
    """
    from fedbn_med.tasks import get_task
    from fedbn_med.training.inprocess import build_federation

    prepared = with_features(spec, prepared, sites)
    federation = build_federation(spec, {name: p.data for name, p in prepared.items()})
    keeper = BestRoundKeeper(federation.trainers, prepared, get_task(spec.task).selection)
    return federation, keeper, prepared


def subject_counts(prepared: Mapping[str, PreparedSite]) -> tuple[int, int]:
    """Return the subjects of every site outside and inside the test fold."""
    splits = [p.split for p in prepared.values()]
    return (sum(s.train.size + s.val.size for s in splits),
            sum(s.test.size for s in splits))
