"""The ABIDE network from MONAI blocks: same initial weights as the paper's plain MLP."""

from __future__ import annotations

import pytest
import torch
from monai.networks.blocks import ADN
from torch import nn

from fedbn_med.fl.partition import partition_model
from fedbn_med.tasks.abide.model import AbideLinear, AbideMLP


def _plain_mlp(in_features: int, dropout: float) -> nn.Sequential:
    return nn.Sequential(nn.Linear(in_features, 16), nn.BatchNorm1d(16), nn.ReLU(),
                         nn.Dropout(dropout), nn.Linear(16, 16), nn.BatchNorm1d(16),
                         nn.ReLU(), nn.Dropout(dropout), nn.Linear(16, 2))


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_same_seed_same_weights_and_outputs_as_the_plain_mlp(dropout):
    torch.manual_seed(7)
    plain = _plain_mlp(6105, dropout)
    torch.manual_seed(7)
    model = AbideMLP(6105, dropout=dropout)
    for a, b in zip(plain.state_dict().values(), model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    x = torch.randn(8, 6105)
    torch.manual_seed(1)
    y_plain = plain.train()(x)
    torch.manual_seed(1)
    assert torch.equal(model.train()(x), y_plain)


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_the_networks_are_monais_adn_layout_to_the_initial_weight(dropout: float) -> None:
    # built from torch alone (importing MONAI costs an ABIDE process seconds), they are the
    # networks MONAI's ADN blocks made: the same modules, keys and initial weights
    def adn(channels: int, **kw: object) -> ADN:
        return ADN(in_channels=channels, norm_dim=1, dropout=dropout or None, dropout_dim=1,
                   **kw)

    torch.manual_seed(0)
    monai_mlp = torch.nn.Sequential(
        torch.nn.Linear(40, 16), adn(16, ordering="NAD", act="relu", norm="batch"),
        torch.nn.Linear(16, 16), adn(16, ordering="NAD", act="relu", norm="batch"),
        torch.nn.Linear(16, 2))
    torch.manual_seed(1)
    monai_linear = torch.nn.Sequential(
        adn(40, ordering="ND", norm=("batch", {"affine": False})), torch.nn.Linear(40, 2))
    torch.manual_seed(0)
    ours_mlp = AbideMLP(40, dropout=dropout).net
    torch.manual_seed(1)
    ours_linear = AbideLinear(40, dropout=dropout).net
    for theirs, ours in ((monai_mlp, ours_mlp), (monai_linear, ours_linear)):
        assert repr(theirs).replace("ADN(", "Sequential(") == repr(ours)
        a, b = theirs.state_dict(), ours.state_dict()
        assert list(a) == list(b)
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_bn_of_the_adn_blocks_found_by_type():
    model = AbideMLP(100)
    private = partition_model(model).private
    assert {k.rsplit(".", 1)[0] for k in private} == {"net.1.N", "net.3.N"}
    assert len(private) == 10


# -- the linear model (Settings.model = "linear") -------------------------------------------
def test_linear_model_normalises_its_input_in_a_private_bn_layer():
    model = AbideLinear(50, dropout=0.2)
    part = partition_model(model)
    assert {k.rsplit(".", 1)[0] for k in part.private} == {"net.0.N"}
    assert part.shared == {"net.1.weight", "net.1.bias"}
    # a standardiser: no scale or shift for weight decay to shrink
    assert part.private == part.statistics and not part.affine
    x = torch.randn(16, 50) * 7 + 3  # far from standardised
    model.train()(x)
    stats = model.net[0].N
    assert torch.allclose(stats.running_mean, 0.1 * x.mean(0), atol=1e-5)
    assert model.eval()(x).shape == (16, 2)
    with pytest.raises(ValueError, match="dropout must be in"):
        AbideLinear(50, dropout=1.0)
    with pytest.raises(ValueError, match="in_features must be a positive integer, got 0"):
        AbideLinear(0)


def test_the_run_settings_choose_the_network_and_onboarding_reads_either_width():
    from fedbn_med.onboarding.weights import abide_input_shape
    from fedbn_med.spec import RunSpec
    from fedbn_med.tasks.abide.build import build_model
    from fedbn_med.tasks.abide.settings import Settings

    linear = build_model(40, RunSpec().replace(model="linear"))
    mlp = build_model(40, RunSpec())
    assert isinstance(linear, AbideLinear) and isinstance(mlp, AbideMLP)
    assert abide_input_shape(linear.state_dict()) == (40,)
    assert abide_input_shape(mlp.state_dict()) == (40,)
    with pytest.raises(ValueError, match="a first linear layer 'net.N.weight'"):
        abide_input_shape({"net.0.N.weight": torch.ones(40)})
    with pytest.raises(ValueError, match="model must be one of mlp, linear, got 'cnn'"):
        Settings(model="cnn")
    assert Settings(model="linear").log_params()["model"] == "linear"


def test_fedbn_with_the_linear_model_keeps_each_sites_input_statistics_home():
    from fedbn_med.fl.registry import get_strategy
    from fedbn_med.training.inprocess import run_in_process
    from fedbn_med.training.trainer import SiteData, SiteTrainer

    def data(shift: float, seed: int, n: int = 30) -> SiteData:
        gen = torch.Generator().manual_seed(seed)
        y = torch.arange(n) % 2
        x = torch.randn(n, 12, generator=gen) * (1 + shift) + shift + y[:, None] * 0.8
        return SiteData(train=(x[:20], y[:20]), val=(x[20:], y[20:]), test=(x[20:], y[20:]))

    strategy = get_strategy("fedbn")
    trainers = {}
    for i, (site, shift) in enumerate((("A", 0.0), ("B", 4.0))):
        torch.manual_seed(0)
        trainers[site] = SiteTrainer(site, AbideLinear(12, dropout=0.2), data(shift, i),
                                     strategy, batch_size=8, device="cpu", threads=1)
    history = run_in_process(trainers, strategy, 2)
    # only the linear layer is averaged; no key of the input BN layer left a site
    assert set(history.global_weights) == {"net.1.weight", "net.1.bias"}
    a, b = (t.model.state_dict() for t in trainers.values())
    assert torch.equal(a["net.1.weight"], b["net.1.weight"])
    # each site standardised by its own statistics (its inputs differ by a shift)
    assert (b["net.0.N.running_mean"] - a["net.0.N.running_mean"]).mean() > 1.0


def test_sgd_refuses_a_weight_decay_that_diverges():
    from fedbn_med.training.optim import PlainSGD

    assert PlainSGD(3e-3, 100.0).weight_decay == 100.0  # lr x wd = 0.3: shrinks, converges
    with pytest.raises(ValueError, match=r"SGD with lr 0\.03 and weight_decay 100 diverges: "
                                         r"lr x weight_decay = 3 must be below 2"):
        PlainSGD(3e-2, 100.0)
