"""Shared fixtures: one small built-in ABIDE-format cohort per test session."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from fedbn_med.tasks.abide.cohort import DEFAULT_SITE_IDS, generate_cohort
from tests import stores

SMALL_COHORT_SCALE = 0.5
SMALL_COHORT_SEED = 0


@pytest.fixture(scope="session")
def small_cohort(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return a data directory holding a small generated ABIDE cohort (read-only use).

    The directory contains ``ABIDE_pcp/`` in the PCP layout (phenotypic CSV and
    ``cpac/filt_noglobal/*_rois_ho.1D``) for the four FedBN sites ``NYU, UM_1, USM,
    UCLA_1`` at half the real size (``n_subjects_scale=0.5``, seed 0, ``site_effect=1``):
    about 190 subjects pass quality control, a few per site have the all-zero ROI 3455,
    and some rows are ``no_filename`` or fail QC, as in the real table. Pass it as
    ``data_dir`` to the loaders, e.g. ``load_abide(small_cohort)``; the feature cache
    lands in ``<small_cohort>/cache`` and is shared by the whole session. Do not modify
    its files: copy what a test needs to corrupt into ``tmp_path``.
    """
    root = tmp_path_factory.mktemp("small_cohort")
    return generate_cohort(
        root,
        sites=DEFAULT_SITE_IDS,
        seed=SMALL_COHORT_SEED,
        site_effect=1.0,
        n_subjects_scale=SMALL_COHORT_SCALE,
    )


@pytest.fixture(scope="session", autouse=True)
def _mlflow_template_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Make the tests' empty MLflow store (:mod:`tests.stores`) in this session's temp dir.

    Only the folder is chosen here; the store is made the first time a test asks for one.
    """
    stores.TEMPLATE_DIR = tmp_path_factory.mktemp("mlflow_template")


BENCH_DIR = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture()
def benchmark_module(monkeypatch: pytest.MonkeyPatch, tmp_path: Path
                     ) -> Callable[[str], ModuleType]:
    """Return a loader of ``benchmarks/<name>.py`` modules for one test.

    The built-in data (if a benchmark generates any) land in ``tmp_path``, no MLflow
    store comes from the environment, and ``benchmarks/`` is importable.
    """
    monkeypatch.setenv("FEDBN_MED_DATA", str(tmp_path / "builtin"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.syspath_prepend(str(BENCH_DIR))
    return importlib.import_module


@pytest.fixture()
def patched_flower(monkeypatch):
    # The server builds its messages as a ServerApp does: Flower wants its run identity.
    from flwr.supercore.task_identity import TaskIdentity

    for name, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)
