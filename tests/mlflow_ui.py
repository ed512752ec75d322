"""A real ``mlflow server`` on 127.0.0.1 for tests: started on a free port, always stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fedbn_med.federation.launcher import free_port


@contextmanager
def mlflow_server(store: Path, artifacts: Path) -> Iterator[str]:
    """Serve the sqlite ``store``; yield its base URL; stop the server and its workers."""
    port = free_port()
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1", "--backend-store-uri", f"sqlite:///{store}",
         "--default-artifact-root", str(artifacts)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=5) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"mlflow server on port {port} did not come up") from None
                time.sleep(0.3)
        yield base
    finally:
        # The server forks workers; its own session holds them all.
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
