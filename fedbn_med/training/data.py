"""A site's data as tensors, the device it computes on, and the seeds derived per round.

:func:`derive_seed` lives in :mod:`fedbn_med.numerics.seeds` (the federated core uses it
too) and is re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedbn_med.numerics.seeds import derive_seed

__all__ = ["SiteData", "derive_seed", "resolve_device"]


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
