"""The cells of an in-process ABIDE comparison, in several processes at once.

A comparison's runs are independent: each builds its sites, seeds its model and its
batches from its own spec, and computes with its own thread count
(:meth:`fedbn_med.training.trainer.SiteTrainer.pin_threads`), so a run gives the same
numbers in any process. :func:`run_cells` hands each (fold, seed) cell to one of
``workers`` processes, which prepares the cell's sites once and runs every method of it
(:func:`fedbn_med.api.engines.run_inprocess`, logging to the same MLflow store), as
the one-process comparison does; the results come back in the order of the specs.
"""

from __future__ import annotations

import logging
import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from itertools import groupby
from typing import TYPE_CHECKING, Any, TypeVar

from fedbn_med.numerics.cores import usable_cores

if TYPE_CHECKING:
    from fedbn_med.api.result import FederationResult
    from fedbn_med.spec import RunSpec

__all__ = ["default_workers", "map_cells", "run_cells"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


def default_workers(specs: Sequence[RunSpec]) -> int:
    """Return how many processes a comparison of ``specs`` uses by default.

    As many as the usable cores (:func:`~fedbn_med.numerics.cores.usable_cores`) hold
    runs of the specs' thread count, and no more than there are (fold, seed) cells.
    """
    if not specs:
        return 1
    cores = usable_cores()
    threads = max(s.threads or 1 for s in specs)
    cells = len({(s.fold, s.seed) for s in specs})
    return max(1, min(cores // threads, cells))


def _cell_of(spec: RunSpec) -> tuple[int, int]:
    return spec.fold, spec.seed


def _run_cell(specs: list[RunSpec], tracking_uri: str | None) -> list[FederationResult]:
    """Run every spec of one (fold, seed) cell on the cell's prepared sites (a worker)."""
    from fedbn_med.api.engines import run_inprocess, spec_launch
    from fedbn_med.evaluation.cell_data import cell_sites, prepare_sites

    sites = cell_sites(specs[0])
    prepared = prepare_sites(specs[0], sites)
    return [run_inprocess(spec_launch(spec, prepared=prepared, site_files=sites),
                          tracking_uri=tracking_uri) for spec in specs]


def run_cells(specs: Sequence[RunSpec], *, workers: int, tracking_uri: str | None = None,
              on_cell: Callable[[int], None] | None = None) -> list[FederationResult]:
    """Run an ABIDE comparison's specs in process, cell by cell, in ``workers`` processes.

    Parameters
    ----------
    specs : sequence of RunSpec
        Every run of the comparison (every method on every (fold, seed) cell), all on the
        same sites and data.
    workers : int
        Processes (each computes one cell at a time; 1 runs them all in this process).
    tracking_uri : str, optional
        The MLflow store every run logs to (None: the runs are not tracked).
    on_cell : callable, optional
        Called with the number of runs of each cell as it finishes (a progress bar).

    Returns
    -------
    list of FederationResult
        Each spec's :class:`~fedbn_med.api.result.FederationResult`, in the order of
        ``specs``, with its test subjects' predictions.
    """
    if workers < 1:
        raise ValueError(f"workers must be a positive integer, got {workers}.")
    order = sorted(range(len(specs)), key=lambda i: _cell_of(specs[i]))
    groups = [list(g) for _, g in groupby(order, key=lambda i: _cell_of(specs[i]))]
    results: dict[int, FederationResult] = {}
    if workers == 1 or len(groups) == 1:
        for group in groups:
            for i, result in zip(group, _run_cell([specs[i] for i in group], tracking_uri)):
                results[i] = result
            if on_cell is not None:
                on_cell(len(group))
        return [results[i] for i in range(len(specs))]
    if tracking_uri is not None:  # create the store once, before processes write to it
        from fedbn_med.tracking import warm_up

        warm_up(tracking_uri)
    # spawn: a fresh interpreter per worker (forking a process that has started torch's
    # thread pool can hang); each worker imports the stack once and keeps it
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(workers, len(groups)),
                             mp_context=context) as pool:
        pending: dict[Future[list[FederationResult]], list[int]] = {
            pool.submit(_run_cell, [specs[i] for i in group], tracking_uri): group
            for group in groups}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                group = pending.pop(future)
                for i, result in zip(group, future.result()):
                    results[i] = result
                if on_cell is not None:
                    on_cell(len(group))
    return [results[i] for i in range(len(specs))]


def map_cells(function: Callable[..., T], arguments: Sequence[tuple[Any, ...]], workers: int,
              *, on_done: Callable[[int], None] | None = None) -> list[T]:
    """Return ``[function(*a) for a in arguments]``, computed in ``workers`` processes.

    ``function`` must be importable by name (a module-level function); ``on_done`` is
    called with each finished item's index, in the order they finish. The results come
    back in the order of ``arguments``.
    """
    if workers < 1:
        raise ValueError(f"workers must be a positive integer, got {workers}.")
    out: dict[int, T] = {}
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(workers, len(arguments)) or 1,
                             mp_context=context) as pool:
        pending = {pool.submit(function, *a): i for i, a in enumerate(arguments)}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                i = pending.pop(future)
                out[i] = future.result()
                if on_done is not None:
                    on_done(i)
    return [out[i] for i in range(len(arguments))]
