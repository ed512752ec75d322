"""Running a comparison in this process: every method on every (fold, seed) cell.

:func:`run_comparison` prepares each cell's sites once (:mod:`fedbn_med.evaluation.cell_data`),
adds its reference rows (:mod:`fedbn_med.evaluation.references`) and runs every method on
it (:func:`run_cell`), which keeps each subject's test prediction at the round of lowest
mean validation loss. :func:`compare` builds the methods' specs from strategy names.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedbn_med.evaluation.cell_data import PreparedSite, cell_sites, prepare_sites
from fedbn_med.evaluation.comparison import METRICS, Cell, Comparison
from fedbn_med.evaluation.references import reference_cells
from fedbn_med.spec import settings_module

if TYPE_CHECKING:
    from fedbn_med.spec import RunSpec
    from fedbn_med.tasks.abide.sites import SiteConfig

__all__ = ["cell_of_comparison", "compare", "run_cell", "run_comparison", "task_metrics"]

logger = logging.getLogger(__name__)


def task_metrics(task: str) -> tuple[str, ...]:
    """Return the test scores a task's cells are tabulated by, headline first.

    The task's ``METRICS`` (``fedbn_med.tasks.<task>.settings``; MRI: Dice), else the
    protocol's (:data:`~fedbn_med.evaluation.comparison.METRICS`: balanced accuracy, AUC,
    accuracy).
    """
    return tuple(getattr(settings_module(task), "METRICS", METRICS))


def run_cell(spec: RunSpec, label: str | None = None,
             prepared: Mapping[str, PreparedSite] | None = None,
             sites: Mapping[str, SiteConfig] | None = None) -> Cell:
    """Run one federation of any task in this process and return its cell.

    The run is :func:`fedbn_med.run`'s in this process
    (:func:`fedbn_med.api.engines.run_inprocess`, untracked); the cell's best round is the
    one the task's ``selection`` picks and its scores are the task's
    (:func:`task_metrics`).

    Parameters
    ----------
    spec : RunSpec
        The run (its ``fold`` and ``seed`` pick the cell; the seed also re-draws splits).
    label : str, optional
        The method's name in the tables (default: the strategy's label).
    prepared : mapping, optional
        The sites' data of a subject-level comparison (:func:`prepare_sites` for this
        spec): the run trains on them, through the spec's own feature chain
        (:func:`~fedbn_med.evaluation.cell_data.with_features`), and the cell keeps each
        subject's test prediction at the selected round and the cell's subject counts.
        When omitted, each site's ``build_site`` prepares its data, and the cell has
        neither.
    sites : mapping of site name to SiteConfig, optional
        The site files of ``prepared`` (loaded from ``sites/`` when omitted).
    """
    from fedbn_med.api.engines import run_inprocess, spec_launch
    from fedbn_med.tasks import get_task

    result = run_inprocess(spec_launch(spec, prepared=prepared, site_files=sites))
    return Cell.from_rows(
        label or spec.label, spec.fold, spec.seed, result.rows,
        predictions=result.predictions if prepared is not None else None,
        n_train=result.n_train, n_test=result.n_test,
        metrics=task_metrics(spec.task), selection=get_task(spec.task).selection)


def _data_of(spec: RunSpec) -> tuple[object, ...]:
    """Return what decides a spec's subjects: its data folder, or the cohort's settings.

    The built-in cohort's subjects depend on its site effect and size; every method of a
    comparison must see the same subjects in each cell.
    """
    if spec.data_dir is not None:
        return (spec.data_dir,)
    settings = spec.settings
    return ("built-in", getattr(settings, "site_effect", None),
            getattr(settings, "cohort_scale", None))


def run_comparison(specs: Mapping[str, RunSpec], folds: Iterable[int],
                   seeds: Iterable[int], *, progress: bool = False,
                   split_seed: int | None = None, workers: int = 1) -> Comparison:
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
    workers : int
        Processes that run cells at once (:mod:`fedbn_med.evaluation.parallel`); a run
        gives the same numbers in any process, and the cells are added in grid order.
    """
    from tqdm.auto import tqdm

    if not specs:
        raise ValueError("A comparison needs at least one method; none was given.")
    first = next(iter(specs.values()))
    for label, spec in specs.items():
        if spec.sites != first.sites or _data_of(spec) != _data_of(first):
            raise ValueError(f"Every method of a comparison must run on the same sites and "
                             f"data; '{label}' has sites {', '.join(spec.sites)} and data "
                             f"{_data_of(spec)}, the first has {', '.join(first.sites)} and "
                             f"{_data_of(first)}.")
    sites = cell_sites(first)
    comparison = Comparison(sites=tuple(first.sites), n_folds=first.n_folds,
                            resplit=split_seed is None)
    grid = [(f, s) for f in folds for s in seeds]
    bar = tqdm(total=len(grid) * len(specs), desc="compare", unit="run",
               disable=not progress, dynamic_ncols=True)
    try:
        if workers > 1 and len(grid) > 1:
            from fedbn_med.evaluation.parallel import map_cells

            for cells in map_cells(cell_of_comparison, [(dict(specs), f, s, split_seed)
                                                        for f, s in grid], workers,
                                   on_done=lambda _: bar.update(len(specs))):
                for cell in cells:
                    comparison.add(cell)
        else:
            for fold, seed in grid:
                for cell in cell_of_comparison(specs, fold, seed, split_seed, sites,
                                               on_run=lambda: bar.update(1)):
                    comparison.add(cell)
    finally:
        bar.close()
    return comparison


