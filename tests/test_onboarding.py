from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient
from monai.networks.nets import DenseNet
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from fedbn_med.checkpoint import save_tensors
from fedbn_med.fl.partition import partition_model, select
from fedbn_med.fl.strategies import FedBN
from fedbn_med.onboarding import (
    CheckpointSource,
    FederationWeights,
    MlflowRunSource,
    OnboardingOptions,
    adapt_model,
    average_bn_affine,
    bn_affine_keys,
    check_site_fits,
    few_shot_indices,
    finetune_bn,
    load_bn_affine,
    log_onboarding,
    onboard,
    onboard_new_site,
    save_bn_affine,
)
from fedbn_med.spec import RunSpec
from fedbn_med.tasks.abide.model import AbideMLP
from fedbn_med.tasks.abide.sites import load_site
from fedbn_med.training.trainer import SiteData, SiteTrainer

REPO = Path(__file__).resolve().parent.parent
D = 12


def _site_data(shift: float, scale: float, seed: int, n: int = 80, d: int = D) -> SiteData:
    gen = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 2
    x = torch.randn(n, d, generator=gen)
    x[:, 0] += 1.5 * y
    x = x * scale + shift  # the new site's scanner
    cut1, cut2 = int(0.6 * n), int(0.8 * n)
    return SiteData(train=(x[:cut1], y[:cut1]), val=(x[cut1:cut2], y[cut1:cut2]),
                    test=(x[cut2:], y[cut2:]))


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """One real sqlite MLflow store for the module (creating one takes seconds)."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return AbideMLP(D)


def _densenet() -> nn.Module:
    torch.manual_seed(0)
    return DenseNet(spatial_dims=2, in_channels=1, out_channels=2, init_features=4,
                    growth_rate=4, block_config=(2,), bn_size=2)


ARCHS = {"abide_mlp": (_mlp, (D,)), "monai_densenet": (_densenet, (1, 16, 16))}


def _inputs(shape: tuple[int, ...], n: int = 40, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, *shape, generator=gen) * 3.0 + 2.0


def _federation(make_model, seed: int = 7) -> dict[str, torch.Tensor]:
    """Full weights of a 'trained' federation model: everything perturbed away from init."""
    torch.manual_seed(seed)
    model = make_model()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
        for m in model.modules():
            if isinstance(m, _BatchNorm):
                m.running_mean.fill_(0.5)
                m.running_var.fill_(2.0)
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_bn_statistics_come_from_the_site_and_shared_weights_from_the_federation(arch):
    make_model, shape = ARCHS[arch]
    full = _federation(make_model)
    partition = partition_model(make_model())
    shared = select(full, partition.shared)
    x = _inputs(shape)
    model = adapt_model(make_model(), shared, x)

    first_bn = next(m for m in model.modules() if isinstance(m, _BatchNorm))
    seen = []
    handle = first_bn.register_forward_pre_hook(lambda _m, inp: seen.append(inp[0].detach()))
    with torch.no_grad():
        model(x)  # eval mode: the first BN's input does not depend on any BN statistics
    handle.remove()
    dims = [0, *range(2, seen[0].ndim)]
    expected_mean = seen[0].double().mean(dim=dims)
    expected_var = seen[0].double().var(dim=dims, unbiased=True)
    assert not torch.allclose(first_bn.running_mean.double(), torch.full_like(expected_mean, 0.5))
    torch.testing.assert_close(first_bn.running_mean.double(), expected_mean, rtol=1e-4,
                               atol=1e-5)
    torch.testing.assert_close(first_bn.running_var.double(), expected_var, rtol=1e-4,
                               atol=1e-5)
    state = model.state_dict()
    for key in partition.shared:
        assert torch.equal(state[key], shared[key]), key
    for key in bn_affine_keys(model):  # reset: no averaged scale/shift was given
        expected = 1.0 if key.endswith("weight") else 0.0
        assert torch.all(state[key] == expected), key
    assert not model.training


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_bn_finetuning_changes_only_bn_scale_and_shift(arch):
    make_model, shape = ARCHS[arch]
    full = _federation(make_model)
    model = adapt_model(make_model(), full, _inputs(shape))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x, y = _inputs(shape, n=10, seed=3), torch.arange(10) % 2
    losses = finetune_bn(model, x, y, steps=5, lr=0.5)
    assert losses[-1] < losses[0]
    after = model.state_dict()
    affine = bn_affine_keys(model)
    assert affine and affine < partition_model(model).private
    for key, value in before.items():
        if key in affine:
            assert not torch.equal(value, after[key]), key
        else:  # shared weights and the estimated statistics stay as they were
            assert torch.equal(value, after[key]), key
    assert all(p.requires_grad for p in model.parameters())


def test_averaged_scale_shift_round_trip_and_use(tmp_path):
    trainers = {}
    for i, (site, (shift, scale)) in enumerate({"A": (0.0, 1.0), "B": (3.0, 2.0)}.items()):
        n = 60 if site == "A" else 30
        trainers[site] = SiteTrainer(site, _mlp(), _site_data(shift, scale, i, n=n), FedBN(),
                                     batch_size=16, device="cpu")
        trainers[site].fit({}, {"round": 1})
    affine = average_bn_affine(trainers.values())
    a, b = (t.private_state() for t in trainers.values())
    key = "net.1.N.weight"
    torch.testing.assert_close(affine[key], (a[key] * 36 + b[key] * 18) / 54)
    assert set(affine) == bn_affine_keys(trainers["A"].model)

    path = save_bn_affine(tmp_path / "affine.safetensors", affine, ["A", "B"])
    loaded = load_bn_affine(path)
    shared = trainers["A"].shared_weights()
    model = adapt_model(_mlp(), shared, _site_data(-2.0, 0.5, 5).train[0], affine=loaded)
    assert torch.equal(model.state_dict()[key], affine[key])

    save_tensors(tmp_path / "other.safetensors", shared, {"round": 1})
    with pytest.raises(ValueError, match="not a file of averaged BN scale and shift"):
        load_bn_affine(tmp_path / "other.safetensors")


def test_onboard_compares_every_method():
    full = _federation(_mlp)
    shared = select(full, partition_model(_mlp()).shared)
    sources = [FederationWeights(full, "fedavg test", strategy="fedavg"),
               FederationWeights(shared, "fedbn test", round=4, strategy="fedbn")]
    affine = select(full, bn_affine_keys(_mlp()))
    result = onboard("NEW", _site_data(-2.0, 0.5, 9), _mlp, sources, input_shape=(D,),
                     affine=affine, options=OnboardingOptions(shots=3, finetune_steps=5,
                                                              reference_epochs=3))
    assert list(result.metrics) == [
        "fedavg_as_is", "fedavg_local_bn", "fedavg_local_bn_finetune", "fedbn_local_bn_reset",
        "fedbn_local_bn", "fedbn_local_bn_finetune", "local_few_shot"]
    assert all(0.0 <= m["test_accuracy"] <= 1.0 for m in result.metrics.values())
    assert result.counts == {"unlabeled": 64, "labeled": 6, "test": 16}
    assert result.round == 4
    table = result.table()
    assert "(a) FedAvg global model as is" in table and "(c) FedBN" in table


def test_few_shot_draw_is_seeded_and_checked():
    labels = torch.tensor([0] * 7 + [1] * 3)
    idx = few_shot_indices(labels, 3, seed=1)
    assert torch.equal(idx, few_shot_indices(labels, 3, seed=1))
    assert sorted(labels[idx].tolist()) == [0, 0, 0, 1, 1, 1]
    with pytest.raises(ValueError, match=r"class 1 has only 3 .*Use shots <= 3"):
        few_shot_indices(labels, 4, seed=1)


def test_checkpoint_file_is_a_source(tmp_path):
    shared = select(_federation(_mlp), partition_model(_mlp()).shared)
    path = save_tensors(tmp_path / "server" / "global.safetensors", shared,
                        {"round": 3, "parent_run_id": "abc", "strategy": "fedbn"})
    loaded = CheckpointSource(path).load()
    assert (loaded.round, loaded.strategy, loaded.parent_run_id) == (3, "fedbn", "abc")
    assert all(torch.equal(loaded.weights[k], v) for k, v in shared.items())
    with pytest.raises(FileNotFoundError, match="No checkpoint"):
        CheckpointSource(tmp_path / "missing.safetensors").load()


def test_mlflow_run_is_a_source_and_the_site_gets_its_own_run(store):
    from fedbn_med.tracking import FederationTracker

    uri = store
    model = _mlp()
    partition = partition_model(model)
    shared = select(_federation(_mlp), partition.shared)
    tracker = FederationTracker("abide-fedbn", "fedbn", {"strategy": "fedbn", "rounds": 4},
                                ["NYU"], tracking_uri=uri)
    tracker.log_shared_weights(shared, partition.private)
    tracker.finish()

    loaded = MlflowRunSource(tracker.parent_id, uri).load()
    assert (loaded.strategy, loaded.round) == ("fedbn", 4)
    assert set(loaded.weights) == set(shared)
    assert all(torch.equal(loaded.weights[k], v) for k, v in shared.items())
    with pytest.raises(ValueError, match="has no artifact 'model/shared_weights.safetensors'"):
        MlflowRunSource(tracker.site_runs["NYU"], uri).load()

    result = onboard("PITT", _site_data(-2.0, 0.5, 9), _mlp, [loaded], input_shape=(D,),
                     options=OnboardingOptions(shots=0))
    run_id = log_onboarding(result, params={"k": 1}, tracking_uri=uri)
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    assert run.data.tags["site"] == "PITT" and run.data.tags["kind"] == "site"
    assert run.data.tags["first_round"] == "5"
    assert "fedbn_local_bn_test_accuracy" in run.data.metrics
    parent = client.get_run(run.data.tags["mlflow.parentRunId"])
    assert parent.data.tags["kind"] == "onboarding"
    assert client.get_experiment(parent.info.experiment_id).name == "abide-onboarding"


def test_mismatched_site_is_refused_before_anything_runs(tmp_path, small_cohort):
    with pytest.raises(ValueError, match=r"^Site 'X' has data of shape \(N, 19900\) but the "
                                         r"federation's model takes \(N, 6105\)\."):
        check_site_fits("X", (19900,), (6105,))
    shared = select(_federation(_mlp), partition_model(_mlp()).shared)
    with pytest.raises(ValueError, match=r"Site 'NEW' has data of shape \(N, 20\) but the "
                                         r"federation's model takes \(N, 12\)"):
        onboard("NEW", _site_data(0, 1, 0, d=20), _mlp, [FederationWeights(shared, "t")],
                input_shape=(D,))
    # Through the ABIDE entry: a federation on another atlas, the site's 111-ROI features.
    torch.manual_seed(0)
    other = AbideMLP(100)
    ckpt = save_tensors(tmp_path / "global.safetensors",
                        select(other.state_dict(), partition_model(other).shared), {"round": 1})
    uri = f"sqlite:///{tmp_path / 'never.db'}"

    site = dataclasses.replace(load_site("UCLA"), data_dir=small_cohort)
    with pytest.raises(ValueError, match=r"Site 'UCLA' has data of shape \(N, 6105\) but the "
                                         r"federation's model takes \(N, 100\)"):
        onboard_new_site(site, RunSpec(), federation=CheckpointSource(ckpt),
                         tracking_uri=uri)
    assert not (tmp_path / "never.db").exists()  # nothing was logged


def test_pipeline_runs_end_to_end(tmp_path, small_cohort, store):
    torch.manual_seed(0)
    model = AbideMLP(6105)
    ckpt = save_tensors(tmp_path / "server" / "global.safetensors",
                        select(model.state_dict(), partition_model(model).shared),
                        {"round": 2, "strategy": "fedbn"})
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FEDBN_MED_DATA": str(tmp_path / "data")}
    out = subprocess.run(
        [sys.executable, str(REPO / "pipelines" / "onboard_site.py"), "--site", "UCLA",
         "--data-dir", str(small_cohort), "--checkpoint", str(ckpt), "--shots", "2",
         "--tracking-uri", store],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Onboarded site UCLA" in out.stdout
    assert "(b) FedBN + local BN stats, reset scale/shift" in out.stdout
    assert "(c) FedBN + local BN stats + BN fine-tune (2/class)" in out.stdout
    assert "Logged to MLflow experiment 'abide-onboarding'" in out.stdout
    runs = MlflowClient(tracking_uri=store).search_runs(
        [MlflowClient(tracking_uri=store).get_experiment_by_name("abide-onboarding")
         .experiment_id], filter_string="tags.site = 'UCLA'")
    assert len(runs) == 1 and "fedbn_local_bn_finetune_test_auc" in runs[0].data.metrics


def test_the_table_letters_every_row_in_order_and_flags_a_one_class_model():
    from fedbn_med.onboarding import OnboardingResult

    def scores(acc: float, positive: float) -> dict[str, float]:
        return {"test_accuracy": acc, "test_auc": 0.6, "test_positive_rate": positive}

    result = OnboardingResult("NEW", metrics={
        "fedbn_local_bn_reset": scores(0.5, 0.4), "fedbn_local_bn": scores(0.6, 0.5),
        "fedbn_local_bn_finetune": scores(0.62, 0.45), "fedavg_as_is": scores(0.55, 1.0),
        "local_few_shot": scores(0.4, 0.3)},
        labels={"fedavg_as_is": "FedAvg global model as is",
                "fedbn_local_bn": "FedBN + local BN stats",
                "fedbn_local_bn_finetune": "FedBN + BN fine-tune",
                "fedbn_local_bn_reset": "FedBN reset", "local_few_shot": "local only"})
    rows = [line.split(" | ")[0].lstrip("| ") for line in result.table().splitlines()[2:7]]
    assert rows == ["(a) FedAvg global model as is", "(b) FedBN + local BN stats",
                    "(c) FedBN + BN fine-tune", "(d) FedBN reset", "(g) local only"]
    assert "| predicted positive |" in result.table().splitlines()[0]
    assert result.one_class() == ["fedavg_as_is"]
    assert "Warning: predicts one class only at this site: (a)" in result.table()


def test_onboarding_refuses_to_mix_built_in_and_real_sites(tmp_path, monkeypatch):
    sites = tmp_path / "sites"
    sites.mkdir()
    for name, data in (("OLDA", ""), ("OLDB", str(tmp_path))):
        (sites / f"{name}.toml").write_text(f'name = "{name}"\nabide_site_ids = ["{name}"]\n'
                                            f'data_dir = "{data}"\n')
    monkeypatch.setenv("FEDBN_MED_SITES", str(sites))
    config = RunSpec.for_task("abide", sites=("OLDA", "OLDB"), rounds=1)
    with pytest.raises(ValueError, match=r"mix built-in .*built-in NEW, OLDA; real OLDB"):
        onboard_new_site("NEW", config, log=False)
    # with --data-dir, every site reads it: nothing is mixed (it fails later, on the data)
    from fedbn_med.onboarding.new_site import check_one_kind_of_data

    check_one_kind_of_data("abide", {"NEW": tmp_path, "OLDA": tmp_path, "OLDB": tmp_path})
