"""Shared fixtures: one small built-in ABIDE-format cohort per test session."""

from __future__ import annotations

import tests.one_thread  # noqa: F401  (first: libraries read their thread count as they load)

# isort: split
import fedbn_med.numerics.pinned  # noqa: F401  (numpy reads its pin when it loads)

# isort: split
import importlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

from fedbn_med.federation.launcher import apphost_client
from fedbn_med.federation.launcher.processes import terminate_tree
from fedbn_med.federation.telemetry import telemetry_off
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
def _serverapp_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One host of Flower's commands for every federation this test worker starts.

    Each federation would otherwise start its own (:mod:`fedbn_med.federation.launcher.
    apphost`) and load the ServerApp's stack again: the in-process ones, and those of the
    commands the tests run (they inherit ``FEDBN_MED_SERVERAPP_HOST``). It starts now and
    loads while the first tests run, with the telemetry settings a federation gives its
    processes (a command with other start-up settings is left to Flower's own).
    """
    if os.environ.get(apphost_client.ENV_VAR, "").lower() == "off":  # asked for none
        yield
        return
    folder = Path(tempfile.mkdtemp(prefix="fedbn-apphost-"))  # private, and a short path
    sock = folder / "serverapp.sock"
    log = tmp_path_factory.mktemp("serverapp_host") / "host.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # as a federation's processes have it
    telemetry_off(env)
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "fedbn_med.federation.launcher.apphost",
                                 "--socket", str(sock)], stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, env=env)
    deadline = time.monotonic() + 60
    while not sock.is_socket():  # it listens first, then loads
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"The tests' ServerApp host did not start:\n{log.read_text()}")
        time.sleep(0.05)
    old = os.environ.get(apphost_client.ENV_VAR)
    os.environ[apphost_client.ENV_VAR] = str(sock)
    yield
    if old is None:
        os.environ.pop(apphost_client.ENV_VAR, None)
    else:
        os.environ[apphost_client.ENV_VAR] = old
    terminate_tree(proc.pid, signal.SIGTERM, 10.0)
    shutil.rmtree(folder, ignore_errors=True)


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
    monkeypatch.syspath_prepend(str(BENCH_DIR / "research"))
    return importlib.import_module


#: The MLflow experiment of the benchmark scripts (``benchmarks/_common.py``).
BENCH_EXPERIMENT = "abide-benchmarks"
#: Sites (ABIDE SITE_IDs) and subjects of :func:`abide_release`: the paper's four and the
#: two shared real sites the real-data benchmarks take first (PITT, YALE).
RELEASE_SITES = {"NYU": 16, "UM_1": 16, "USM": 16, "UCLA_1": 16, "PITT": 16, "YALE": 16}


@pytest.fixture(scope="session")
def bench_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return the data folder shared by every benchmark test (the cohort lands there)."""
    return tmp_path_factory.mktemp("bench_data")


@pytest.fixture()
def bench(monkeypatch: pytest.MonkeyPatch, bench_data: Path) -> Callable[[str], ModuleType]:
    """Return a loader of benchmark modules, with the session's data folder in the env."""
    monkeypatch.setenv("FEDBN_MED_DATA", str(bench_data))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.syspath_prepend(str(BENCH_DIR))
    monkeypatch.syspath_prepend(str(BENCH_DIR / "research"))
    return importlib.import_module


@pytest.fixture(scope="session")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Return a sqlite store for the session; its experiment keeps artifacts beside it.

    One store for all tests (each script logs one run, found by its tag): creating a
    sqlite store runs MLflow's migrations, which takes seconds.
    """
    from mlflow.tracking import MlflowClient

    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    MlflowClient(tracking_uri=uri).create_experiment(
        BENCH_EXPERIMENT, artifact_location=(root / "artifacts").as_uri())
    return uri


@pytest.fixture(scope="session")
def abide_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return a tiny release in the real ABIDE Preprocessed layout (read-only use).

    :func:`tests.test_determinism.write_release` writes it for :data:`RELEASE_SITES`, 16
    subjects each: pass it as ``--data-dir`` to a benchmark that reads real data.
    """
    from tests.test_determinism import write_release

    return write_release(tmp_path_factory.mktemp("abide_release"), RELEASE_SITES, seed=2)


@pytest.fixture()
def patched_flower(monkeypatch):
    # The server builds its messages as a ServerApp does: Flower wants its run identity.
    from flwr.supercore.task_identity import TaskIdentity

    for name, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)
