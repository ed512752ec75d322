"""One cell's data: every site loaded and split for a (fold, seed), and a method's features.

:class:`PreparedSite` is what a subject-level comparison reads of a site. The task makes
them, through its :class:`~fedbn_med.tasks.Cells` hook (ABIDE's:
:mod:`fedbn_med.tasks.abide.cells`): :func:`prepare_sites` loads each site and draws its
split for the cell, so that every method of a cell and its reference rows see the same
subjects; :func:`with_features` rebuilds the rows of a method whose settings transform
the features, on the same split; :func:`cell_sites` loads the sites' files once for a
cell's runs. This module names no task.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from fedbn_med.spec import RunSpec
    from fedbn_med.tasks import Cells
    from fedbn_med.tasks.abide.splits import Split
    from fedbn_med.training.trainer import SiteData

__all__ = ["PreparedSite", "cell_sites", "has_cells", "prepare_sites", "task_cells",
           "with_features"]


@dataclass(frozen=True, eq=False)
class PreparedSite:
    """One site's data for one (fold, seed): its tensors, split, labels and mean FD.

    ``features``: every subject's whole-series connectivity, in subject order (what the
    linear reference rows are fitted on, whatever the method's own features).
    """

    data: SiteData
    split: Split
    labels: np.ndarray
    mean_fd: np.ndarray
    features: np.ndarray


def has_cells(task: str) -> bool:
    """Return whether a task prepares cells for subject-level comparisons."""
    from fedbn_med.tasks import get_task

    return get_task(task).cells is not None


def task_cells(task: str) -> Cells:
    """Return a task's :class:`~fedbn_med.tasks.Cells` hook.

    Raises
    ------
    ValueError
        For a task without one, naming the tasks that have one.
    """
    from fedbn_med.tasks import get_task, task_names

    cells = get_task(task).cells
    if cells is None:
        able = []
        for name in task_names():
            try:
                if get_task(name).cells is not None:
                    able.append(name)
            except (ImportError, ValueError):  # a broken outside task is not one
                continue
        raise ValueError(f"Task '{task}' prepares no cells for a subject-level comparison "
                         f"(its Task.cells is None). Tasks that do: "
                         f"{', '.join(able) or 'none'}.")
    return cells


def cell_sites(spec: RunSpec) -> dict[str, Any]:
    """Return the site files of ``spec``'s sites, as its task's cells read them."""
    return dict(task_cells(spec.task).load_sites(list(spec.sites)))


def prepare_sites(spec: RunSpec, sites: Mapping[str, Any] | None = None
                  ) -> dict[str, PreparedSite]:
    """Load every site of ``spec`` and split it for the spec's fold and repetition seed.

    ``sites``: their files (:func:`cell_sites`), loaded when omitted.
    """
    return dict(task_cells(spec.task).prepare(spec, sites))


def with_features(spec: RunSpec, prepared: Mapping[str, PreparedSite],
                  sites: Mapping[str, Any] | None = None) -> Mapping[str, PreparedSite]:
    """Return the sites' data with the spec's feature chain applied, when it has one.

    :func:`prepare_sites` gives the features every method of a cell and the reference
    rows share; a method whose settings transform them gets its rows built as a run of
    it builds them, on the same split (each site's ``split``, which on fixed splits is not
    the spec's own repetition's); ``prepared`` itself when it has no such chain.
    """
    return task_cells(spec.task).with_features(spec, prepared, sites)
