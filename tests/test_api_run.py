"""fedbn_med.run as the command line and the comparisons call it: one run, or many."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedbn_med import run
from fedbn_med.evaluation.runner import run_cell
from fedbn_med.spec import RunSpec


def _spec(cohort: Path, **changes: object) -> RunSpec:
    return RunSpec.for_task("abide", rounds=2, sites=("NYU", "UM"), data_dir=cohort,
                            device="cpu", **changes)


def test_a_comparison_keeps_each_subjects_prediction_and_matches_its_cells(
        small_cohort: Path, tmp_path: Path) -> None:
    specs = [_spec(small_cohort, strategy=s) for s in ("fedbn", "fedavg")]
    results = run(specs, workers=1, tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert [r.strategy for r in results] == ["fedbn", "fedavg"]
    for spec, result in zip(specs, results):
        # every method of the cell is scored on the same test subjects, by subject
        assert sorted(result.predictions) == ["NYU", "UM"] and result.n_test > 0
        assert result.run_id is not None and result.kept_weights == {}
        # the comparison's run is the run a benchmark's cell makes of the same spec
        cell = run_cell(spec)
        assert cell.best_round == result.selected_round
    test = [np.sort(r.predictions["NYU"].index) for r in results]
    np.testing.assert_array_equal(*test)


def test_what_run_refuses_names_what_it_takes(small_cohort: Path) -> None:
    spec = _spec(small_cohort)
    with pytest.raises(TypeError, match=r"a sequence of RunSpecs; it holds \['RunSpec', "
                                        r"'str'\]"):
        run([spec, "abide"])
    with pytest.raises(ValueError, match="at least one run spec"):
        run([])
    with pytest.raises(ValueError, match="Unknown engine 'ray'. Valid engines: inprocess, "
                                         "flower"):
        run(spec, engine="ray")
    with pytest.raises(ValueError, match="data= needs engine='inprocess'"):
        run(spec, engine="flower", data={})
