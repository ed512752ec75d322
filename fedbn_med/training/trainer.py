"""One site's training logic, independent of the engine that drives it.

:class:`SiteTrainer` holds a site's model, data, optimiser settings and private state.
Its two round operations, :meth:`SiteTrainer.fit` and :meth:`SiteTrainer.score`, are what
every engine calls (the in-process driver, the Flower ClientApp). Engines that speak
MONAI's ``ClientAlgo`` get the same object through
:class:`fedbn_med.training.clientalgo.FedBNClientAlgo`, which honours that contract. It knows
nothing of Flower or MLflow.
"""

from __future__ import annotations

import logging
import math
import zlib
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch
from torch import nn

from fedbn_med.evaluation.metrics import classification_metrics
from fedbn_med.fl.partition import bn_layers, partition_model, select
from fedbn_med.fl.privacy import UpdatePrivacy
from fedbn_med.fl.scaffold import CONTROL_PREFIX, SiteControl, split_controls
from fedbn_med.fl.strategies import Strategy
from fedbn_med.spec import BN_INITS

__all__ = ["OPTIMISERS", "ShapeMismatchError", "SiteData", "SiteTrainer", "derive_seed",
           "estimate_bn_statistics", "resolve_device"]

logger = logging.getLogger(__name__)

Weights = dict[str, torch.Tensor]

#: The local optimisers a trainer offers: plain SGD (the FedBN paper) or Adam (the
#: published federated ABIDE code, Li et al. 2020: lr 1e-5, weight decay 5e-2).
OPTIMISERS = ("sgd", "adam")


class ShapeMismatchError(ValueError):
    """Raised when weights or data do not fit a site's model."""


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


def derive_seed(seed: int, *parts: object) -> int:
    """Derive a reproducible 31-bit seed from a base seed and labels (site, round)."""
    text = ":".join([str(int(seed)), *map(str, parts)])
    return zlib.crc32(text.encode()) & 0x7FFFFFFF


@torch.no_grad()
def estimate_bn_statistics(model: nn.Module, batches: Iterable[torch.Tensor],
                           device: torch.device | str = "cpu", *,
                           only_bn: bool = False) -> bool:
    """Set every BN layer's running mean and variance from one pass over ``batches``.

    The layers (found by type, :func:`fedbn_med.fl.partition.bn_layers`) are reset and see
    the batches with a cumulative average (``momentum=None``), in training mode; their
    momentum and the model's mode are restored afterwards. Batches of one example are
    skipped (batch norm cannot use them).

    Parameters
    ----------
    model : torch.nn.Module
        Any network; a model without BN layers is left as it is.
    batches : iterable of torch.Tensor
        Input batches, e.g. a site's training data in training-sized batches.
    device : torch.device or str
        Where the model computes.
    only_bn : bool
        Put only the BN layers in training mode (dropout and the rest stay in evaluation
        mode, as when the model is scored); False: the whole model trains, as at the
        start of training.

    Returns
    -------
    bool
        Whether any BN layer was updated.
    """
    layers = bn_layers(model)
    if not layers:
        return False
    saved = [m.momentum for m in layers]
    for m in layers:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average over this pass
    modes = [(m, m.training) for m in model.modules()]
    if only_bn:
        model.eval()
        for m in layers:
            m.train()
    else:
        model.train()
    seen = False
    try:
        for batch in batches:
            if batch.shape[0] >= 2:
                model(batch.to(device))
                seen = True
    finally:
        for m, momentum in zip(layers, saved):
            m.momentum = momentum
        for module, mode in modes:
            module.training = mode
    return seen


@dataclass(frozen=True)
class SiteData:
    """A site's split data as tensors: ``(features, labels)`` for train, val and test.

    ``val_groups`` and ``test_groups``, when given, hold for each row the index of the
    subject it belongs to (several rows per subject, e.g. sliding windows): a subject is
    then scored once, by the mean of its rows' predicted probabilities.
    """

    train: tuple[torch.Tensor, torch.Tensor]
    val: tuple[torch.Tensor, torch.Tensor]
    test: tuple[torch.Tensor, torch.Tensor]
    val_groups: torch.Tensor | None = None
    test_groups: torch.Tensor | None = None

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


