"""The ABIDE networks: the FedBN paper's MLP, and a linear model.

Their normalisation blocks have the layout of MONAI's ``ADN`` (a ``Sequential`` whose
children are named ``N``, ``A`` and ``D``: the same module types, names and state-dict
keys), built from torch alone: importing MONAI costs every process that trains ABIDE
about 3 s (it loads all of MONAI, MLflow included), a third of the main job's set-up,
for two lines of torch. The imaging tasks use MONAI's networks themselves.
"""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

__all__ = ["AbideLinear", "AbideMLP"]


class AbideMLP(nn.Module):
    """Classify a connectivity vector: in -> 16 -> 16 -> 2.

    Each hidden linear layer is followed by a block laid out as MONAI's ``ADN`` with
    ``ordering="NAD"`` (BatchNorm1d, then ReLU, then dropout), as in the FedBN paper's
    ABIDE experiment. These BN layers are what FedBN keeps at each site; they are
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


def _adn(channels: int, dropout: float, *, act: bool = True, affine: bool = True
         ) -> nn.Sequential:
    """Return BatchNorm1d -> ReLU -> dropout, named as MONAI's ADN names them (N, A, D).

    No ReLU when not ``act``, no dropout module when ``dropout`` is 0 (as ADN leaves out
    what it is not given); ``affine=False``: a BN layer without scale and shift.
    """
    layers: list[tuple[str, nn.Module]] = [("N", nn.BatchNorm1d(channels, affine=affine))]
    if act:
        layers.append(("A", nn.ReLU()))
    if dropout:
        layers.append(("D", nn.Dropout(dropout)))
    return nn.Sequential(OrderedDict(layers))


class AbideLinear(nn.Module):
    """Classify a connectivity vector with one linear layer on batch-normalised features.

    ``in -> BatchNorm1d -> dropout -> 2``: a logistic regression whose inputs are
    standardised by a BN layer without scale and shift (a block laid out as MONAI's
    ``ADN`` with ``ordering="ND"``, ``affine=False``).
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
            _adn(in_features, dropout, act=False, affine=False),
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
