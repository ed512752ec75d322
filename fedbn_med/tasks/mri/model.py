"""The MRI task's network: MONAI ``UNet(norm="batch")`` segmenting 2D axial slices.

Under FedBN the UNet's batch-norm layers (``*.adn.N``) stay at their scanner's site.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from monai.networks.nets import UNet
from torch import nn

from fedbn_med.tasks.imaging.synth import TISSUE_CLASSES

if TYPE_CHECKING:
    from fedbn_med.spec import RunSpec

__all__ = ["build_mri_model"]


def build_mri_model(config: RunSpec, input_shape: tuple[int, ...] = (1, 64, 64)
                    ) -> nn.Module:
    """Build the 2D segmentation UNet with the run's seed, identical at every site."""
    torch.manual_seed(config.seed)
    return UNet(spatial_dims=2, in_channels=int(input_shape[0]),
                out_channels=len(TISSUE_CLASSES), channels=(16, 32, 64, 128),
                strides=(2, 2, 2), num_res_units=1, norm="batch")