class SiteTrainer:
    """Train and evaluate one site's model under a federated strategy.

    Parameters
    ----------
    site : str
        The site's name (e.g. ``"UCLA"``); it seeds the site's shuffling.
    model : torch.nn.Module
        The site's network; its normalisation layers are the site's private state.
    data : SiteData
        The site's train, validation and test tensors.
    strategy : Strategy
        Decides which keys are exchanged and whether a proximal term is added.
    lr : float
        SGD learning rate (the paper uses 1e-2).
    batch_size : int
        Mini-batch size (the paper uses 32).
    local_epochs : int
        Local epochs per round, unless the round's config says otherwise.
    seed : int
        Base seed; each round's shuffling and dropout derive from it.
    device : str
        ``"auto"`` (CUDA when present), ``"cpu"`` or ``"cuda:N"``.
    privacy : UpdatePrivacy, optional
        Client-level DP: every update this site sends is clipped and noised
        (:mod:`fedbn_med.fl.privacy`), and each reply reports the epsilon spent so far.
    optimiser : {"sgd", "adam"}
        The local optimiser. Adam's moments live at the site across rounds (they are
        not part of the site state a restart restores).
    weight_decay : float
        L2 penalty added to the gradients (``torch.optim.Adam``'s ``weight_decay``).

    Under a strategy with control variates (SCAFFOLD) the site keeps its own variate
    (``control``, a :class:`~fedbn_med.fl.scaffold.SiteControl`) over the exchanged
    parameters; :meth:`fit` takes the server's variate and leaves the change of the
    site's in ``control_delta``.
    """

    def __init__(
        self,
        site: str,
        model: nn.Module,
        data: SiteData,
        strategy: Strategy,
        *,
        lr: float = 1e-2,
        batch_size: int = 32,
        local_epochs: int = 1,
        seed: int = 0,
        device: str | torch.device | None = "auto",
        privacy: UpdatePrivacy | None = None,
        bn_init: str = "default",
        threads: int | None = None,
        optimiser: str = "sgd",
        weight_decay: float = 0.0,
    ) -> None:
        if optimiser not in OPTIMISERS:
            raise ValueError(f"optimiser must be one of {', '.join(OPTIMISERS)}, got "
                             f"{optimiser!r}.")
        if not (weight_decay >= 0 and math.isfinite(weight_decay)):
            raise ValueError(f"weight_decay must be a finite number >= 0, got {weight_decay}.")
        if bn_init not in BN_INITS:
            raise ValueError(f"bn_init must be one of {', '.join(BN_INITS)}, got {bn_init!r}.")
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be a positive integer, got {threads}.")
        if lr <= 0 or not math.isfinite(lr):
            raise ValueError(f"lr must be a positive number, got {lr}.")
        if batch_size < 2:
            raise ValueError(f"batch_size must be at least 2 (batch norm), got {batch_size}.")
        if local_epochs < 1:
            raise ValueError(f"local_epochs must be at least 1, got {local_epochs}.")
        self.site = site
        self.device = resolve_device(device)
        self.model = model.to(self.device)
        self.data = data
        self.strategy = strategy
        self.lr = float(lr)
        self.batch_size = int(batch_size)
        self.local_epochs = int(local_epochs)
        self.seed = int(seed)
        self.bn_init = bn_init
        self.threads = threads
        self.optimiser = optimiser
        self.weight_decay = float(weight_decay)
        self._adam: torch.optim.Adam | None = None
        self.partition = partition_model(model)
        self.exchanged = strategy.exchanged_keys(self.partition)
        self.rounds_trained = 0
        parameters = frozenset(name for name, _ in model.named_parameters())
        controlled = strategy.controlled_keys(self.partition, parameters)
        self.control = SiteControl(model.state_dict(), controlled) if controlled else None
        self.control_delta: Weights = {}
        self.privacy = privacy if self.exchanged else None
        # Opacus accountant history, (noise multiplier, sample rate, releases): site state.
        self.dp_history: list[tuple[float, float, int]] = []
        self._start: Weights = {}
        self._server_control: Weights = {}
        self._corrections: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
        self._steps = 0
        self._check_data()

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Return the shape of one example of this site's data."""
        return self.data.input_shape

    # -- state ---------------------------------------------------------------------------
    def _check_data(self) -> None:
        expected = getattr(self.model, "in_features", None)
        for split, (x, y) in zip(("train", "val", "test"), (self.data.train, self.data.val,
                                                             self.data.test)):
            if expected is not None and x.ndim == 2 and x.shape[1] != expected:
                raise ShapeMismatchError(
                    f"Site '{self.site}' has {split} data of shape {tuple(x.shape)} but the "
                    f"federation's model expects {expected} features per example "
                    f"(shape (N, {expected}))."
                )
            if x.shape[0] != y.shape[0]:
                raise ValueError(
                    f"Site '{self.site}' {split} split has {x.shape[0]} examples but "
                    f"{y.shape[0]} labels."
                )
            if not torch.isfinite(x).all():
                raise ValueError(f"Site '{self.site}' {split} data contains NaN or Inf.")

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

    def load_private_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """Restore the site-private tensors saved by :meth:`private_state`."""
        unknown = set(state) - set(self.partition.private)
        if unknown:
            raise ValueError(
                f"Private state for site '{self.site}' holds keys that are not private: "
                f"{sorted(unknown)[:5]}."
            )
        self._load(state, allowed=self.partition.private)

    def site_state(self) -> tuple[Weights, dict[str, object]]:
        """Return what the site keeps besides its layers: its control variate, DP spent."""
        tensors = ({CONTROL_PREFIX + k: v.clone() for k, v in self.control.state.items()}
                   if self.control is not None else {})
        return tensors, {"dp_history": [list(h) for h in self.dp_history]}

    def load_site_state(self, tensors: Mapping[str, torch.Tensor],
                        meta: Mapping[str, object]) -> None:
        """Restore what :meth:`site_state` returned."""
        _, controls = split_controls(tensors)
        if self.control is not None and controls:
            self.control.load(controls)
        history: list[list[float]] = meta.get("dp_history") or []  # type: ignore[assignment]
        self.dp_history = [(float(s), float(q), int(n)) for s, q, n in history]

    @property
    def dp_releases(self) -> int:
        """Return the rounds in which this site released a DP update."""
        return sum(n for _, _, n in self.dp_history)

    def load_shared(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Load received weights; refuse keys this site does not exchange or bad shapes.

        Every fit and score starts here, so this is also where the site's thread count is
        set (on the CPU): the same spec then gives the same numbers on any machine.
        """
        if self.threads is not None and self.device.type == "cpu" and (
                torch.get_num_threads() != self.threads):
            torch.set_num_threads(self.threads)
        self._load(weights, allowed=self.exchanged)

    def _load(self, weights: Mapping[str, torch.Tensor], allowed: frozenset[str]) -> None:
        if not weights:
            return
        not_allowed = set(weights) - set(allowed)
        if not_allowed:
            raise ValueError(
                f"Site '{self.site}' received keys it does not exchange under strategy "
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

    # -- a round ------------------------------------------------------------------------
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
        rnd, epochs, anchor = self._begin_round(data, extra, control)
        gen = torch.Generator().manual_seed(derive_seed(self.seed, self.site, rnd, "shuffle"))
        x, y = self.data.train
        n = x.shape[0]
        params = [p for p in self.model.parameters() if p.requires_grad]
        loss_fn = nn.CrossEntropyLoss()
        self.model.train()
        losses: list[float] = []
        for _ in range(epochs):
            order = torch.randperm(n, generator=gen)
            for start in range(0, n, self.batch_size):
                idx = order[start:start + self.batch_size]
                if idx.numel() < 2:  # batch norm cannot train on a single example
                    continue
                xb = x[idx].to(self.device, non_blocking=True)
                yb = y[idx].to(self.device, non_blocking=True)
                for p in params:
                    p.grad = None
                loss = loss_fn(self.model(xb), yb)
                prox = self.strategy.proximal_term(self.model, anchor)
                if prox is not None:
                    loss = loss + prox
                loss.backward()
                self._correct_gradients()
                self._step(params)
                losses.append(float(loss.detach()))
        return self._end_round(rnd, n, losses)

    def _begin_round(
        self, data: Mapping[str, torch.Tensor], extra: dict | None,
        control: Mapping[str, torch.Tensor] | None = None,
    ) -> tuple[int, int, Weights]:
        """Load the global weights and seed the round; return (round, epochs, anchor).

        The anchor holds the received values of the exchanged keys when a proximal term
        is used. Subclasses that batch differently call this and :meth:`_end_round`.
        """
        weights = data
        config = dict(extra or {})
        rnd = int(config.get("round", self.rounds_trained + 1))
        epochs = int(config.get("local_epochs", self.local_epochs))
        if epochs < 1:
            raise ValueError(f"local_epochs must be at least 1, got {epochs}.")
        self.load_shared(weights or {})
        if self.bn_init == "data":
            self._start_bn_statistics()
        anchor = (
            {k: v.detach().clone() for k, v in self.model.state_dict().items()
             if k in self.exchanged}
            if self.strategy.mu > 0 else {}
        )
        # the received weights: the reference of DP's update and of SCAFFOLD's variate
        needs_start = self.privacy is not None or self.control is not None
        self._start = self.shared_weights() if needs_start else {}
        self._steps = 0
        self._server_control = dict(control or {})
        self._corrections = []
        if self.control is not None:
            params = dict(self.model.named_parameters())
            self._corrections = [
                (params[k], c.to(self.device)) for k, c in
                self.control.correction(self._server_control).items()]
        torch.manual_seed(derive_seed(self.seed, self.site, rnd, "dropout"))
        return rnd, epochs, anchor

    @torch.no_grad()
    def _start_bn_statistics(self) -> None:
        """Set every BN layer's running mean and variance from this site's training data.

        Done once, before the first local step, when no BN layer has seen a batch yet:
        one pass, in the training split's order and in training batches, with dropout
        off (as when scoring, and as onboarding starts them). PyTorch starts
        the running statistics at 0 and 1; on connectivity features the first layer's
        outputs have a variance near 0.005, and with momentum 0.1 and a few batches a
        round the estimates take tens of rounds to arrive, so that a site's evaluations
        first predict one class.
        Starting from the site's own statistics changes nothing else: the layers stay
        local under FedBN and train as standard BN afterwards.
        """
        layers = bn_layers(self.model)
        x = self.data.train[0]
        # Only layers that never saw a batch: a resumed or averaged layer keeps its values.
        if not layers or x.shape[0] < 2 or any(
                int(cast(torch.Tensor, m.num_batches_tracked)) for m in layers):
            return
        # Only the BN layers in training mode: with dropout on, the statistics would
        # depend on the process's random state (one process in-process, one per site
        # over Flower), and they are the statistics the site scores with.
        estimate_bn_statistics(self.model, self._bn_batches(), self.device, only_bn=True)

    def _bn_batches(self) -> Iterator[torch.Tensor]:
        """Yield the site's training inputs in training-sized batches, in split order.

        What BN statistics are estimated from; a trainer whose data are not tensors (an
        imaging dataset) overrides it.
        """
        x = self.data.train[0]
        for start in range(0, x.shape[0], self.batch_size):
            yield x[start:start + self.batch_size]

    @contextmanager
    def site_bn_statistics(self) -> Iterator[None]:
        """Score with BN running statistics re-estimated on this site's training data.

        Inside the block every BN layer holds statistics from one pass of the current
        (shared) model over the site's training data, with only the BN layers in training
        mode (no dropout, as when scoring); on leaving it the layers' buffers
        are put back, so the re-estimated statistics never reach an update.
        """
        layers = bn_layers(self.model)
        saved = [{k: v.clone() for k, v in m.state_dict().items()
                  if k in ("running_mean", "running_var", "num_batches_tracked")}
                 for m in layers]
        try:
            estimate_bn_statistics(self.model, self._bn_batches(), self.device, only_bn=True)
            yield
        finally:
            with torch.no_grad():
                for m, state in zip(layers, saved):
                    for key, value in state.items():
                        getattr(m, key).copy_(value)

    @torch.no_grad()
    def _correct_gradients(self, scale: float = 1.0) -> None:
        """Count a local step and add SCAFFOLD's ``c - c_i`` to its gradients.

        Call after every backward pass; ``scale`` is a gradient scaler's current scale.
        """
        self._steps += 1
        for param, correction in self._corrections:
            if param.grad is not None:
                param.grad.add_(correction, alpha=scale)

    def _end_round(self, rnd: int, num_examples: int, losses: list[float]
                   ) -> tuple[Weights, int, dict[str, float]]:
        """Record the round and return ``(shared_weights, num_examples, metrics)``."""
        self.rounds_trained = rnd
        train_loss = float(np.mean(losses)) if losses else math.nan
        if not math.isfinite(train_loss):
            logger.warning("Site %s: training loss is %s in round %d", self.site, train_loss, rnd)
        sent = self.shared_weights()
        metrics = {"train_loss": train_loss}
        if self.privacy is not None:
            from fedbn_med.fl.dp_terms import noise_generator, replace_one_epsilon

            sent = self.privacy.privatize(sent, self._start, noise_generator(
                self.privacy, self.seed, self.site, rnd))
            self._record_release()
            metrics.update(dp_epsilon=self._spent(), dp_delta=self.privacy.delta,
                           dp_noise=self.privacy.noise, dp_clip=self.privacy.clip,
                           dp_epsilon_replace_one=replace_one_epsilon(self.dp_history,
                                                                      self.privacy.delta),
                           dp_seeded=float(self.privacy.seeded))
        if self.control is not None:
            self.control_delta = self.control.update(self._start, sent, self._server_control,
                                                     self._steps, self.lr)
        return sent, num_examples, metrics

    def _record_release(self) -> None:
        assert self.privacy is not None
        last = self.dp_history[-1] if self.dp_history else None
        if last is not None and last[0] == self.privacy.noise:
            self.dp_history[-1] = (last[0], last[1], last[2] + 1)
        else:
            self.dp_history.append((self.privacy.noise, 1.0, 1))

    def _spent(self) -> float:
        from fedbn_med.fl.privacy import epsilon

        assert self.privacy is not None
        return epsilon(0.0, 0, self.privacy.delta, self.dp_history)

    def _step(self, params: list[torch.nn.Parameter]) -> None:
        if self.optimiser == "adam":
            if self._adam is None:
                self._adam = torch.optim.Adam(params, lr=self.lr,
                                              weight_decay=self.weight_decay)
            self._adam.step()
        else:
            self._sgd_step(params)

    @torch.no_grad()
    def _sgd_step(self, params: list[torch.nn.Parameter]) -> None:
        # Plain SGD, as in the paper; written out because the first torch.optim optimiser
        # of a process imports torch._dynamo, which costs seconds at every site start.
        for p in params:
            if p.grad is not None:
                if self.weight_decay:
                    p.grad.add_(p, alpha=self.weight_decay)
                p.add_(p.grad, alpha=-self.lr)

    @torch.no_grad()
    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Return the probability of the positive class for each example."""
        self.model.eval()
        out = []
        for start in range(0, x.shape[0], 512):
            logits = self.model(x[start:start + 512].to(self.device))
            out.append(torch.softmax(logits, dim=1)[:, 1].cpu())
        return torch.cat(out) if out else torch.empty(0)

    def _train_majority(self) -> int | None:
        """Return the majority class of this site's training split, None without one.

        Ties go to the positive class, as in the protocol's majority-class row (which
        predicts the training share of positives at the 0.5 threshold). Counted over the
        training rows: with sliding windows, a subject counts once per window.
        """
        train = getattr(self.data, "train", None)
        if not (isinstance(train, tuple) and len(train) == 2
                and isinstance(train[1], torch.Tensor) and train[1].numel() > 0):
            return None
        return int(float(train[1].double().mean()) >= 0.5)

    @torch.no_grad()
    def _score(self, x: torch.Tensor, y: torch.Tensor,
               groups: torch.Tensor | None = None) -> dict[str, float]:
        # classification_metrics also gives n, the share predicted positive and, told the
        # training majority, the majority-class predictor's accuracy on these subjects
        majority = self._train_majority()
        self.model.eval()
        logits = torch.cat([self.model(x[s:s + 512].to(self.device)).cpu()
                            for s in range(0, x.shape[0], 512)])
        if groups is None:
            loss = float(nn.functional.cross_entropy(logits, y))
            prob = torch.softmax(logits, dim=1)[:, 1].numpy()
            return classification_metrics(y.numpy(), prob, loss, majority=majority)
        # One score per subject: the mean of its rows' (windows') probabilities.
        _, inverse = torch.unique(groups, return_inverse=True)
        n = int(inverse.max()) + 1
        probs = torch.zeros(n, logits.shape[1], dtype=torch.float64).index_add_(
            0, inverse, torch.softmax(logits.double(), dim=1))
        probs /= torch.bincount(inverse, minlength=n).unsqueeze(1)
        labels = torch.zeros(n, dtype=torch.int64).scatter_(0, inverse, y)
        loss = float(nn.functional.nll_loss(torch.log(probs.clamp_min(1e-12)), labels))
        return classification_metrics(labels.numpy(), probs[:, 1].numpy(), loss,
                                      majority=majority)

    def score(self, data: Mapping[str, torch.Tensor] | None = None) -> dict[str, float]:
        """Load the given global weights and score the validation and test splits.

        Returns ``{"val_accuracy": ..., "val_auc": ..., "test_accuracy": ..., ...}``: the
        names of :data:`fedbn_med.evaluation.metrics.METRIC_NAMES` on each split, among them
        ``test_n`` (subjects), ``test_positive_rate`` (share predicted positive) and
        ``test_majority_rate`` (what predicting the training majority scores).
        """
        self.load_shared(data or {})
        metrics: dict[str, float] = {}
        with (self.site_bn_statistics() if self.strategy.site_bn_at_score
              else nullcontext()):
            for split in ("val", "test"):
                x, y = getattr(self.data, split)
                if x.shape[0] == 0:
                    continue
                groups = getattr(self.data, f"{split}_groups")
                for name, value in self._score(x, y, groups).items():
                    metrics[f"{split}_{name}"] = value
        return metrics

