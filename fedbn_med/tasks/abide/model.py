"""The ABIDE networks, built from MONAI blocks: the FedBN paper's MLP, and a linear model."""

from __future__ import annotations

from monai.networks.blocks import ADN
from torch import nn

__all__ = ["AbideLinear", "AbideMLP"]


class AbideMLP(nn.Module):
    """Classify a connectivity vector: in -> 16 -> 16 -> 2.

    Each hidden linear layer is followed by a MONAI :class:`~monai.networks.blocks.ADN`
    block with ``norm="batch"`` (BatchNorm1d, then ReLU, then dropout), as in the FedBN
    paper's ABIDE experiment. These BN layers are what FedBN keeps at each site; they are
    found by type (:mod:`fedbn_med.fl.partition`), so their names (``net.1.N``, ``net.3.N``)
    do not matter.

    Parameters
    ----------
    in_features : int
        Length of the connectivity vector (6105 for 111 Harvard-Oxford ROIs).
    hidden : int
        Width of both hidden layers.
    num_classes : int
        Number of outputs (2: control, ASD).
    dropout : float
        Dropout probability after each hidden block (0 disables it).
    """

    def __init__(
        self, in_features: int, hidden: int = 16, num_classes: int = 2, dropout: float = 0.0
    ) -> None:
        super().__init__()
        _check_sizes(in_features, dropout)
        self.in_features = in_features
        # Only the linear layers draw random numbers, in the same order as the paper's
        # nn.Sequential: the same seed gives the same initial weights.
        self.net = nn.Sequential(
            nn.Linear(in_features, hidden),
            _adn(hidden, dropout),
            nn.Linear(hidden, hidden),
            _adn(hidden, dropout),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x):  # noqa: D102
        return self.net(x)


def _adn(channels: int, dropout: float) -> ADN:
    """Return BatchNorm1d -> ReLU -> dropout as one MONAI block."""
    return ADN(ordering="NAD", in_channels=channels, act="relu", norm="batch", norm_dim=1,
               dropout=dropout or None, dropout_dim=1)


class AbideLinear(nn.Module):
    """Classify a connectivity vector with one linear layer on batch-normalised features.

    ``in -> BatchNorm1d -> dropout -> 2``: a logistic regression whose inputs are
    standardised by a BN layer without scale and shift (a MONAI
    :class:`~monai.networks.blocks.ADN` block with ``norm="batch"``, ``affine=False``).
    Under FedBN that layer's running statistics stay at their site, so each site's
    features are centred and scaled by its own statistics before the shared weights see
    them; under FedAvg they are averaged like every other tensor. Having no scale, the
    standardiser is not shrunk by weight decay, which then acts on the linear layer
    alone: an L2 penalty on its weights, and (unlike most logistic regressions) on its
    bias too.

    Parameters
    ----------
    in_features : int
        Length of the connectivity vector (6105 for 111 Harvard-Oxford ROIs).
    num_classes : int
        Number of outputs (2: control, ASD).
    dropout : float
        Dropout probability on the normalised features (0 disables it).
    """

    def __init__(self, in_features: int, num_classes: int = 2, dropout: float = 0.0) -> None:
        super().__init__()
        _check_sizes(in_features, dropout)
        self.in_features = in_features
        self.net = nn.Sequential(
            ADN(ordering="ND", in_channels=in_features, norm=("batch", {"affine": False}),
                norm_dim=1, dropout=dropout or None, dropout_dim=1),
            nn.Linear(in_features, num_classes),
        )

    def forward(self, x):  # noqa: D102
        return self.net(x)


def _check_sizes(in_features: int, dropout: float) -> None:
    """Raise ``ValueError`` naming a non-positive width or a dropout outside [0, 1)."""
    if in_features < 1:
        raise ValueError(f"in_features must be a positive integer, got {in_features}.")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}.")
