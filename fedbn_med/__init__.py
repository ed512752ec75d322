"""fedbn_med: FedBN federated learning for medical sites whose scanners differ."""

from __future__ import annotations

__version__ = "0.1.0"
