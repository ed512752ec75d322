"""The MRI task's network: MONAI ``UNet(norm="batch")``, 3D (patches) or 2D (slices).

Under FedBN the UNet's batch-norm layers (``BatchNorm3d`` or ``BatchNorm2d``, named
``*.adn.N``) stay at their scanner's site; :mod:`fedbn_med.fl.partition` finds them by type.
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


def build_mri_model(config: RunSpec, input_shape: tuple[int, ...] = (1, 32, 32, 32)
                    ) -> nn.Module:
    """Build the segmentation UNet of the run's mode with its seed, identical at every site.

    ``input_shape`` (channel first) gives the input channels; the spatial dimensions
    are the mode's (3 in ``"3d"``, 2 in ``"2d"``).
    """
    torch.manual_seed(config.seed)
    return UNet(spatial_dims=config.settings.spatial_dims, in_channels=int(input_shape[0]),
                out_channels=len(TISSUE_CLASSES), channels=(16, 32, 64, 128),
                strides=(2, 2, 2), num_res_units=1, norm="batch")
