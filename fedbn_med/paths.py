"""Resolve where fedbn_med keeps its data, the way nilearn does.

The data directory is taken from, in order: the argument, the environment variable
``FEDBN_MED_DATA``, then ``~/fedbn_med_data``; it never depends on the current working
directory. The default MLflow store does (:func:`default_tracking_uri`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

__all__ = ["DATA_ENV_VAR", "DEFAULT_DATA_DIR", "default_tracking_uri", "repo_root",
           "resolve_data_dir", "runs_page", "seed_store", "sqlite_file"]

logger = logging.getLogger(__name__)

DATA_ENV_VAR = "FEDBN_MED_DATA"
DEFAULT_DATA_DIR = "~/fedbn_med_data"


def resolve_data_dir(data_dir: str | Path | None = None) -> Path:
    """Return the absolute data directory: argument, then environment, then home default.

    Parameters
    ----------
    data_dir : str or pathlib.Path or None, default=None
        Explicit directory. When None, the environment variable ``FEDBN_MED_DATA`` is used
        if set and not empty, else ``~/fedbn_med_data``.

    Returns
    -------
    pathlib.Path
        The directory, with ``~`` expanded and made absolute. It is not created.

    Raises
    ------
    TypeError
        If ``data_dir`` is neither a string, a path nor None.
    ValueError
        If ``data_dir`` is an empty string.
    """
    if data_dir is None:
        chosen = os.environ.get(DATA_ENV_VAR) or DEFAULT_DATA_DIR
    elif isinstance(data_dir, (str, os.PathLike)):
        chosen = os.fspath(data_dir)
        if not str(chosen).strip():
            raise ValueError(
                "Expected a data directory path, got an empty string. Pass a directory, "
                f"or None to use ${DATA_ENV_VAR} or {DEFAULT_DATA_DIR}."
            )
    else:
        raise TypeError(
            f"Expected data_dir as str, pathlib.Path or None, got {type(data_dir).__name__}."
        )
    return Path(chosen).expanduser().absolute()


def repo_root() -> Path:
    """Return the directory that contains the ``fedbn_med`` package.

    Returns
    -------
    pathlib.Path
        The parent of the package directory (the repository root in a source checkout).
    """
    return Path(__file__).resolve().parent.parent


def default_tracking_uri() -> str:
    """Return ``$MLFLOW_TRACKING_URI``, else the sqlite store ``mlflow/mlflow.db`` here.

    Here is the working directory (in a clone, its root), never the installed package.
    It lives here, not in :mod:`fedbn_med.tracking`, so that naming the store does not
    import MLflow: a command imports it on its tracking thread, beside the training.
    """
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    store = Path.cwd() / "mlflow"
    store.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{store / 'mlflow.db'}"


def sqlite_file(tracking_uri: str) -> Path | None:
    """Return the database file of a ``sqlite:///`` MLflow store, None for any other URI."""
    prefix = "sqlite:///"
    return Path(tracking_uri[len(prefix):]) if tracking_uri.startswith(prefix) else None


def runs_page(tracking_uri: str, run_id: str | None, port: int = 5000) -> str:
    """Return how to open a run's experiment in MLflow's web UI, on its runs list.

    MLflow 3.17 opens an experiment on its GenAI view unless the address asks for the
    training workflow (``workflowType=machine_learning``); a sqlite store needs ``mlflow ui``.
    A sqlite store is read directly (the run's row): a command that ran its federation
    over Flower need not import MLflow, about 2 s of CPU, to print this line.
    """
    experiment = _run_experiment(tracking_uri, run_id)
    path = f"/#/experiments/{experiment}/runs?workflowType=machine_learning"
    if tracking_uri.startswith(("http://", "https://")):
        return f"open {tracking_uri.rstrip('/')}{path}"
    # MLflow's UI reports usage, the browser's too, unless told not to
    # (fedbn_med.federation.telemetry)
    return (f"MLFLOW_DISABLE_TELEMETRY=true mlflow ui --port {port} --backend-store-uri "
            f"{tracking_uri}\n"
            f"  then open http://127.0.0.1:{port}{path}")


def _run_experiment(tracking_uri: str, run_id: str | None) -> str:
    """Return the experiment ID of ``run_id`` ("0" when it cannot be found: a hint only)."""
    if not run_id:
        return "0"
    store = sqlite_file(tracking_uri)
    if store is not None:
        store = store.resolve()  # relative: to this folder, as MLflow reads it
        if not store.is_file():
            return "0"  # no store there (asking MLflow would make one)
        try:
            with contextlib.closing(sqlite3.connect(f"{store.as_uri()}?mode=ro",
                                                    uri=True)) as db:
                row = db.execute("SELECT experiment_id FROM runs WHERE run_uuid = ?",
                                 (str(run_id),)).fetchone()
            if row is not None:
                return str(row[0])
        except (sqlite3.Error, ValueError):
            pass  # not MLflow's schema as we know it: ask MLflow
    try:
        from mlflow.tracking import MlflowClient

        return str(MlflowClient(tracking_uri=tracking_uri).get_run(str(run_id)).info
                   .experiment_id)
    except Exception:  # noqa: BLE001 - a hint only; a store gone
        return "0"


def seed_store(tracking_uri: str) -> None:
    """Start a new sqlite MLflow store as a copy of an empty, already migrated one.

    MLflow makes a new sqlite store by running every schema migration of its history,
    about a second of CPU in each process that opens a new store (every first run in a
    folder, and most tests). The first new store made on a machine, per MLflow version,
    is kept without its ``Default`` experiment as ``~/.cache/fedbn_med/mlflow-<version>-
    empty.db`` (``$XDG_CACHE_HOME`` if set); each later new store starts as a copy of it,
    and MLflow then adds its ``Default`` experiment as to any empty store. A store that
    exists, or any other URI, is left alone; on any failure MLflow makes the store as
    it always does.
    """
    path = sqlite_file(tracking_uri)
    if path is None or path.exists():
        return
    try:
        template = _empty_store()
        path.parent.mkdir(parents=True, exist_ok=True)
        seed = path.with_name(f".{path.name}.{os.getpid()}.seed")
        shutil.copyfile(template, seed)
        try:
            os.link(seed, path)  # only if no other process has made the store meanwhile
        except FileExistsError:
            pass
        finally:
            seed.unlink(missing_ok=True)
    except Exception as err:  # noqa: BLE001 - MLflow makes the store itself
        logger.debug("MLflow makes the store %s itself: %s", path, err)


def _empty_store() -> Path:
    """Return the migrated, empty store of this MLflow version (made on first use)."""
    from mlflow.tracking import MlflowClient

    import mlflow

    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fedbn_med"
    template = cache / f"mlflow-{mlflow.__version__}-empty.db"
    if template.is_file():
        return template
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        made = Path(tmp) / "store.db"
        MlflowClient(f"sqlite:///{made}").search_experiments(max_results=1)  # migrates
        with contextlib.closing(sqlite3.connect(made)) as db:
            db.execute("DELETE FROM experiments WHERE experiment_id = 0")  # MLflow's own
            db.commit()
        os.replace(made, template)  # whole, or not at all, for every other process
    return template
