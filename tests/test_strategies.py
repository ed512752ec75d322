from __future__ import annotations

import pytest
import torch

from fedbn_med.fl.partition import partition_model
from fedbn_med.fl.registry import STRATEGIES, get_strategy
from fedbn_med.fl.strategies import (
    Centralized,
    FedAvg,
    FedBN,
    FedProx,
    SingleSet,
    weighted_average,
)
from fedbn_med.tasks.abide.model import AbideMLP


def test_weighted_mean_exact():
    gen = torch.Generator().manual_seed(0)
    a = {"w": torch.randn(3, 4, generator=gen), "c": torch.tensor(10)}
    b = {"w": torch.randn(3, 4, generator=gen), "c": torch.tensor(20)}
    out = weighted_average([(a, 1), (b, 3)])
    torch.testing.assert_close(out["w"], (a["w"] * 1 + b["w"] * 3) / 4, rtol=0, atol=1e-6)
    assert out["w"].dtype == torch.float32
    assert out["c"].dtype == a["c"].dtype and int(out["c"]) == 18  # 17.5 rounds to even 18


def test_weighted_average_errors():
    with pytest.raises(ValueError, match="no site sent an update"):
        weighted_average([])
    with pytest.raises(ValueError, match="disagree on the shape of 'w'"):
        weighted_average([({"w": torch.zeros(2)}, 1), ({"w": torch.zeros(3)}, 1)])
    with pytest.raises(ValueError, match="disagree on their keys"):
        weighted_average([({"w": torch.zeros(2)}, 1), ({"v": torch.zeros(2)}, 1)])
    with pytest.raises(ValueError, match="0 training examples"):
        weighted_average([({"w": torch.zeros(2)}, 0)])


def test_exchanged_keys_per_strategy():
    part = partition_model(AbideMLP(10))
    assert FedBN().exchanged_keys(part) == part.shared
    assert FedAvg().exchanged_keys(part) == part.all
    assert FedProx().exchanged_keys(part) == part.all
    assert SingleSet().exchanged_keys(part) == frozenset()
    assert Centralized().pooled


def test_fedprox_defaults_and_fedbn_with_prox():
    assert FedProx().mu == pytest.approx(1e-2)
    combo = FedBN(mu=0.01)
    assert combo.keeps_private and combo.mu == 0.01
    assert combo.label == "fedbn+prox(mu=0.01)"
    with pytest.raises(ValueError, match="mu must be a non-negative"):
        FedProx(mu=-1.0)


def test_proximal_term_value():
    model = AbideMLP(5)
    anchor = {k: v.detach().clone() for k, v in model.state_dict().items()}
    assert float(FedProx(mu=0.5).proximal_term(model, anchor)) == 0.0
    with torch.no_grad():
        model.net[0].weight.add_(1.0)
    expected = 0.5 * 0.5 * model.net[0].weight.numel()
    assert float(FedProx(mu=0.5).proximal_term(model, anchor)) == pytest.approx(expected)
    assert FedAvg().proximal_term(model, anchor) is None


def test_get_strategy_lists_valid_names():
    assert isinstance(get_strategy("FedBN"), FedBN)
    assert get_strategy("fedprox", mu=0.1).mu == 0.1
    with pytest.raises(ValueError, match=r"Unknown strategy 'fedbm'\. Valid strategies: "
                                         r"centralized, fedavg, fedavg_combat, fedavg_localbn, "
                                         r"fedavg_sitez, fedbn, fedbn-scaffold, feddyn, fedprox, "
                                         r"scaffold, silobn, singleset\."):
        get_strategy("fedbm")
    assert set(STRATEGIES) == {"fedbn", "fedavg", "fedprox", "singleset", "centralized",
                               "scaffold", "fedbn-scaffold", "silobn", "fedavg_localbn",
                               "fedavg_sitez", "fedavg_combat", "feddyn"}
