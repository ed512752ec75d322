"""Baselines that isolate FedBN's mechanism: SiloBN, FedAvg scored with each site's own BN
statistics, per-site standardisation, ComBat and mean-FD regression (training rows only)."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pandas as pd
import pytest
import torch
from monai.networks.nets import DenseNet121, UNet
from torch import nn

from fedbn_med.fl.partition import NoPrivateKeysError, partition_model
from fedbn_med.fl.registry import get_strategy
from fedbn_med.spec import RunSpec
from fedbn_med.tasks.abide.harmonize import ComBat, MotionRegressor, SiteStandardizer
from fedbn_med.tasks.abide.model import AbideMLP
from fedbn_med.training.inprocess import run_in_process
from fedbn_med.training.trainer import SiteData, SiteTrainer

STATS = ("running_mean", "running_var", "num_batches_tracked")


def _unet() -> nn.Module:
    return UNet(spatial_dims=2, in_channels=1, out_channels=2, channels=(4, 8),
                strides=(2,), norm="batch")


def _densenet() -> nn.Module:
    return DenseNet121(spatial_dims=2, in_channels=1, out_channels=2)


@pytest.mark.parametrize("make", [lambda: AbideMLP(20), _unet, _densenet],
                         ids=["abide-mlp", "monai-unet", "monai-densenet121"])
def test_silobn_shares_bn_affine_and_keeps_running_statistics(make):
    model = make()
    partition = partition_model(model)
    sent = get_strategy("silobn").exchanged_keys(partition)
    bn = [(name, m) for name, m in model.named_modules()
          if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    assert bn
    for name, _ in bn:
        assert f"{name}.weight" in sent and f"{name}.bias" in sent
        for buffer in STATS:
            assert f"{name}.{buffer}" not in sent
            assert f"{name}.{buffer}" in partition.statistics
    assert sent == partition.all - partition.statistics
    # FedBN keeps the affine home too; FedAvg sends the statistics
    assert not get_strategy("fedbn").exchanged_keys(partition) & partition.affine
    assert partition.statistics <= get_strategy("fedavg").exchanged_keys(partition)


def test_silobn_refuses_a_model_without_bn():
    partition = partition_model(nn.Sequential(nn.Linear(3, 2)))
    with pytest.raises(NoPrivateKeysError, match=r"Strategy 'silobn' keeps normalisation"):
        get_strategy("silobn").exchanged_keys(partition)


def _site_data(shift: float, seed: int, n: int = 40) -> SiteData:
    gen = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 2
    x = torch.randn(n, 12, generator=gen) * (1 + shift) + shift + y[:, None] * 0.8
    third = n // 3
    return SiteData(train=(x[:2 * third], y[:2 * third]), val=(x[2 * third:], y[2 * third:]),
                    test=(x[2 * third:], y[2 * third:]))


def _federation(strategy: str, rounds: int = 1) -> tuple[dict[str, SiteTrainer], object]:
    strat = get_strategy(strategy)
    trainers = {}
    for i, (site, shift) in enumerate((("A", 0.0), ("B", 3.0))):
        torch.manual_seed(0)
        trainers[site] = SiteTrainer(site, AbideMLP(12), _site_data(shift, i), strat,
                                     batch_size=8, device="cpu", bn_init="data", threads=1)
    history = run_in_process(trainers, strat, rounds)
    return trainers, history


@pytest.fixture(scope="module")
def runs():
    return {name: _federation(name) for name in ("fedavg", "fedavg_localbn", "silobn")}


def test_silobn_federation_keeps_statistics_at_each_site(runs):
    trainers, history = runs["silobn"]
    assert "net.1.N.weight" in history.global_weights
    assert not any(k.endswith(STATS) for k in history.global_weights)
    a, b = (t.model.state_dict() for t in trainers.values())
    # each site's own statistics (its inputs differ by a shift and a scale)
    assert not torch.allclose(a["net.1.N.running_mean"], b["net.1.N.running_mean"])


def test_fedavg_localbn_trains_as_fedavg_and_scores_differently(runs):
    (_, plain), (_, local) = runs["fedavg"], runs["fedavg_localbn"]
    assert plain.global_weights.keys() == local.global_weights.keys()
    for key, value in plain.global_weights.items():
        assert torch.equal(value, local.global_weights[key]), key
    losses = [(p["test_loss"], q["test_loss"]) for p, q in
              zip(plain.final().values(), local.final().values())]
    assert any(abs(p - q) > 1e-6 for p, q in losses)


def test_own_bn_scoring_changes_the_buffers_only_at_the_site(runs):
    trainers, history = runs["fedavg_localbn"]
    trainer = trainers["B"]
    trainer.load_shared(history.global_weights)
    bn = trainer.model.net[1].N
    before = {k: getattr(bn, k).clone() for k in STATS}
    x = trainer.data.train[0]
    with trainer.site_bn_statistics():
        hidden = trainer.model.net[0](x)
        inside = bn.running_mean.clone()
    # one cumulative pass over the site's training batches: the mean of the batch means
    batches = [hidden[s:s + trainer.batch_size] for s in range(0, len(x), trainer.batch_size)]
    expected = torch.stack([b.mean(0) for b in batches if len(b) >= 2]).mean(0)
    assert torch.allclose(inside, expected, atol=1e-5)
    assert not torch.allclose(inside, before["running_mean"])
    for key in STATS:
        assert torch.equal(getattr(bn, key), before[key])
    # what the site sends is untouched by scoring
    trainer.score(history.global_weights)
    sent = trainer.shared_weights()
    assert torch.equal(sent["net.1.N.running_mean"], history.global_weights["net.1.N.running_mean"])


def _blocks(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"S1": rng.normal(0.0, 1.0, (30, 25)), "S2": rng.normal(1.5, 2.5, (24, 25)),
            "S3": rng.normal(-1.0, 0.5, (20, 25))}


def test_site_standardizer_uses_training_rows_only():
    rng = np.random.default_rng(1)
    train, test = rng.normal(3, 2, (40, 6)), rng.normal(3, 2, (10, 6))
    fitted = SiteStandardizer().fit(train)
    z = fitted.transform(train)
    np.testing.assert_allclose(z.mean(0), 0, atol=1e-5)
    np.testing.assert_allclose(z.std(0, ddof=1), 1, atol=1e-5)
    before = fitted.transform(test)
    refit = SiteStandardizer().fit(train)
    np.testing.assert_array_equal(refit.transform(test + 0), before)
    # a constant training column is centred, never divided by zero
    train[:, 0] = 5.0
    assert np.isfinite(SiteStandardizer().fit(train).transform(test)).all()


def test_combat_matches_the_package_on_its_training_rows():
    from neuroCombat import neuroCombat

    blocks = _blocks()
    combat = ComBat().fit(blocks)
    data = np.concatenate(list(blocks.values()))
    batch = np.concatenate([[s] * len(x) for s, x in blocks.items()])
    with contextlib.redirect_stdout(io.StringIO()):
        ref = neuroCombat(data.T, pd.DataFrame({"site": batch}), "site")["data"].T
    ours = np.concatenate([combat.transform(s, x) for s, x in blocks.items()])
    np.testing.assert_allclose(ours, ref, atol=1e-4)
    # harmonised: the sites' feature means come together
    def spread(harmonise) -> float:  # largest range of a feature's site means
        return float(np.ptp([harmonise(s, x).mean(0) for s, x in blocks.items()], axis=0).max())

    assert spread(combat.transform) < 0.25 * spread(lambda s, x: x)


def test_combat_errors_name_what_is_valid():
    with pytest.raises(ValueError, match=r"ComBat needs the training rows of at least 2 sites, "
                                         r"got 1 \(S1\)"):
        ComBat().fit({"S1": _blocks()["S1"]})
    combat = ComBat().fit(_blocks())
    with pytest.raises(ValueError, match=r"fitted on sites S1, S2, S3; it cannot harmonise "
                                         r"site 'S9'"):
        combat.transform("S9", np.zeros((2, 25)))


def test_motion_regressor_removes_the_fd_effect_from_training_rows():
    rng = np.random.default_rng(2)
    fd = rng.uniform(0.05, 0.4, 60)
    x = rng.normal(0, 1, (60, 5)) + np.outer(fd, [3, 0, -2, 1, 0])
    fd[3] = np.nan  # not recorded: takes the training median
    reg = MotionRegressor().fit(x, fd)
    out = reg.transform(x, fd)
    filled = np.where(np.isfinite(fd), fd, np.nanmedian(fd))
    corr = [abs(np.corrcoef(filled, out[:, j])[0, 1]) for j in range(5)]
    assert max(corr) < 1e-6
    np.testing.assert_allclose(out.mean(0), x.mean(0), atol=1e-5)
    with pytest.raises(ValueError, match=r"needs the mean FD of at least 2 training rows; "
                                         r"1 of 3 have one"):
        MotionRegressor().fit(x[:3], np.array([0.1, np.nan, np.nan]))


@pytest.fixture(scope="module")
def abide_rows(small_cohort):
    from fedbn_med.tasks.abide.build import site_rows
    from fedbn_med.tasks.abide.sites import load_sites

    sites = load_sites(["NYU", "UM", "USM"])
    spec = RunSpec.for_task("abide", sites=tuple(sites), data_dir=small_cohort,
                            fd_regression=True)
    return spec, sites, site_rows(sites["UM"], spec)


@pytest.mark.parametrize("strategy", ["fedavg_sitez", "fedavg_combat"])
def test_harmonisation_is_fitted_on_training_rows_only(abide_rows, strategy):
    from fedbn_med.tasks.abide.build import _harmonised

    spec, sites, rows = abide_rows
    spec = spec.replace(strategy=strategy)
    out = _harmonised(sites["UM"], spec, rows)
    changed = dict(rows)
    x, *rest = rows["test"]
    changed["test"] = (x * 10 + 7, *rest)  # other test rows: nothing fitted may move
    again = _harmonised(sites["UM"], spec, changed)
    for split in ("train", "val"):
        np.testing.assert_array_equal(out[split][0], again[split][0])
    assert not np.allclose(out["test"][0], again["test"][0])
    if strategy == "fedavg_sitez":
        np.testing.assert_allclose(out["train"][0].mean(0), 0, atol=1e-4)


def test_combat_is_fitted_once_per_run_and_refitted_when_training_rows_change(abide_rows):
    from fedbn_med.tasks.abide import build

    spec, sites, rows = abide_rows
    spec = spec.replace(strategy="fedavg_combat")
    build._COMBAT_FIT.clear()
    first = build._harmonised(sites["UM"], spec, rows)
    (fit, seen), = build._COMBAT_FIT.values()
    assert set(seen) == {"NYU", "UM", "USM"}
    other = build._harmonised(sites["NYU"], spec, build.site_rows(sites["NYU"], spec))
    assert next(iter(build._COMBAT_FIT.values()))[0] is fit  # NYU reused UM's fit
    build._COMBAT_FIT.clear()
    fresh = build._harmonised(sites["NYU"], spec, build.site_rows(sites["NYU"], spec))
    for split in ("train", "val", "test"):  # the shared fit is the fit NYU makes alone
        np.testing.assert_array_equal(other[split][0], fresh[split][0])
    # training rows that are not those the fit saw: refitted, never a stale fit
    x, *rest = rows["train"]
    shifted = build._harmonised(sites["UM"], spec, {**rows, "train": (x + 1.0, *rest)})
    assert next(iter(build._COMBAT_FIT.values()))[0] is not fit
    assert not np.allclose(shifted["val"][0], first["val"][0])


def test_fd_regression_is_fitted_on_training_rows_only(abide_rows):
    _, _, rows = abide_rows
    x, _, _, fd = rows["train"]
    known = np.isfinite(fd)
    filled = np.where(known, fd, np.median(fd[known]))
    centred = filled - filled.mean()
    slope = centred @ (x - x.mean(0)) / (centred @ centred)
    assert np.abs(slope).max() < 1e-3


def test_conflicting_harmonisation_is_refused(small_cohort):
    from fedbn_med.tasks.abide.build import feature_transform

    spec = RunSpec.for_task("abide", strategy="fedavg_combat", harmonize="site_z")
    with pytest.raises(ValueError, match=r"Strategy 'fedavg_combat' harmonises the features "
                                         r"with 'combat', but the run's settings ask for "
                                         r"harmonize='site_z'"):
        feature_transform(spec)
    assert feature_transform(spec.replace(strategy="fedbn")) == "site_z"


def test_feature_strategies_need_a_task_that_offers_them():
    with pytest.raises(ValueError, match=r"Strategy 'fedavg_sitez' harmonises input features "
                                         r"\(site_z\), which task 'mri' does not offer"):
        RunSpec.for_task("mri", strategy="fedavg_sitez")


def test_settings_errors_list_the_valid_values():
    with pytest.raises(ValueError, match=r"harmonize must be one of none, site_z, combat, got "
                                         r"'zscore'"):
        RunSpec.for_task("abide", harmonize="zscore")
    with pytest.raises(ValueError, match=r"optimizer must be one of sgd, adam, got 'rmsprop'"):
        RunSpec.for_task("abide", optimizer="rmsprop")


def test_combat_without_its_package_says_what_to_install(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "neuroCombat", None)  # as if not installed
    with pytest.raises(ImportError, match=r"ComBat harmonisation needs the package neuroCombat"
                                          r".*pip install neuroCombat==0\.2\.12"):
        ComBat().fit(_blocks())
