"""A site trainer behind MONAI's ``ClientAlgo`` contract (for NVIDIA FLARE and the like).

MONAI's :class:`monai.fl.client.ClientAlgo` exchanges :class:`ExchangeObject` values:
``train(data) -> None``, ``get_weights() -> ExchangeObject``, ``evaluate(data) ->
ExchangeObject``. :class:`FedBNClientAlgo` adapts a :class:`~fedbn_med.training.trainer.SiteTrainer`
to exactly that, and applies the site's privacy rule as its post-weight filter: whatever
asks, :meth:`FedBNClientAlgo.get_weights` returns only the keys the strategy exchanges
(under FedBN never a normalisation-layer tensor), and :meth:`FedBNClientAlgo.train`
refuses incoming weights for keys the site keeps.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from monai.fl.client import ClientAlgo
from monai.fl.utils.constants import ExtraItems, WeightType
from monai.fl.utils.exchange_object import ExchangeObject

from fedbn_med.fl.partition import select
from fedbn_med.training.trainer import SiteTrainer

__all__ = ["FedBNClientAlgo"]


class FedBNClientAlgo(ClientAlgo):
    """Serve one site's :class:`SiteTrainer` through MONAI's ``ClientAlgo`` lifecycle.

    Parameters
    ----------
    trainer : SiteTrainer
        The site's trainer; its strategy decides which keys are exchanged.

    Examples
    --------
    >>> algo = FedBNClientAlgo(trainer)                      # doctest: +SKIP
    >>> algo.train(ExchangeObject(weights=global_weights))   # doctest: +SKIP
    >>> update = algo.get_weights()  # shared keys only       # doctest: +SKIP
    """

    def __init__(self, trainer: SiteTrainer) -> None:
        self.trainer = trainer
        self.last_metrics: dict[str, float] = {}
        self.last_weights: dict[str, torch.Tensor] | None = None
        self.aborted = False

    def initialize(self, extra: dict | None = None) -> None:
        """Check that the FL system names this site, when it names one; pin its threads."""
        name = (extra or {}).get(ExtraItems.CLIENT_NAME)
        if name is not None and str(name) != self.trainer.site:
            raise ValueError(f"This ClientAlgo serves site '{self.trainer.site}', but the FL "
                             f"system calls it '{name}'.")
        self.trainer.pin_threads()
        self.aborted = False

    def train(self, data: ExchangeObject, extra: dict | None = None) -> None:
        """Load the global weights in ``data`` and train locally for one round.

        ``extra`` may hold ``round`` and ``local_epochs``.
        """
        if self.aborted:
            raise RuntimeError(f"Site '{self.trainer.site}' was aborted; initialize it again.")
        # What fit returns is what may leave the site (clipped and noised under DP).
        self.last_weights, _, self.last_metrics = self.trainer.fit(_weights_of(data), extra)

    def get_weights(self, extra: dict | None = None) -> ExchangeObject:
        """Return the site's exchanged weights only (the FedBN post-weight filter)."""
        shared = (self.last_weights if self.last_weights is not None
                  else select(self.trainer.model.state_dict(), self.trainer.exchanged))
        return ExchangeObject(
            weights={k: v.detach().to("cpu").clone() for k, v in shared.items()},
            weight_type=WeightType.WEIGHTS,
            statistics={"num_executed_iterations": self.trainer.rounds_trained,
                        "num_examples": self.trainer.data.num_train, **self.last_metrics},
        )

    def evaluate(self, data: ExchangeObject, extra: dict | None = None) -> ExchangeObject:
        """Score the global weights in ``data`` with this site's private layers."""
        return ExchangeObject(metrics=self.trainer.score(_weights_of(data)))

    def get_data_stats(self, extra: dict | None = None) -> ExchangeObject:
        """Return the site's number of training examples (no values from the data)."""
        return ExchangeObject(statistics={"num_train": int(self.trainer.data.num_train)})

    def abort(self, extra: dict | None = None) -> None:
        """Refuse further training until :meth:`initialize` is called again."""
        self.aborted = True

    def finalize(self, extra: dict | None = None) -> None:
        """Nothing to release: the trainer holds no open resources."""


def _weights_of(data: ExchangeObject) -> Mapping[str, torch.Tensor]:
    if not isinstance(data, ExchangeObject):
        raise TypeError(f"ClientAlgo methods take an ExchangeObject, got {type(data).__name__}.")
    if data.weight_type not in (None, WeightType.WEIGHTS):
        raise ValueError(f"Expected full weights (WeightType.WEIGHTS), got {data.weight_type}.")
    return data.weights or {}
