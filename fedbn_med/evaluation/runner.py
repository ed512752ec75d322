"""Running a comparison in this process: every method on every (fold, seed) cell.

:func:`run_comparison` prepares each cell's sites once (:mod:`fedbn_med.evaluation.cell_data`),
adds its reference rows (:mod:`fedbn_med.evaluation.references`) and runs every method on
it (:func:`run_cell`), which keeps each subject's test prediction at the round of lowest
mean validation loss. :func:`compare` builds the methods' specs from strategy names.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedbn_med.evaluation.cell_data import PreparedSite, prepare_sites, with_features
from fedbn_med.evaluation.comparison import Cell, Comparison, SitePredictions
from fedbn_med.evaluation.references import reference_cells

if TYPE_CHECKING:
    from fedbn_med.spec import RunSpec
    from fedbn_med.tasks.abide.sites import SiteConfig

__all__ = ["compare", "run_cell", "run_comparison"]

logger = logging.getLogger(__name__)


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
    prepared = with_features(spec, prepared or prepare_sites(spec, sites), sites)
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
