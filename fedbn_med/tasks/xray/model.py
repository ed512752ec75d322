"""The X-ray task's network: MONAI ``DenseNet121`` (batch norm), two classes.

Under FedBN the DenseNet's batch-norm layers (``features.norm0``, ``...norm1``, ...) stay
at their hospital.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from monai.networks.nets import DenseNet121
from torch import nn

if TYPE_CHECKING:
    from fedbn_med.spec import RunSpec

__all__ = ["build_xray_model"]


def build_xray_model(config: RunSpec, input_shape: tuple[int, ...] = (1, 64, 64)
                     ) -> nn.Module:
    """Build the 2D DenseNet121 (batch norm) with the run's seed, identical at every site."""
    torch.manual_seed(config.seed)
    return DenseNet121(spatial_dims=2, in_channels=int(input_shape[0]), out_channels=2)