def cell_of_comparison(specs: Mapping[str, RunSpec], fold: int, seed: int,
                       split_seed: int | None = None,
                       sites: Mapping[str, SiteConfig] | None = None,
                       on_run: Callable[[], None] | None = None) -> list[Cell]:
    """Return one (fold, seed) cell of :func:`run_comparison`: reference rows, then methods."""
    first = next(iter(specs.values()))
    sites = sites or cell_sites(first)
    drawn = seed if split_seed is None else split_seed
    prepared = prepare_sites(first.replace(fold=fold, seed=drawn), sites)
    cells = list(reference_cells(fold, seed, prepared))
    for label, spec in specs.items():
        cells.append(run_cell(spec.replace(fold=fold, seed=seed), label, prepared, sites))
        if on_run is not None:
            on_run()
    return cells


def compare(sites: Sequence[str], data_dir: str | Path | None = None,
            strategies: Sequence[str] = ("singleset", "fedavg", "fedprox", "fedbn",
                                         "centralized"),
            *, folds: int = 5, seeds: int = 3, seed: int = 0, progress: bool = False,
            task: str = "abide", **changes: Any) -> Comparison:
    """Compare strategies on a list of sites from a data folder, under this protocol.

    Parameters
    ----------
    sites : sequence of str
        Site names (files in ``sites/``).
    data_dir : path, optional
        The task's data folder (ABIDE: the one holding ``ABIDE_pcp/``); None: each site's
        file, else the built-in data.
    strategies : sequence of str
        Strategy names; FedProx gets the paper's mu = 0.01 unless ``mu`` is given.
    folds, seeds : int
        Test folds ``0..folds-1`` and repetitions ``seed..seed+seeds-1``.
    task : str
        The registered task whose sites these are.
    **changes
        Any other run setting (``rounds``, ``lr``, ...), as :meth:`RunSpec.for_task`.
    """
    from fedbn_med.spec import RunSpec

    specs = {}
    for name in strategies:
        mu = changes.get("mu", 1e-2 if name == "fedprox" else None)
        spec = RunSpec.for_task(task, **{**changes, "strategy": name, "mu": mu,
                                            "sites": tuple(sites),
                                            "data_dir": None if data_dir is None
                                            else Path(data_dir)})
        specs[spec.label] = spec
    return run_comparison(specs, range(folds), range(seed, seed + seeds), progress=progress)
