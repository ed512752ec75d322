"""One site's training logic, independent of the engine that drives it.

:class:`SiteTrainer` holds a site's model, data, objective, optimiser, round hooks and
private state. Its two round operations, :meth:`SiteTrainer.fit` and
:meth:`SiteTrainer.score`, are what every engine calls (the in-process driver, the Flower
ClientApp). Engines that speak MONAI's ``ClientAlgo`` get the same object through
:class:`fedbn_med.training.clientalgo.FedBNClientAlgo`, which honours that contract. It knows
nothing of Flower or MLflow, and nothing of a task: the task's :mod:`objective
<fedbn_med.training.objective>` batches its data, gives the loss and scores the splits;
what a strategy adds to a round (the proximal term, SCAFFOLD, client-level DP) are the
:mod:`round hooks <fedbn_med.fl.hooks>` it supplies.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from fedbn_med.fl.hooks import DPHook, Releases, RoundHook
from fedbn_med.fl.partition import bn_layers, partition_model, select
from fedbn_med.fl.privacy import UpdatePrivacy
from fedbn_med.fl.scaffold import ScaffoldHook, SiteControl
from fedbn_med.fl.strategies import Strategy
from fedbn_med.spec import BN_INITS
from fedbn_med.training.bn_stats import site_bn_statistics, start_bn_statistics
from fedbn_med.training.data import SiteData, derive_seed, resolve_device
from fedbn_med.training.objective import BinaryClassification, Objective, ShapeMismatchError
from fedbn_med.training.optim import OPTIMISERS, LocalOptimiser, make_optimiser
from fedbn_med.training.rng import seed_round

__all__ = ["OPTIMISERS", "ShapeMismatchError", "SiteData", "SiteTrainer", "derive_seed",
           "resolve_device"]

logger = logging.getLogger(__name__)

Weights = dict[str, torch.Tensor]


class SiteTrainer:
    """Train and evaluate one site's model under a federated strategy.

    Parameters
    ----------
    site : str
        The site's name (e.g. ``"UCLA"``); it seeds the site's shuffling.
    model : torch.nn.Module
        The site's network; its normalisation layers are the site's private state.
    data : SiteData or any data the objective reads
        The site's train, validation and test splits (``num_train``, ``input_shape``).
    strategy : Strategy
        Decides which keys are exchanged and supplies the round hooks.
    objective : Objective, optional
        Batching, loss and scores (default: :class:`BinaryClassification` of tensors).
    optimiser : {"sgd", "adam"} or LocalOptimiser
        The local optimiser (:mod:`fedbn_med.training.optim`); a name is built with
        ``lr`` and ``weight_decay``, an object brings its own. Adam's moments live at
        the site across rounds (they are not part of the site state a restart restores).
    hooks : sequence of RoundHook, optional
        The round's hooks; default: the strategy's (:meth:`Strategy.site_hooks`).
    lr, weight_decay : float
        Learning rate (the paper uses 1e-2) and L2 penalty of a named optimiser.
    batch_size : int
        Mini-batch size (the paper uses 32).
    local_epochs : int
        Local epochs per round, unless the round's config says otherwise.
    seed : int
        Base seed; each round's shuffling and dropout derive from it.
    device : str
        ``"auto"`` (CUDA when present), ``"cpu"`` or ``"cuda:N"``.
    privacy : UpdatePrivacy, optional
        Client-level DP (a hook of the strategy's): every update this site sends is
        clipped and noised (:mod:`fedbn_med.fl.privacy`), and each reply reports the
        epsilon spent so far.
    bn_init : {"default", "data"}
        ``"data"``: BN statistics that never saw a batch start from the site's training
        data before the first local step.
    threads : int, optional
        Torch threads on the CPU; the engine pins them (:meth:`pin_threads`).
    amp : bool, optional
        Mixed precision; default: on CUDA when the objective asks for it.
    """

    def __init__(
        self,
        site: str,
        model: nn.Module,
        data: Any,
        strategy: Strategy,
        objective: Objective | None = None,
        optimiser: str | LocalOptimiser = "sgd",
        hooks: Sequence[RoundHook] | None = None,
        *,
        lr: float = 1e-2,
        batch_size: int = 32,
        local_epochs: int = 1,
        seed: int = 0,
        device: str | torch.device | None = "auto",
        privacy: UpdatePrivacy | None = None,
        bn_init: str = "default",
        threads: int | None = None,
        weight_decay: float = 0.0,
        amp: bool | None = None,
    ) -> None:
        # a named optimiser's name, lr and weight_decay are checked by make_optimiser
        optimiser = (make_optimiser(optimiser, lr, weight_decay)
                     if isinstance(optimiser, str) else optimiser)
        if bn_init not in BN_INITS:
            raise ValueError(f"bn_init must be one of {', '.join(BN_INITS)}, got {bn_init!r}.")
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be a positive integer, got {threads}.")
        if batch_size < 2:
            raise ValueError(f"batch_size must be at least 2 (batch norm), got {batch_size}.")
        if local_epochs < 1:
            raise ValueError(f"local_epochs must be at least 1, got {local_epochs}.")
        self.site = site
        self.device = resolve_device(device)
        self.model = model.to(self.device)
        self.data = data
        self.strategy = strategy
        self.objective = objective if objective is not None else BinaryClassification()
        self.optimiser = optimiser
        self.batch_size = int(batch_size)
        self.local_epochs = int(local_epochs)
        self.seed = int(seed)
        self.bn_init = bn_init
        self.threads = threads
        self.amp = ((self.device.type == "cuda" and self.objective.mixed_precision)
                    if amp is None else bool(amp))
        self.partition = partition_model(model)
        self.exchanged = strategy.exchanged_keys(self.partition)
        self.rounds_trained = 0
        #: Every DP release of this site (Opacus's accountant history): site state.
        self.releases = Releases()
        self.hooks = (list(hooks) if hooks is not None
                      else strategy.site_hooks(self, privacy, self.releases))
        self.objective.check(self.site, self.model, self.data)

    @property
    def lr(self) -> float:
        """Return the optimiser's learning rate (SCAFFOLD's variate divides by it)."""
        return self.optimiser.lr

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Return the shape of one example of this site's data."""
        return cast(tuple[int, ...], self.data.input_shape)

    @property
    def kept(self) -> frozenset[str]:
        """Return the keys that never leave the site (its BN layers under FedBN)."""
        return self.strategy.kept_keys(self.partition)

    @property
    def privacy(self) -> UpdatePrivacy | None:
        """Return the client-level DP settings of this site (None: no DP)."""
        return next((h.privacy for h in self.hooks if isinstance(h, DPHook)), None)

    @privacy.setter
    def privacy(self, value: UpdatePrivacy | None) -> None:
        # The strategy supplies the hooks again; what they keep carries over.
        tensors, meta = self.site_state()
        self.hooks = self.strategy.site_hooks(self, value, self.releases)
        self.load_site_state(tensors, meta)

    @property
    def control(self) -> SiteControl | None:
        """Return the site's SCAFFOLD control variate (None unless the strategy has one)."""
        return next((h.control for h in self.hooks if isinstance(h, ScaffoldHook)), None)

    @property
    def control_delta(self) -> Weights:
        """Return the change of the site's variate in its last round (sent to the server)."""
        return self.control.delta if self.control is not None else {}

    @property
    def dp_history(self) -> list[tuple[float, float, int]]:
        """Return the site's DP releases, ``(noise, sample_rate, releases)``."""
        return self.releases.history

    @property
    def dp_releases(self) -> int:
        """Return the rounds in which this site released a DP update."""
        return self.releases.count

    def shared_weights(self) -> Weights:
        """Return copies of the tensors this site exchanges, on the CPU."""
        state = self.model.state_dict()
        return {k: v.detach().to("cpu").clone() for k, v in select(state, self.exchanged).items()}

    def private_state(self) -> Weights:
        """Return copies of the site-private tensors (normalisation layers), on the CPU."""
        state = self.model.state_dict()
        return {
            k: v.detach().to("cpu").clone()
            for k, v in select(state, self.partition.private).items()
        }

    def site_state(self) -> tuple[Weights, dict[str, object]]:
        """Return what the site keeps besides its layers: its hooks' state, DP spent."""
        tensors: Weights = {}
        meta: dict[str, object] = {}
        for hook in self.hooks:
            extra, values = hook.state()
            tensors.update(extra)
            meta.update(values)
        meta["dp_history"] = self.releases.to_list()
        return tensors, meta

    def load_site_state(self, tensors: Mapping[str, torch.Tensor],
                        meta: Mapping[str, object]) -> None:
        """Restore what :meth:`site_state` returned."""
        for hook in self.hooks:
            hook.load(tensors, meta)
        self.releases.load(meta.get("dp_history"))

    def pin_threads(self) -> None:
        """Set the process's torch threads to this site's, on the CPU (engines call it).

        Float sums split over threads round differently: same count, same numbers.
        """
        if self.threads is not None and self.device.type == "cpu" and (
                torch.get_num_threads() != self.threads):
            torch.set_num_threads(self.threads)

    def load_shared(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Load received weights; refuse keys this site does not exchange or bad shapes."""
        self._load(weights, self.exchanged, "it does not exchange")

    def load_kept(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Restore the tensors the site keeps home (:attr:`kept`), e.g. from its state file."""
        self._load(tensors, self.kept, "it does not keep")

    def _load(self, weights: Mapping[str, torch.Tensor], allowed: frozenset[str],
              what: str) -> None:
        if not weights:
            return
        not_allowed = set(weights) - set(allowed)
        if not_allowed:
            raise ValueError(
                f"Site '{self.site}' received keys {what} under strategy "
                f"'{self.strategy.label}': {sorted(not_allowed)[:5]}."
            )
        state = self.model.state_dict()
        for key, tensor in weights.items():
            if tuple(tensor.shape) != tuple(state[key].shape):
                raise ShapeMismatchError(
                    f"Site '{self.site}': weight '{key}' has shape {tuple(tensor.shape)} but "
                    f"the site's model has shape {tuple(state[key].shape)}."
                )
        with torch.no_grad():
            for key, tensor in weights.items():
                state[key].copy_(torch.as_tensor(tensor).to(state[key].dtype))

    def derive(self, site: str, data: Any) -> SiteTrainer:
        """Return a fresh trainer like this one (settings, initial model) on other data.

        Used for a pooled (Centralized) trainer over every site's training data.
        """
        twin = copy.copy(self)
        twin.site, twin.data, twin.rounds_trained = site, data, 0
        twin.model = copy.deepcopy(self.model)
        twin.optimiser = self.optimiser.fresh()
        twin.releases = Releases()
        twin.hooks = self.strategy.site_hooks(twin, self.privacy, twin.releases)
        return twin

    # -- a round ------------------------------------------------------------------------
    def _autocast(self) -> AbstractContextManager[Any]:
        return torch.autocast(self.device.type) if self.amp else nullcontext()

    def fit(
        self, data: Mapping[str, torch.Tensor], extra: dict | None = None,
        control: Mapping[str, torch.Tensor] | None = None,
    ) -> tuple[Weights, int, dict[str, float]]:
        """Load the global weights, train locally and return the update.

        Parameters
        ----------
        data : mapping of str to tensor
            The global values of the exchanged keys (empty for SingleSet).
        extra : dict, optional
            Round config: ``round`` (int) and optionally ``local_epochs``.
        control : mapping of str to tensor, optional
            The server's SCAFFOLD control variate (strategies with ``controls``).

        Returns
        -------
        (shared_weights, num_examples, metrics)
            The site's new exchanged weights (clipped and noised under DP), its number of
            training examples and ``{"train_loss": ...}`` (plus ``dp_epsilon``,
            ``dp_delta``, ``dp_noise``, ``dp_clip`` under DP).
        """
        config = dict(extra or {})
        rnd = int(config.get("round", self.rounds_trained + 1))
        epochs = int(config.get("local_epochs", self.local_epochs))
        if epochs < 1:
            raise ValueError(f"local_epochs must be at least 1, got {epochs}.")
        self.load_shared(data or {})
        if self.bn_init == "data":
            self._start_bn_statistics()
        for hook in self.hooks:
            hook.begin(self, rnd, control or {})
        seed_round(self.model, derive_seed(self.seed, self.site, rnd, "dropout"))
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimiser.start(params, self.device.type if self.amp else None)
        self.model.train()
        losses: list[float] = []
        for xb, yb in self.objective.batches(
                self.data, self.batch_size, epochs,
                lambda label: derive_seed(self.seed, self.site, rnd, label)):
            xb = xb.to(self.device, non_blocking=True)
            yb = yb.to(self.device, non_blocking=True)
            self.optimiser.zero_grad()
            with self._autocast():
                loss = self.objective.loss(self.model(xb), yb)
            for hook in self.hooks:
                term = hook.penalty(self.model)
                if term is not None:
                    loss = loss + term
            scale = self.optimiser.backward(loss)
            for hook in self.hooks:
                hook.after_backward(scale)
            self.optimiser.step()
            losses.append(float(loss.detach()))
        return self._end_round(rnd, losses)

    def _end_round(self, rnd: int, losses: list[float]) -> tuple[Weights, int, dict[str, float]]:
        """Record the round and return ``(shared_weights, num_examples, metrics)``."""
        self.rounds_trained = rnd
        train_loss = float(np.mean(losses)) if losses else math.nan
        if not math.isfinite(train_loss):
            logger.warning("Site %s: training loss is %s in round %d", self.site, train_loss, rnd)
        sent = self.shared_weights()
        metrics = {"train_loss": train_loss}
        for hook in self.hooks:
            sent = hook.end(self, rnd, sent, metrics)
        return sent, int(self.data.num_train), metrics

    def _bn_inputs(self) -> Any:
        return self.objective.bn_inputs(self.data, self.batch_size,
                                        derive_seed(self.seed, self.site, "bn-statistics"))

    def _start_bn_statistics(self) -> None:
        """Set every BN layer's running statistics from this site's training data.

        Once, before the first local step, when no BN layer has seen a batch yet: one
        pass in training batches, dropout off (as when scoring, and as onboarding does).
        PyTorch starts them at 0 and 1; on connectivity features the first layer's outputs
        have a variance near 0.005, and with momentum 0.1 the estimates take tens of rounds
        to arrive, so that a site's evaluations first predict one class.
        """
        layers = bn_layers(self.model)
        # Only layers that never saw a batch: a resumed or averaged layer keeps its values.
        if not layers or self.data.num_train < 2 or any(
                int(cast(torch.Tensor, m.num_batches_tracked)) for m in layers):
            return
        # Dropout off: else the statistics (those the site scores with) would depend on
        # the process's random state (one process in-process, one per site over Flower).
        start_bn_statistics(self.model, self._bn_inputs(), self.device, only_bn=True)

    def site_bn_statistics(self) -> AbstractContextManager[None]:
        """Hold BN statistics re-estimated on the site's training data (put back after)."""
        return site_bn_statistics(self.model, self._bn_inputs(), self.device)

    def scoring_bn(self) -> AbstractContextManager[None]:
        """Return the BN statistics the site scores with: its own under ``fedavg_localbn``."""
        return self.site_bn_statistics() if self.strategy.site_bn_at_score else nullcontext()

    @torch.no_grad()
    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Return each example's probability of the positive class, as the site scores.

        The objective's (:meth:`~fedbn_med.training.objective.Objective.predict`: binary
        objectives only), with the BN statistics of :meth:`scoring_bn`.
        """
        with self.scoring_bn():
            return self.objective.predict(self.model, x, self.device)

    def score(self, data: Mapping[str, torch.Tensor] | None = None) -> dict[str, float]:
        """Load the given global weights and score the validation and test splits.

        Each split is scored by the objective, its metrics prefixed ``val_`` or ``test_``
        (ABIDE: :data:`fedbn_med.evaluation.metrics.METRIC_NAMES`), with the BN
        statistics of :meth:`scoring_bn` (under ``fedavg_localbn`` the site's own).
        """
        self.load_shared(data or {})
        with self.scoring_bn():
            self.model.eval()
            with torch.no_grad(), self._autocast():
                return self.objective.score_splits(self.model, self.data, ("val", "test"),
                                                   self.device)
