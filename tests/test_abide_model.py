"""The ABIDE network from MONAI blocks: same initial weights as the paper's plain MLP."""

from __future__ import annotations

import pytest
import torch
from monai.networks.blocks import ADN
from torch import nn

from fedbn_med.fl.partition import partition_model
from fedbn_med.tasks.abide.model import AbideMLP


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


def test_bn_of_the_adn_blocks_found_by_type():
    model = AbideMLP(100)
    assert sum(isinstance(m, ADN) for m in model.modules()) == 2
    private = partition_model(model).private
    assert {k.rsplit(".", 1)[0] for k in private} == {"net.1.N", "net.3.N"}
    assert len(private) == 10
