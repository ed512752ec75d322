"""One builder of in-process federations: every caller gets every setting of its spec.

``training.inprocess.build_federation`` is the one place a run spec becomes site trainers
and a round loop; the benchmarks, onboarding and the evaluation runner go through it. A
caller that dropped a setting (the weighting, the task's selection) fails here.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from fedbn_med import tasks
from fedbn_med.evaluation.comparison import best_round
from fedbn_med.evaluation.runner import run_cell, task_metrics
from fedbn_med.onboarding.weights import train_federation
from fedbn_med.spec import RunSpec
from fedbn_med.tasks import Selection, get_task
from fedbn_med.training.data import SiteData
from fedbn_med.training.inprocess import build_federation

#: Two ABIDE site files with very unequal tiny data: the weighting changes the average.
SIZES = {"NYU": 48, "UM": 12}
#: The smallest MRI federation the built-in data allow (2D slices of 16 x 16 pixels).
TINY_MRI = {"sites": ("SiteA", "SiteC"), "image_size": 16, "subjects": 6, "mode": "2d",
            "slices": 2, "batch_size": 2, "lr": 1e-3, "rounds": 2, "device": "cpu"}


def _site_data(n_train: int, seed: int, d: int = 12) -> SiteData:
    gen = torch.Generator().manual_seed(seed)
    n = n_train + 16
    y = torch.randint(0, 2, (n,), generator=gen)
    x = torch.randn(n, d, generator=gen) * (1 + seed) + 2.0 * seed
    x[:, 0] += 1.5 * y
    return SiteData(train=(x[:n_train], y[:n_train]), val=(x[n_train:n_train + 8],
                                                           y[n_train:n_train + 8]),
                    test=(x[n_train + 8:], y[n_train + 8:]))


@pytest.fixture(scope="module")
def datas() -> dict[str, SiteData]:
    return {site: _site_data(n, i) for i, (site, n) in enumerate(SIZES.items())}


def _spec(**changes: object) -> RunSpec:
    return RunSpec.for_task("abide", **{"sites": tuple(SIZES), "strategy": "fedavg",
                                        "rounds": 2, "device": "cpu", **changes})


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_builder_runs_the_spec_weighting_and_rounds(datas: dict[str, SiteData]) -> None:
    by_samples = build_federation(_spec(), datas).run(evaluate=False)
    equal = build_federation(_spec(weighting="equal"), datas).run(evaluate=False)
    assert by_samples.rounds == equal.rounds == 2
    assert not _same(by_samples.global_weights, equal.global_weights)
    again = build_federation(_spec(rounds=3), datas).run(evaluate=False)
    assert again.rounds == 3


@pytest.mark.parametrize("weighting", ["samples", "equal"])
def test_onboarding_trains_the_builders_federation(datas: dict[str, SiteData],
                                                   weighting: str) -> None:
    # train_federation once ignored the weighting: "equal" gave the "samples" weights
    spec = _spec(weighting=weighting)
    reference = build_federation(spec, datas).run(evaluate=False).global_weights
    trained = train_federation(spec, datas).weights.weights
    assert _same(dict(trained), reference)


def test_a_run_on_given_data_is_the_builders_run(datas: dict[str, SiteData],
                                                tmp_path: Path) -> None:
    # what the benchmarks do: fedbn_med.run on a subsample of each site's data
    from fedbn_med import run
    from fedbn_med.checkpoint import load_tensors

    for i, spec in enumerate((_spec(), _spec(weighting="equal", strategy="fedbn"))):
        result = run(spec, data=datas, workdir=tmp_path / str(i))
        reference = build_federation(spec, datas).run()
        assert result.rows == tuple(reference.rows)
        assert result.selected_round == reference.selected_round
        shared, meta = load_tensors(tmp_path / str(i) / "shared.selected.safetensors")
        assert meta["round"] == reference.selected_round
        assert _same(shared, reference.selected_weights)
    with pytest.raises(ValueError, match="data= needs engine='inprocess'"):
        run(_spec(), data=datas, engine="flower")


def test_given_data_must_cover_every_site_of_a_task_that_takes_data(
        datas: dict[str, SiteData]) -> None:
    with pytest.raises(ValueError, match=r"No data given for site\(s\) UM; expected data "
                                         "for every site of the run: NYU, UM"):
        build_federation(_spec(), {"NYU": datas["NYU"]})
    mri = RunSpec.for_task("mri", sites=("SiteA",), rounds=1, device="cpu")
    with pytest.raises(ValueError, match="Task 'mri' builds its sites' data inside "
                                         "build_site only"):
        build_federation(mri, {"SiteA": datas["NYU"]})


@pytest.fixture(scope="module")
def mri_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunSpec, list[dict]]:
    """A 2-round MRI run's spec and rows, on tiny built-in data made for this module."""
    spec = RunSpec.for_task("mri", strategy="fedbn",
                            data_dir=tmp_path_factory.mktemp("mri_data"), **TINY_MRI)
    history = build_federation(spec).run()
    return spec, history.rows


def test_run_cell_and_the_command_line_select_by_the_task(
        mri_run: tuple[RunSpec, list[dict]], monkeypatch: pytest.MonkeyPatch) -> None:
    from fedbn_med.api.result import FederationResult
    from fedbn_med.cli.results import _comparison

    spec, rows = mri_run
    # the task's own rule (lowest validation loss) and its reverse, which must pick
    # another round: the cell follows whichever the task registers
    lowest = best_round(rows, "loss", lower=True)
    highest = best_round(rows, "loss", lower=False)
    assert lowest != highest
    assert get_task("mri").selection == Selection("loss", lower=True)
    monkeypatch.setitem(tasks._TASKS, "mri", dataclasses.replace(
        get_task("mri"), selection=Selection("loss", lower=False)))
    cell = run_cell(spec)
    printed_run = FederationResult.from_mapping({"strategy": "fedbn", "rows": rows},
                                                spec.sites, engine="inprocess")
    (printed,) = [c for c in _comparison([spec], [printed_run]).cells if not c.reference]
    for got in (cell, printed):
        assert got.best_round == highest
        assert set(got.scores["best"]) == set(task_metrics("mri"))
        dice = [float(r["test_dice"]) for r in rows if r["round"] == highest]
        assert math.isclose(got.scores["best"]["dice"]["mean"], sum(dice) / len(dice),
                            rel_tol=1e-6)
    assert "dice" in task_metrics("mri") and "balanced_accuracy" not in task_metrics("mri")
