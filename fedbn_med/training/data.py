"""A site's data as tensors, the device and cores it computes on, the seeds derived per round.

:func:`derive_seed` lives in :mod:`fedbn_med.numerics.seeds` (the federated core uses it
too) and is re-exported here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from fedbn_med.numerics.seeds import derive_seed

__all__ = ["CORES_ENV_VAR", "SiteData", "derive_seed", "resolve_device", "usable_cores"]

#: Caps the cores that in-process runs and comparisons use at once (default: all this
#: process may run on). For a machine shared with other work, or test processes side by
#: side: sites and cells then wait their turn instead of contending for the same cores.
CORES_ENV_VAR = "FEDBN_MED_CORES"


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """Return CUDA when present and asked for ``auto``, else the named device."""
    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as err:
        raise ValueError(
            f"Unknown device '{device}'. Expected 'auto', 'cpu', 'cuda' or 'cuda:N'."
        ) from err
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"Device '{device}' was requested but this machine has no CUDA GPU.")
    return resolved


def usable_cores() -> int:
    """Return the cores this process may run on, capped by ``FEDBN_MED_CORES`` if set.

    Raises
    ------
    ValueError
        If ``FEDBN_MED_CORES`` is set to anything but a positive integer.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)
    text = os.environ.get(CORES_ENV_VAR, "").strip()
    if not text:
        return cores
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{CORES_ENV_VAR}={text!r}: expected a positive whole number of "
                         "cores (or leave it unset to use every core).")
    return min(cores, int(text))


@dataclass(frozen=True)
class SiteData:
    """A site's split data as tensors: ``(features, labels)`` for train, val and test.

    ``val_groups`` and ``test_groups``, when given, hold for each row the index of the
    subject it belongs to (several rows per subject, e.g. sliding windows): a subject is
    then scored once, by the mean of its rows' predicted probabilities. ``train_groups``
    does the same for the training rows (training does not use it; a benchmark that
    draws a share of a site's subjects does).
    """

    train: tuple[torch.Tensor, torch.Tensor]
    val: tuple[torch.Tensor, torch.Tensor]
    test: tuple[torch.Tensor, torch.Tensor]
    val_groups: torch.Tensor | None = None
    test_groups: torch.Tensor | None = None
    train_groups: torch.Tensor | None = None

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Return the shape of one example."""
        return tuple(int(d) for d in self.train[0].shape[1:])

    @property
    def num_features(self) -> int:
        """Return the feature dimension."""
        return int(self.train[0].shape[1])

    @property
    def num_train(self) -> int:
        """Return the number of training examples."""
        return int(self.train[0].shape[0])
