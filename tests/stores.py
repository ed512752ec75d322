"""MLflow sqlite stores for the tests: each run its own, without building the schema again.

A new sqlite store costs MLflow its whole schema migration (alembic, tens of revisions):
about 7 s on a busy 2-core machine, paid by the ServerApp before round 1 of every run
that logs into a fresh file. :func:`sqlite_store` gives each test its own file as
before, copied from one empty store that MLflow migrated once per test session, so the
store every test reads is still a real MLflow sqlite store, at MLflow's current schema.
The README's own commands (``tests/test_docs_commands.py``) still create their store
from nothing, in ``./mlflow/`` as a user's would, so that path stays covered end to end.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

__all__ = ["sqlite_store"]

_lock = threading.Lock()
_template: Path | None = None
#: Where the empty store is made; the session fixture in conftest.py sets it.
TEMPLATE_DIR: Path | None = None

_MIGRATE = ("import sys; from mlflow.tracking import MlflowClient; "
            "MlflowClient(tracking_uri='sqlite:///' + sys.argv[1]).search_experiments("
            "max_results=1)")


def _empty_store() -> Path:
    """Return an empty store MLflow has migrated (made once, in a process of its own).

    A process of its own: nothing holds the file open when it is copied.
    """
    global _template
    with _lock:
        if _template is None:
            folder = TEMPLATE_DIR or Path(tempfile.mkdtemp(prefix="mlflow-template-"))
            path = folder / "empty-mlflow.db"
            done = subprocess.run([sys.executable, "-c", _MIGRATE, str(path)],
                                  capture_output=True, text=True, timeout=300, check=False)
            if done.returncode != 0 or not path.exists():
                raise RuntimeError(f"MLflow could not create an empty store at {path}:\n"
                                   f"{done.stderr[-2000:]}")
            _template = path
        return _template


def sqlite_store(path: Path) -> str:
    """Return the URI of the sqlite store ``path``, made as an empty migrated one if absent.

    An existing file (a resumed run's store, say) is left as it is.
    """
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_empty_store(), path)
    return f"sqlite:///{path}"
