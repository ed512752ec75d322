"""The FedBN paper's ABIDE network."""

from __future__ import annotations

from torch import nn

__all__ = ["AbideMLP"]


class AbideMLP(nn.Module):
    """Classify a connectivity vector: in -> 16 -> 16 -> 2.

    A BatchNorm1d follows each of the first two linear layers, as in the FedBN paper's
    ABIDE experiment. These BN layers are what FedBN keeps at each site.

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
        if in_features < 1:
            raise ValueError(f"in_features must be a positive integer, got {in_features}.")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}.")
        self.in_features = in_features
        self.net = nn.Sequential(
            nn.Linear(in_features, hidden),
            nn.BatchNorm1d(hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, hidden),
            nn.BatchNorm1d(hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x):  # noqa: D102
        return self.net(x)
