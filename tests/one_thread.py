"""Import first (tests/conftest.py): one thread per test process for BLAS, OpenMP and torch.

The suite runs on three workers (pyproject.toml). On a 2-core machine each test process,
and every process it starts, takes one thread for BLAS, OpenMP and torch unless a test
says otherwise: two threads per worker only wait on each other while the workers are
busy (an eigendecomposition of the nested sweep took 8-24 ms on two threads against 1 ms
on one). The pinned numerics give the same numbers on any count (tests/test_determinism.py
runs 1 against 2 threads). For the same reason an in-process run's sites, and a
comparison's cells, take turns on one core (``FEDBN_MED_CORES=1``): the main job's sites
trained in 19.8 CPU-s on two threads against 13.9 CPU-s one after the other (the GIL;
measured on 2026-12-07), and both cores are the workers' already. A test that is about
sites at once says so itself. A variable already set, in CI or by a user, is kept.
"""

from __future__ import annotations

import os

for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
              "FEDBN_MED_CORES"):
    os.environ.setdefault(_name, "1")
