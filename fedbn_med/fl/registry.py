"""The strategies a run may name, and the one function that turns a name into one.

A new strategy is its class (:mod:`fedbn_med.fl.strategies`, or a module of its own such
as :mod:`fedbn_med.fl.feddyn`) and one entry here; the command line, the run spec and
every engine take their list from :data:`STRATEGIES`.
"""

from __future__ import annotations

from fedbn_med.fl.feddyn import FedDyn
from fedbn_med.fl.strategies import (
    Centralized,
    FedAvg,
    FedAvgCombat,
    FedAvgLocalBN,
    FedAvgSiteZ,
    FedBN,
    FedBNScaffold,
    FedProx,
    Scaffold,
    SiloBN,
    SingleSet,
    Strategy,
)

__all__ = ["STRATEGIES", "get_strategy"]

STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls for cls in (FedBN, FedAvg, FedProx, Scaffold, FedBNScaffold, SingleSet,
                              Centralized, SiloBN, FedAvgLocalBN, FedAvgSiteZ, FedAvgCombat,
                              FedDyn)
}


def get_strategy(name: str, mu: float | None = None) -> Strategy:
    """Return the strategy registered under ``name``.

    Parameters
    ----------
    name : str
        One of :data:`STRATEGIES`.
    mu : float, optional
        Proximal weight (FedDyn's alpha); when omitted the strategy's default is used.
    """
    cls = STRATEGIES.get(str(name).lower())
    if cls is None:
        raise ValueError(
            f"Unknown strategy '{name}'. Valid strategies: {', '.join(sorted(STRATEGIES))}."
        )
    return cls() if mu is None else cls(mu=float(mu))
