from __future__ import annotations

import pytest
import torch
from monai.networks.nets import DenseNet121, UNet
from torch import nn

from fedbn_med.fl.partition import NoPrivateKeysError, partition_model, site_private_keys
from fedbn_med.fl.strategies import FedAvg, FedBN
from fedbn_med.tasks.abide.model import AbideMLP


def _unet() -> nn.Module:
    return UNet(spatial_dims=2, in_channels=1, out_channels=3, channels=(4, 8, 16),
                strides=(2, 2), num_res_units=1, norm="batch")


def _densenet() -> nn.Module:
    return DenseNet121(spatial_dims=2, in_channels=1, out_channels=2)


MODELS = {"abide_mlp": lambda: AbideMLP(30), "monai_unet": _unet, "monai_densenet": _densenet}


def _bn_modules(model: nn.Module) -> dict[str, nn.Module]:
    return {n: m for n, m in model.named_modules()
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_private_keys_are_exactly_the_bn_tensors(name):
    model = MODELS[name]()
    private = site_private_keys(model)
    bns = _bn_modules(model)
    assert bns, "fixture model should contain BN layers"
    expected = {f"{prefix}.{suffix}" for prefix in bns for suffix in
                ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")}
    assert private == expected
    part = partition_model(model)
    assert part.shared.isdisjoint(part.private)
    assert part.shared | part.private == set(model.state_dict())
    assert part.shared, "conv/linear weights must be shared"


def test_monai_unet_bn_keys_are_named_adn():
    private = site_private_keys(_unet())
    assert private and all(".adn.N." in k for k in private)
    # a rule matching "bn" in the key would have found none of them
    assert not any("bn" in k for k in private)


def test_densenet_norm_layers_found_by_type():
    private = site_private_keys(_densenet())
    assert any("norm0" in k for k in private)
    assert any(k.endswith("norm1.running_var") for k in private)


def test_sync_batchnorm_and_subclass_found():
    class MyBN(nn.BatchNorm2d):
        pass

    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.SyncBatchNorm(2), nn.Conv2d(2, 2, 1), MyBN(2))
    private = site_private_keys(model)
    assert "1.running_mean" in private and "3.weight" in private
    assert "0.weight" not in private


def test_model_without_bn_has_no_private_keys_and_fedbn_refuses():
    model = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3), nn.Linear(3, 2))
    part = partition_model(model)
    assert part.private == frozenset()
    with pytest.raises(NoPrivateKeysError, match="has no batch-normalisation layer"):
        FedBN().exchanged_keys(part)
    assert FedAvg().exchanged_keys(part) == part.all
