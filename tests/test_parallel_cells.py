"""A comparison's cells in several processes give the numbers of one process."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedbn_med.evaluation.parallel import default_workers, run_cells
from fedbn_med.numerics.cores import CORES_ENV_VAR, usable_cores
from fedbn_med.spec import RunSpec


def test_cells_in_two_processes_give_the_same_numbers(small_cohort: Path,
                                                      tmp_path: Path) -> None:
    # the linear model: the cheapest run that still has site-private BN statistics
    specs = [RunSpec.for_task("abide", strategy="fedbn:linear", fold=f, seed=s, rounds=2,
                              data_dir=small_cohort, sites=("UM", "UCLA"))
             for f in (0, 1) for s in (0, 1)]
    done: list[int] = []
    one = run_cells(specs, workers=1, tracking_uri=f"sqlite:///{tmp_path / 'one.db'}")
    two = run_cells(specs, workers=2, tracking_uri=f"sqlite:///{tmp_path / 'two.db'}",
                    on_cell=done.append)
    assert done == [1, 1, 1, 1]  # four cells of one run each
    for a, b in zip(one, two):
        assert a.strategy == b.strategy
        assert a.rows == b.rows  # every round's every score, to the bit
        assert sorted(a.predictions) == ["UCLA", "UM"]
        for site, p in a.predictions.items():
            assert np.array_equal(p.prob, b.predictions[site].prob)
    with pytest.raises(ValueError, match="workers must be a positive integer, got 0"):
        run_cells(specs, workers=0)


def test_default_workers_are_the_cores_and_at_most_the_cells() -> None:
    one_cell = [RunSpec.for_task("abide", strategy=s) for s in ("fedavg", "fedbn")]
    assert default_workers(one_cell) == 1
    assert default_workers([]) == 1
    many = [RunSpec.for_task("abide", fold=f) for f in range(5)]
    assert 1 <= default_workers(many) <= 5


def test_fedbn_med_cores_caps_the_cores_and_a_bad_value_is_named(monkeypatch) -> None:
    many = [RunSpec.for_task("abide", fold=f) for f in range(5)]
    monkeypatch.setattr("os.sched_getaffinity", lambda _: {0, 1, 2, 3})
    monkeypatch.delenv(CORES_ENV_VAR, raising=False)
    assert usable_cores() == 4 and default_workers(many) == 4
    monkeypatch.setenv(CORES_ENV_VAR, "2")
    assert usable_cores() == 2 and default_workers(many) == 2
    monkeypatch.setenv(CORES_ENV_VAR, "16")  # never more than the process may run on
    assert usable_cores() == 4
    for bad in ("0", "-1", "two", "1.5"):
        monkeypatch.setenv(CORES_ENV_VAR, bad)
        with pytest.raises(ValueError, match=rf"FEDBN_MED_CORES='{bad}': expected a positive"):
            usable_cores()
