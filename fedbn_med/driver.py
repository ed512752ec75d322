"""Run a whole federation in one process, site after site.

This is the reference implementation of a federated run: tests use it, benchmarks sweep
with it, and the Flower engine must reproduce its per-site results.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from fedbn_med.strategies import Strategy, weighted_average
from fedbn_med.trainer import SiteTrainer

__all__ = ["History", "run_in_process"]

logger = logging.getLogger(__name__)


@dataclass
class History:
    """Per-round, per-site metrics of a federated run.

    Attributes
    ----------
    rows : list of dict
        One row per (round, site): ``{"round": r, "site": s, "num_examples": n, ...}``.
    global_weights : dict
        The final values of the exchanged keys (empty for SingleSet).
    """

    strategy: str
    rows: list[dict[str, float | int | str]] = field(default_factory=list)
    global_weights: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def rounds(self) -> int:
        """Return the number of completed rounds."""
        return max((int(r["round"]) for r in self.rows), default=0)

    def final(self) -> dict[str, dict[str, float]]:
        """Return each site's metrics at the last round."""
        last = self.rounds
        return {
            str(r["site"]): {k: v for k, v in r.items() if k not in ("round", "site")}
            for r in self.rows if int(r["round"]) == last
        }


RoundCallback = Callable[[int, Mapping[str, Mapping[str, float]]], None]


def run_in_process(
    trainers: Mapping[str, SiteTrainer],
    strategy: Strategy,
    rounds: int,
    *,
    local_epochs: int | None = None,
    pooled: SiteTrainer | None = None,
    on_round: RoundCallback | None = None,
) -> History:
    """Run ``rounds`` federated rounds over the given site trainers.

    Each round: every site loads the global exchanged weights and trains locally; the
    server averages the sites' exchanged weights, weighted by their training examples;
    every site evaluates the new global weights with its own private layers.

    Parameters
    ----------
    trainers : mapping of site name to SiteTrainer
        The sites, all built with ``strategy``.
    strategy : Strategy
        The federated strategy.
    rounds : int
        Number of communication rounds (at least 1).
    local_epochs : int, optional
        Overrides each trainer's local epochs.
    pooled : SiteTrainer, optional
        For a pooled strategy (Centralized): the trainer over all sites' training data;
        each site then evaluates the pooled model on its own splits.
    on_round : callable, optional
        Called after each round with ``(round, {site: metrics})``.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}.")
    if not trainers:
        raise ValueError("A federation needs at least one site; none was given.")
    if strategy.pooled and pooled is None:
        raise ValueError(f"Strategy '{strategy.name}' needs the pooled trainer (pooled=...).")
    history = History(strategy=strategy.label)
    first = pooled if strategy.pooled else next(iter(trainers.values()))
    global_weights = first.shared_weights()
    for rnd in range(1, rounds + 1):
        config: dict[str, int] = {"round": rnd}
        if local_epochs is not None:
            config["local_epochs"] = local_epochs
        round_metrics: dict[str, dict[str, float]] = {}
        if strategy.pooled:
            assert pooled is not None
            global_weights, _, fit = pooled.train(global_weights, config)
            for site, trainer in trainers.items():
                round_metrics[site] = {"num_examples": trainer.data.num_train,
                                       "train_loss": fit["train_loss"]}
        else:
            updates = []
            for site, trainer in trainers.items():
                weights, n, fit = trainer.train(global_weights, config)
                updates.append((weights, n))
                round_metrics[site] = {"num_examples": n, **fit}
            if strategy.exchanges:
                global_weights = weighted_average(updates)
        for site, trainer in trainers.items():
            round_metrics[site].update(trainer.evaluate(global_weights))
            history.rows.append({"round": rnd, "site": site, **round_metrics[site]})
        if on_round is not None:
            on_round(rnd, round_metrics)
        logger.debug("round %d done: %s", rnd, round_metrics)
    history.global_weights = global_weights
    return history
