"""The task contract: what every task exports, and the generic code that reads it.

The round-selecting metric of each task's registry entry is its objective's; the
comparison's ``best_round`` takes it; the benchmark harness builds ABIDE sites through
the registry (``site_data`` then ``build_site(..., data=...)``) on the same data as the
task's own builder.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from fedbn_med.evaluation.comparison import Cell, best_round
from fedbn_med.tasks import TASK_NAMES, Selection, get_task

BENCH_DIR = Path(__file__).resolve().parent.parent / "benchmarks"

ROWS = [  # val loss lowest at round 2, val Dice highest at round 3
    {"round": 1, "site": "A", "val_loss": 0.9, "val_dice": 0.2, "test_dice": 0.1},
    {"round": 1, "site": "B", "val_loss": 0.8, "val_dice": 0.3, "test_dice": 0.2},
    {"round": 2, "site": "A", "val_loss": 0.5, "val_dice": 0.4, "test_dice": 0.3},
    {"round": 2, "site": "B", "val_loss": 0.5, "val_dice": 0.4, "test_dice": 0.4},
    {"round": 3, "site": "A", "val_loss": 0.6, "val_dice": 0.6, "test_dice": 0.5},
    {"round": 3, "site": "B", "val_loss": 0.7, "val_dice": 0.5, "test_dice": 0.6},
]


def test_best_round_takes_a_metric_and_its_direction() -> None:
    assert best_round(ROWS) == 2  # default: the lowest validation loss
    assert best_round(ROWS, "dice") == 3  # a score: highest by default
    assert best_round(ROWS, "dice", lower=True) == 1
    assert best_round(ROWS, "loss", lower=False) == 1


def test_cell_selects_its_round_with_the_task_selection() -> None:
    by_loss = Cell.from_rows("FedBN", 0, 0, ROWS, metrics=("dice",))
    by_dice = Cell.from_rows("FedBN", 0, 0, ROWS, metrics=("dice",),
                             selection=Selection("dice", lower=False))
    assert (by_loss.best_round, by_dice.best_round) == (2, 3)
    assert by_loss.scores["best"]["dice"]["mean"] == pytest.approx(0.35)
    assert by_dice.scores["best"]["dice"]["mean"] == pytest.approx(0.55)


@pytest.mark.parametrize("name", TASK_NAMES)
def test_every_task_exports_the_contract(name: str) -> None:
    task = get_task(name)
    assert task.selection.metric in task.score_metrics
    assert task.headline in task.score_metrics
    assert task.build_pooled is not None  # every task has a Centralized baseline


def test_task_selection_is_its_objective_selection() -> None:
    from fedbn_med.tasks.mri.objective import Segmentation
    from fedbn_med.tasks.xray.objective import Classification
    from fedbn_med.training.objective import BinaryClassification

    assert get_task("abide").selection == BinaryClassification.selection == Selection()
    assert get_task("mri").selection == Segmentation.selection == Selection("loss", lower=True)
    assert get_task("xray").selection == Classification.selection
    assert (get_task("abide").headline, get_task("mri").headline) == ("accuracy", "dice")


def test_benchmark_run_builds_sites_through_the_registry(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FEDBN_MED_DATA", str(tmp_path))
    monkeypatch.syspath_prepend(str(BENCH_DIR))
    monkeypatch.syspath_prepend(str(BENCH_DIR / "research"))
    sys.modules.pop("_common", None)
    import _common

    from fedbn_med.spec import RunSpec
    from fedbn_med.tasks.abide.build import build_trainer, prepare_site_data
    from fedbn_med.tasks.abide.sites import load_sites

    spec = RunSpec(rounds=1, sites=("NYU", "UM"), strategy="fedbn")
    datas = _common.prepare_all(spec)
    sites = load_sites(list(spec.sites))
    for name, data in datas.items():
        own = prepare_site_data(sites[name], spec)
        assert torch.equal(data.train[0], own.train[0])
        assert torch.equal(data.test[1], own.test[1])
        via_task = get_task("abide").build_site(name, spec, None, "cpu", data=data)
        direct = build_trainer(sites[name], spec, data, device="cpu")
        assert via_task.data is data
        for key, value in direct.model.state_dict().items():
            assert torch.equal(value, via_task.model.state_dict()[key])
    from fedbn_med import run

    result = run(spec.replace(strategy="centralized"), data=datas, workdir=tmp_path / "run")
    assert result.last_round == 1
    assert {r["site"] for r in result.rows} == {"NYU", "UM"}


def test_prepare_all_refuses_a_task_without_site_data() -> None:
    sys.path.insert(0, str(BENCH_DIR))
    try:
        import _common
    finally:
        sys.path.remove(str(BENCH_DIR))
    from fedbn_med.spec import RunSpec

    with pytest.raises(ValueError, match="Task 'mri' builds its sites' data inside "
                                         "build_site only"):
        _common.prepare_all(RunSpec.for_task("mri"))


def test_drift_settings_take_score_and_target_from_the_task(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.syspath_prepend(str(BENCH_DIR))
    monkeypatch.syspath_prepend(str(BENCH_DIR / "research"))
    sys.modules.pop("drift", None)
    import drift
    from _common import Benchmark

    bench = Benchmark(drift.parser(), ["--quick", "--out", str(tmp_path),
                                       "--target-dice", "0.4"])
    settings = drift.settings_of(bench)
    assert [s.name for s in settings] == ["ABIDE E=1", "ABIDE E=8", "MRI"]
    assert [s.metric for s in settings] == ["accuracy", "accuracy", "dice"]
    assert [s.labels()[0] for s in settings] == ["acc", "acc", "Dice"]
    assert [s.target for s in settings] == [0.6, 0.6, 0.4]
    mri = settings[2].spec("fedbn", None, 0)
    assert (mri.task, mri.strategy, mri.rounds) == ("mri", "fedbn", 3)
    assert settings[1].spec("fedprox", 0.01, 0).local_epochs == 8
    no_mri = Benchmark(drift.parser(), ["--quick", "--out", str(tmp_path), "--no-mri"])
    assert [s.name for s in drift.settings_of(no_mri)] == ["ABIDE E=1", "ABIDE E=8"]
