"""Build a histopathology site's trainer from public names: its tiles, the U-Net, the objective."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from monai.networks.nets import UNet
from torch import nn

import fedbn_med as fb
from fedbn_med.tasks.histo import data as histo_data
from fedbn_med.tasks.histo.objective import NucleiSegmentation

__all__ = ["build_model", "build_site", "prepare"]


def build_model(spec: Any, input_shape: tuple[int, ...] = (3, 64, 64)) -> nn.Module:
    """Return MONAI's 2D ``UNet(norm="batch")`` of the run's channels, seeded by the run."""
    torch.manual_seed(spec.seed)
    channels = spec.settings.levels
    return UNet(spatial_dims=2, in_channels=int(input_shape[0]), out_channels=2,
                channels=channels, strides=(2,) * (len(channels) - 1), num_res_units=1,
                norm="batch")


def build_site(site: str, spec: Any, data_dir: Path | None, device: str, *,
               data: Any = None) -> Any:
    """Return a site's trainer (the task's ``build_site``); on ``data`` when given."""
    site_data = data if data is not None else histo_data.site_data(site, spec)
    objective = NucleiSegmentation(spec.settings.patch_size, batch=spec.batch_size)
    return fb.site_trainer(site, build_model(spec, site_data.input_shape), site_data,
                           objective, spec=spec, device=device)


def prepare(spec: Any) -> None:
    """Write the built-in tiles once, before any site process starts."""
    histo_data.tiles_source(spec)
