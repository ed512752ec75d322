"""A short in-process federation of each imaging task: FedBN keeps MONAI's BN layers home."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import fedbn_med
from fedbn_med.spec import RunSpec
from fedbn_med.tasks import get_task
from fedbn_med.training.inprocess import run_in_process

TINY = {
    "mri": (("SiteA", "SiteC"), {"image_size": 16, "subjects": 6, "slices": 4},
            ("adn",), ".adn.N."),
    "xray": (("HospitalA", "HospitalB"), {"image_size": 32, "subjects": 6},
             ("norm",), "features.norm0."),
}


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One data root for the module: each tiny built-in site is generated once."""
    return tmp_path_factory.mktemp("imaging_data")


@pytest.mark.parametrize("task_name", sorted(TINY))
def test_fedbn_keeps_bn_private_and_shares_the_rest(task_name: str, data_root: Path) -> None:
    sites, extra, bn_names, required = TINY[task_name]
    config = RunSpec.for_task(task_name, strategy="fedbn", rounds=2, batch_size=2, lr=1e-3,
                              sites=sites, device="cpu", **extra)
    task = get_task(task_name)
    trainers = {s: task.build_site(s, config, data_root, "cpu") for s in sites}
    history = run_in_process(trainers, config.strategy_obj(), config.rounds)
    a, b = (trainers[s] for s in sites)
    private = a.partition.private
    # MONAI's names (adn.N, norm0): found by type, since no name contains "bn".
    assert all(any(n in k for n in bn_names) for k in private), sorted(private)[:4]
    assert any(required in k for k in private)
    state_a, state_b = a.model.state_dict(), b.model.state_dict()
    for key in a.partition.shared:
        assert torch.equal(state_a[key], state_b[key]), key
    assert any(not torch.equal(state_a[k], state_b[k]) for k in private
               if k.endswith("running_mean"))
    assert set(history.global_weights) == set(a.partition.shared)
    metric = "test_dice" if task_name == "mri" else "test_auc"
    assert all(metric in m for m in history.final().values())


def test_fedavg_exchanges_bn_too(data_root: Path) -> None:
    sites, extra, _, _ = TINY["mri"]
    config = RunSpec.for_task("mri", strategy="fedavg", rounds=1, batch_size=2, lr=1e-3,
                              sites=sites, device="cpu", **extra)
    task = get_task("mri")
    trainers = {s: task.build_site(s, config, data_root, "cpu") for s in sites}
    history = run_in_process(trainers, config.strategy_obj(), 1)
    a = trainers[sites[0]]
    assert a.partition.private <= set(history.global_weights)


def test_tracked_run_has_parent_and_site_runs(data_root: Path, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    sites, extra, _, _ = TINY["mri"]
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # FedAvg: the logged global weights hold the BN tensors, which are shared there.
    config = RunSpec.for_task("mri", strategy="fedavg", rounds=2, batch_size=2, sites=sites,
                              device="cpu", data_dir=data_root, **extra)
    fedbn_med.run(config, tracking_uri=store, workdir=tmp_path / "run")
    client = MlflowClient(tracking_uri=store)
    exp = client.get_experiment_by_name("mri-fedbn")
    runs = client.search_runs([exp.experiment_id])
    children = [r for r in runs if r.data.tags.get("kind") == "site"]
    assert sorted(r.data.tags["site"] for r in children) == sorted(sites)
    steps = client.get_metric_history(children[0].info.run_id, "test_dice_gm")
    assert [m.step for m in steps] == [1, 2]
    parent = next(r for r in runs if r.data.tags.get("kind") == "federation")
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} >= {"model",
                                                                          "results.md"}


def test_imaging_settings_errors() -> None:
    with pytest.raises(ValueError, match="image_size must be a multiple of 8 and at least 16, "
                                         "got 20"):
        RunSpec.for_task("mri", image_size=20)
    with pytest.raises(ValueError, match="subjects must be a positive integer, got 'many'"):
        RunSpec.for_task("xray", subjects="many")
    with pytest.raises(ValueError, match="cache must be true or false, got 'yes'"):
        RunSpec.for_task("mri", cache="yes")
