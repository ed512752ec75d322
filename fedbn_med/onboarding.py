"""Onboard a site that took no part in training (test-time FedBN, paper appendix G).

A new site, whose scanner the federation has never seen, receives the federation's
latest shared (non-BN) weights and builds its own batch-normalisation layers:

1. running mean and variance estimated on its own *unlabeled* data (statistics reset,
   then forward passes with the BN layers in training mode and no gradient, cumulative
   average: ``momentum=None``);
2. scale and shift reset (``weight=1, bias=0``) or set to the average over the training
   sites, where the consortium opted in to share it (:func:`average_bn_affine`,
   :func:`save_bn_affine`);
3. optionally fine-tuned on a few labeled cases (``shots`` per class, seeded): only the
   BN scale and shift learn, every other parameter is frozen and the statistics of step
   1 stay fixed.

:func:`onboard` compares, on the site's test split, the FedAvg global model as it is
(with a FedAvg run's full weights), the same with local BN statistics, FedBN's shared
weights with local BN statistics, each plus BN fine-tuning, and a model trained on the
few labeled cases alone (SingleSet reference). :func:`onboard_new_site` does it for an
ABIDE site config, from a server checkpoint, an MLflow run, or a quick in-process
federation, and logs the result as a new site run.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from fedbn_med.checkpoint import load_tensors, save_tensors
from fedbn_med.experiment import (
    ExperimentConfig,
    build_model,
    build_trainer,
    prepare_site_data,
)
from fedbn_med.partition import partition_model, select
from fedbn_med.sites import SiteConfig, load_sites
from fedbn_med.strategies import SingleSet, weighted_average
from fedbn_med.trainer import (
    ShapeMismatchError,
    SiteData,
    SiteTrainer,
    derive_seed,
    resolve_device,
)

__all__ = [
    "ONBOARDING_EXPERIMENT",
    "SHARED_WEIGHTS_ARTIFACT",
    "CheckpointSource",
    "FederationWeights",
    "MlflowRunSource",
    "OnboardingOptions",
    "OnboardingResult",
    "TrainedFederation",
    "WeightsSource",
    "abide_input_shape",
    "adapt_model",
    "average_bn_affine",
    "bn_affine_keys",
    "check_site_fits",
    "estimate_bn_statistics",
    "few_shot_indices",
    "finetune_bn",
    "load_bn_affine",
    "log_onboarding",
    "method_table",
    "onboard",
    "onboard_new_site",
    "save_bn_affine",
    "train_federation",
]

logger = logging.getLogger(__name__)

ONBOARDING_EXPERIMENT = "abide-onboarding"
SHARED_WEIGHTS_ARTIFACT = "model/shared_weights.safetensors"

Weights = dict[str, torch.Tensor]


# -- where the federation's weights come from --------------------------------------------
@dataclass(frozen=True)
class FederationWeights:
    """A federation's global weights and where they came from.

    Attributes
    ----------
    weights : dict of str to torch.Tensor
        FedBN: the shared (non-BN) keys; FedAvg: every key, BN layers included.
    source : str
        Human-readable origin (a file path, an MLflow run, an in-process run).
    round : int or None
        The round after which the weights were saved, when known.
    strategy : str or None
        The federation's strategy label (``"fedbn"``, ``"fedavg"``), when known.
    parent_run_id : str or None
        The federation's MLflow parent run, when known.
    """

    weights: Mapping[str, torch.Tensor]
    source: str
    round: int | None = None
    strategy: str | None = None
    parent_run_id: str | None = None


@dataclass(frozen=True)
class CheckpointSource:
    """Weights from a server checkpoint (``<workdir>/server/global.safetensors``)."""

    path: Path

    def load(self) -> FederationWeights:
        """Read the checkpoint and its metadata (round, strategy, parent run)."""
        tensors, meta = load_tensors(self.path)
        rnd = meta.get("round")
        return FederationWeights(
            weights=tensors, source=f"checkpoint {Path(self.path).resolve()}",
            round=int(rnd) if isinstance(rnd, (int, float)) else None,
            strategy=str(meta["strategy"]) if meta.get("strategy") else None,
            parent_run_id=str(meta["parent_run_id"]) if meta.get("parent_run_id") else None,
        )


@dataclass(frozen=True)
class MlflowRunSource:
    """Weights logged as ``model/shared_weights.safetensors`` on a federation's MLflow run."""

    run_id: str
    tracking_uri: str | None = None

    def load(self) -> FederationWeights:
        """Download the artifact and read the run's strategy and rounds."""
        # The tracker owns the only MLflow client; resuming a run by ID creates no run.
        from fedbn_med.tracking import FederationTracker

        reader = FederationTracker(ONBOARDING_EXPERIMENT, "", {}, (),
                                   tracking_uri=self.tracking_uri, parent_run_id=self.run_id)
        try:
            run = reader.client.get_run(self.run_id)
        except Exception as err:  # mlflow's own exception type stays inside tracking
            raise ValueError(
                f"MLflow run '{self.run_id}' was not found in {reader.tracking_uri}: {err}"
            ) from err
        with tempfile.TemporaryDirectory() as tmp:
            try:
                local = reader.client.download_artifacts(self.run_id, SHARED_WEIGHTS_ARTIFACT,
                                                         tmp)
            except Exception as err:
                raise ValueError(
                    f"MLflow run '{self.run_id}' has no artifact '{SHARED_WEIGHTS_ARTIFACT}'. "
                    "A federation logs its final shared weights on its parent run: pass that "
                    f"run's ID (not a site run's). ({err})"
                ) from err
            tensors, _ = load_tensors(local)
        params = run.data.params
        rounds = params.get("rounds")
        return FederationWeights(
            weights=tensors, source=f"MLflow run {self.run_id} ({reader.tracking_uri})",
            round=int(rounds) if rounds and rounds.isdigit() else None,
            strategy=params.get("strategy_label") or params.get("strategy"),
            parent_run_id=self.run_id,
        )


WeightsSource = CheckpointSource | MlflowRunSource


# -- checks ------------------------------------------------------------------------------
def check_site_fits(site: str, data_shape: Sequence[int], model_shape: Sequence[int]) -> None:
    """Raise if a site's examples do not have the shape the federation's model takes.

    Parameters
    ----------
    site : str
        The site's name, for the message.
    data_shape, model_shape : sequence of int
        Shape of one example of the site's data, and the one the model takes.

    Raises
    ------
    fedbn_med.trainer.ShapeMismatchError
        A ``ValueError`` naming both shapes.
    """
    if tuple(data_shape) != tuple(model_shape):
        raise ShapeMismatchError(
            f"Site '{site}' has data of shape (N, {', '.join(map(str, data_shape))}) but the "
            f"federation's model takes (N, {', '.join(map(str, model_shape))}). Compute the "
            "site's features with the federation's atlas and connectivity pipeline."
        )


def abide_input_shape(weights: Mapping[str, torch.Tensor]) -> tuple[int, ...]:
    """Return the input shape of the ABIDE network these weights belong to."""
    first = weights.get("net.0.weight")
    if first is None or first.ndim != 2:
        raise ValueError(
            "Expected weights of the ABIDE network (fedbn_med.model.AbideMLP, first layer "
            f"'net.0.weight' of shape (hidden, features)); got keys {sorted(weights)[:6]}."
        )
    return (int(first.shape[1]),)


def _check_weights(model: nn.Module, weights: Mapping[str, torch.Tensor], source: str
                   ) -> bool:
    """Check keys and shapes; return whether the weights include the BN layers."""
    partition = partition_model(model)
    partition.require_private("onboarding")
    state = model.state_dict()
    unknown = sorted(set(weights) - set(state))
    missing = sorted(partition.shared - set(weights))
    if unknown or missing:
        raise ValueError(
            f"The weights from {source} do not fit the federation's model: "
            f"missing {missing[:5]}, unknown {unknown[:5]}. Expected the shared keys "
            f"{sorted(partition.shared)[:5]}... (and, for FedAvg, the BN keys too)."
        )
    for key, tensor in weights.items():
        if tuple(tensor.shape) != tuple(state[key].shape):
            raise ShapeMismatchError(
                f"Weight '{key}' from {source} has shape {tuple(tensor.shape)} but the "
                f"model has shape {tuple(state[key].shape)}."
            )
    return partition.private <= set(weights)


# -- BN layers ---------------------------------------------------------------------------
def _bn_modules(model: nn.Module) -> list[_BatchNorm]:
    return [m for m in model.modules() if isinstance(m, _BatchNorm)]


def bn_affine_keys(model: nn.Module) -> frozenset[str]:
    """Return the keys of the BN scale and shift parameters (private parameters, no buffers)."""
    params = {name for name, _ in model.named_parameters()}
    return frozenset(partition_model(model).private & params)


def average_bn_affine(trainers: Iterable[SiteTrainer]) -> Weights:
    """Average the training sites' BN scale and shift, weighted by training examples.

    Only sites whose consortium agreed to share these parameters should be passed.
    """
    trainers = list(trainers)
    if not trainers:
        raise ValueError("Cannot average BN scale and shift: no training site was given.")
    keys = bn_affine_keys(trainers[0].model)
    return weighted_average([(select(t.private_state(), keys), t.data.num_train)
                             for t in trainers])


def save_bn_affine(path: str | Path, affine: Mapping[str, torch.Tensor],
                   sites: Sequence[str]) -> Path:
    """Write averaged BN scale and shift to a safetensors file, atomically."""
    return save_tensors(path, affine, {"kind": "bn-affine-average", "sites": list(sites)})


def load_bn_affine(path: str | Path) -> Weights:
    """Read a file written by :func:`save_bn_affine`."""
    tensors, meta = load_tensors(path)
    if meta.get("kind") != "bn-affine-average":
        raise ValueError(
            f"{path} is not a file of averaged BN scale and shift (metadata kind "
            f"{meta.get('kind')!r}, expected 'bn-affine-average'; see save_bn_affine)."
        )
    return tensors


def _set_affine(model: nn.Module, affine: Mapping[str, torch.Tensor] | None) -> None:
    if affine is None:
        for module in _bn_modules(model):
            if module.affine:
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        return
    keys = bn_affine_keys(model)
    if set(affine) != set(keys):
        raise ValueError(
            f"The BN scale/shift must hold exactly the model's BN parameters {sorted(keys)}; "
            f"got {sorted(affine)}."
        )
    state = model.state_dict()
    with torch.no_grad():
        for key, tensor in affine.items():
            if tuple(tensor.shape) != tuple(state[key].shape):
                raise ShapeMismatchError(
                    f"BN parameter '{key}' has shape {tuple(tensor.shape)} but the model "
                    f"has shape {tuple(state[key].shape)}."
                )
            state[key].copy_(tensor)


@torch.no_grad()
def estimate_bn_statistics(model: nn.Module, x: torch.Tensor, batch_size: int = 512) -> None:
    """Re-estimate every BN layer's running mean and variance on unlabeled inputs.

    The statistics are reset and accumulated as a cumulative average over the batches
    (``momentum=None``); with one batch they are exactly the data's. Only the BN layers
    run in training mode, so dropout stays off as at test time (which is why this does
    not use ``torch.optim.swa_utils.update_bn``).
    """
    if x.shape[0] < 2:
        raise ValueError(f"Estimating BN statistics needs at least 2 examples, got {x.shape[0]}.")
    layers = [m for m in _bn_modules(model) if m.track_running_stats]
    if not layers:
        raise ValueError("The model has no BN layer with running statistics to estimate.")
    was_training = model.training
    momenta = {m: m.momentum for m in layers}
    model.eval()
    device = next(model.parameters()).device
    try:
        for m in layers:
            m.reset_running_stats()
            m.momentum = None
            m.train()
        for start in range(0, x.shape[0], batch_size):
            chunk = x[start:start + batch_size]
            if chunk.shape[0] < 2:  # BN cannot take the variance of one example
                continue
            model(chunk.to(device))
    finally:
        for m, momentum in momenta.items():
            m.momentum = momentum
        model.train(was_training)


def finetune_bn(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, steps: int = 50,
                lr: float = 0.05) -> list[float]:
    """Fine-tune only the BN scale and shift on labeled cases; return the losses.

    Every other parameter is frozen. The model stays in evaluation mode, so the BN
    layers normalise with the statistics estimated on the site's unlabeled data: a few
    labeled cases would give poor batch statistics.
    """
    if steps < 1 or not (lr > 0 and math.isfinite(lr)):
        raise ValueError(f"steps must be >= 1 and lr positive, got steps={steps}, lr={lr}.")
    keys = bn_affine_keys(model)
    flags = {name: p.requires_grad for name, p in model.named_parameters()}
    trainable = [p for name, p in model.named_parameters() if name in keys]
    if not trainable:
        raise ValueError("The model has no BN scale or shift to fine-tune.")
    device = next(model.parameters()).device
    xb, yb = x.to(device), y.to(device)
    optimiser = torch.optim.SGD(trainable, lr=lr)
    was_training = model.training
    model.eval()
    losses = []
    try:
        for name, p in model.named_parameters():
            p.requires_grad_(name in keys)
        for _ in range(steps):
            optimiser.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            optimiser.step()
            losses.append(float(loss.detach()))
    finally:
        for name, p in model.named_parameters():
            p.requires_grad_(flags[name])
        model.train(was_training)
    return losses


def adapt_model(model: nn.Module, weights: Mapping[str, torch.Tensor], unlabeled: torch.Tensor,
                *, affine: Mapping[str, torch.Tensor] | None = None,
                batch_size: int = 512, source: str = "the federation") -> nn.Module:
    """Give a model the federation's shared weights and the site's own BN layers.

    Parameters
    ----------
    model : torch.nn.Module
        A fresh model of the federation's architecture; changed in place.
    weights : mapping
        The federation's weights; only the shared (non-BN) keys are used.
    unlabeled : torch.Tensor
        The site's inputs on which the BN statistics are estimated.
    affine : mapping, optional
        BN scale and shift to use (e.g. averaged over the training sites); None resets
        them to ``weight=1, bias=0``.
    batch_size : int
        Batch size of the statistics pass.
    source : str
        Where the weights came from, for error messages.

    Returns
    -------
    torch.nn.Module
        ``model``, in evaluation mode.
    """
    _check_weights(model, weights, source)
    shared = select(weights, partition_model(model).shared)
    state = model.state_dict()
    with torch.no_grad():
        for key, tensor in shared.items():
            state[key].copy_(tensor)
    _set_affine(model, affine)
    estimate_bn_statistics(model, unlabeled, batch_size)
    return model.eval()


def few_shot_indices(labels: torch.Tensor, shots: int, seed: int) -> torch.Tensor:
    """Draw ``shots`` examples of every class, reproducibly."""
    gen = torch.Generator().manual_seed(seed)
    picked = []
    for cls in torch.unique(labels).tolist():
        idx = torch.nonzero(labels == cls).flatten()
        if idx.numel() < shots:
            counts = {int(c): int((labels == c).sum()) for c in torch.unique(labels)}
            raise ValueError(
                f"shots={shots} labeled cases per class were asked for, but class {cls} has "
                f"only {idx.numel()} (cases per class: {counts}). Use shots <= "
                f"{min(counts.values())}."
            )
        picked.append(idx[torch.randperm(idx.numel(), generator=gen)[:shots]])
    return torch.sort(torch.cat(picked)).values


# -- the comparison ----------------------------------------------------------------------
@dataclass(frozen=True)
class OnboardingOptions:
    """Settings of test-time onboarding.

    Attributes
    ----------
    shots : int
        Labeled cases per class for BN fine-tuning and the local reference (0: neither).
    finetune_steps, finetune_lr : int, float
        Full-batch SGD steps and learning rate of BN fine-tuning.
    stats_batch_size : int
        Batch size of the BN statistics pass.
    reference : bool
        Also train a fresh model on the labeled cases alone (SingleSet reference).
    reference_epochs : int
        Epochs of that reference.
    seed : int
        Seeds the labeled-case draw and the reference model.
    """

    shots: int = 5
    finetune_steps: int = 50
    finetune_lr: float = 0.05
    stats_batch_size: int = 512
    reference: bool = True
    reference_epochs: int = 100
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("shots", "finetune_steps", "stats_batch_size", "reference_epochs"):
            value = getattr(self, name)
            minimum = 0 if name == "shots" else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}.")
        if not (self.finetune_lr > 0 and math.isfinite(self.finetune_lr)):
            raise ValueError(f"finetune_lr must be a positive number, got {self.finetune_lr}.")


@dataclass
class OnboardingResult:
    """Metrics of each onboarding method on one site.

    Attributes
    ----------
    site : str
        The onboarded site.
    metrics : dict
        ``{method: {"test_accuracy": ..., "test_auc": ..., "val_accuracy": ...}}``.
    labels : dict
        ``{method: row label for tables}``.
    counts : dict
        Unlabeled, labeled and test examples used.
    sources : list of str
        Where each set of weights came from.
    notes : list of str
        What was done that a reader should know (e.g. a quick federation was trained).
    """

    site: str
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    round: int | None = None

    def flat_metrics(self) -> dict[str, float]:
        """Return ``{"<method>_<metric>": value}`` for logging."""
        return {f"{m}_{k}": v for m, vals in self.metrics.items() for k, v in vals.items()}

    def table(self, columns: Sequence[str] = ("test_accuracy", "test_auc")) -> str:
        """Return the comparison as a markdown table (rates in %)."""
        return method_table({m: [v] for m, v in self.metrics.items()}, self.labels, columns)


def _name(strategy: str | None, full: bool) -> str:
    if strategy:
        return re.sub(r"[^a-z0-9]+", "_", strategy.lower()).strip("_")
    return "fedavg" if full else "fedbn"


def _labels(name: str, shots: int, affine: str) -> dict[str, str]:
    pretty = {"fedavg": "FedAvg", "fedbn": "FedBN"}.get(name, name)
    tag = {"fedavg": ("(a) ", "", ""), "fedbn": ("", "(b) ", "(c) ")}.get(name, ("", "", ""))
    return {
        f"{name}_as_is": f"{tag[0]}{pretty} global model as is",
        f"{name}_local_bn_reset": f"{pretty} + local BN stats, scale/shift reset",
        f"{name}_local_bn": f"{tag[1]}{pretty} + local BN stats, {affine} scale/shift",
        f"{name}_local_bn_finetune": f"{tag[2]}{pretty} + local BN stats + BN fine-tune "
                                     f"({shots}/class)",
    }


def _evaluate(site: str, model: nn.Module, data: SiteData, device: str) -> dict[str, float]:
    # SingleSet exchanges nothing, so evaluate() loads no weight and scores the model as is.
    return dict(SiteTrainer(site, model, data, SingleSet(), device=device).evaluate())


def onboard(
    site: str,
    data: SiteData,
    make_model: Callable[[], nn.Module],
    sources: Sequence[FederationWeights],
    *,
    input_shape: Sequence[int],
    affine: Mapping[str, torch.Tensor] | None = None,
    options: OnboardingOptions | None = None,
    device: str = "cpu",
) -> OnboardingResult:
    """Onboard a site that never trained and score every method on its test split.

    Parameters
    ----------
    site : str
        The new site's name.
    data : SiteData
        Its data: BN statistics come from the train and validation inputs (labels
        unused), the labeled cases from the train split, the scores from val and test.
    make_model : callable
        Returns a fresh model of the federation's architecture.
    sources : sequence of FederationWeights
        One or more federations' weights. Full weights (FedAvg, BN included) also give
        the "as is" method; every source gives "local BN" and "local BN + fine-tuning".
    input_shape : sequence of int
        Shape of one example the federation's model takes; checked first.
    affine : mapping, optional
        Averaged BN scale and shift for sources without BN layers (FedBN); None resets
        them. A FedAvg source uses its own global BN scale and shift.
    options : OnboardingOptions, optional
        Shots, fine-tuning and reference settings.
    device : str
        Where to compute.

    Returns
    -------
    OnboardingResult
    """
    options = options or OnboardingOptions()
    check_site_fits(site, data.input_shape, input_shape)
    if not sources:
        raise ValueError("Onboarding needs the weights of at least one federation; none given.")
    for src in sources:
        _check_weights(make_model(), src.weights, src.source)
    unlabeled = torch.cat([data.train[0], data.val[0]])
    result = OnboardingResult(site=site, sources=[s.source for s in sources],
                              round=next((s.round for s in sources if s.round), None))
    labeled = None
    if options.shots:
        idx = few_shot_indices(data.train[1], options.shots,
                               derive_seed(options.seed, site, "few-shot"))
        labeled = (data.train[0][idx], data.train[1][idx])
    result.counts = {"unlabeled": int(unlabeled.shape[0]),
                     "labeled": 0 if labeled is None else int(labeled[1].numel()),
                     "test": int(data.test[1].numel())}

    for src in sources:
        probe = make_model()
        full = partition_model(probe).private <= set(src.weights)
        name = _name(src.strategy, full)
        labels = _labels(name, options.shots, "global" if full else
                         "reset" if affine is None else "averaged")
        if full:
            model = make_model()
            model.load_state_dict(dict(src.weights))
            result.metrics[f"{name}_as_is"] = _evaluate(site, model, data, device)
            result.labels[f"{name}_as_is"] = labels[f"{name}_as_is"]
        own = select(src.weights, bn_affine_keys(probe)) if full else affine
        if not full and affine is not None:  # what sharing the averaged scale/shift buys
            model = adapt_model(make_model(), src.weights, unlabeled, affine=None,
                                batch_size=options.stats_batch_size, source=src.source)
            result.metrics[f"{name}_local_bn_reset"] = _evaluate(site, model, data, device)
            result.labels[f"{name}_local_bn_reset"] = labels[f"{name}_local_bn_reset"]
        model = adapt_model(make_model(), src.weights, unlabeled, affine=own,
                            batch_size=options.stats_batch_size, source=src.source)
        result.metrics[f"{name}_local_bn"] = _evaluate(site, model, data, device)
        result.labels[f"{name}_local_bn"] = labels[f"{name}_local_bn"]
        if labeled is not None:
            finetune_bn(model, *labeled, steps=options.finetune_steps, lr=options.finetune_lr)
            result.metrics[f"{name}_local_bn_finetune"] = _evaluate(site, model, data, device)
            result.labels[f"{name}_local_bn_finetune"] = labels[f"{name}_local_bn_finetune"]

    if labeled is not None and options.reference:
        torch.manual_seed(derive_seed(options.seed, site, "reference-init"))
        local = SiteData(train=labeled, val=data.val, test=data.test)
        trainer = SiteTrainer(site, make_model(), local, SingleSet(),
                              batch_size=max(2, min(32, labeled[1].numel())),
                              local_epochs=options.reference_epochs, seed=options.seed,
                              device=device)
        trainer.train({}, {"round": 1})
        result.metrics["local_few_shot"] = dict(trainer.evaluate())
        result.labels["local_few_shot"] = (f"local only, {options.shots}/class labeled "
                                           "(SingleSet ref.)")
    return result


# -- ABIDE sites ----------------------------------------------------------------------------
@dataclass(frozen=True)
class TrainedFederation:
    """An in-process federation's final weights and its sites' averaged BN scale and shift."""

    weights: FederationWeights
    bn_affine: Mapping[str, torch.Tensor]
    input_shape: tuple[int, ...]


def train_federation(config: ExperimentConfig,
                     datas: Mapping[str, SiteData] | None = None) -> TrainedFederation:
    """Train a federation of ``config.sites`` in this process.

    Parameters
    ----------
    config : ExperimentConfig
        Strategy, rounds, seed and the training sites.
    datas : mapping, optional
        Already loaded site data, to avoid reading it again.
    """
    sites = load_sites(list(config.sites))
    datas = {n: (datas or {}).get(n) or prepare_site_data(sites[n], config) for n in sites}
    shapes = {n: d.input_shape for n, d in datas.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"The training sites' data differ in shape: {shapes}.")
    trainers = {n: build_trainer(sites[n], config, datas[n]) for n in sites}
    strategy = config.strategy_obj()
    if strategy.pooled or not strategy.exchanges:
        raise ValueError(f"Strategy '{strategy.label}' has no global model to onboard from; "
                         "use a federated strategy such as 'fedbn' or 'fedavg'.")
    # The rounds of fedbn_med.driver.run_in_process without its per-round evaluation,
    # which (scikit-learn scoring) is about 80 % of a small run's time and unused here.
    global_weights = next(iter(trainers.values())).shared_weights()
    for rnd in range(1, config.rounds + 1):
        updates = [t.train(global_weights, {"round": rnd})[:2] for t in trainers.values()]
        global_weights = weighted_average(updates)
    affine = average_bn_affine(trainers.values()) if strategy.keeps_private else {}
    weights = FederationWeights(
        weights=global_weights,
        source=f"in-process {strategy.label} federation of {', '.join(sites)} "
               f"({config.rounds} rounds, seed {config.seed})",
        round=config.rounds, strategy=strategy.label,
    )
    return TrainedFederation(weights, affine, next(iter(shapes.values())))


def onboard_new_site(
    site: SiteConfig,
    config: ExperimentConfig,
    *,
    federation: WeightsSource | None = None,
    fedavg: WeightsSource | None = None,
    bn_affine: str | Path | None = None,
    options: OnboardingOptions | None = None,
    tracking_uri: str | None = None,
    log: bool = True,
) -> OnboardingResult:
    """Onboard an ABIDE site from a federation's weights, score it and log it to MLflow.

    Parameters
    ----------
    site : SiteConfig
        The new site; its data come from ``site.data_dir`` or the built-in cohort.
    config : ExperimentConfig
        Fold, seed and device; with no ``federation``, also the quick federation's
        settings (strategy FedBN and FedAvg, ``config.sites``, ``config.rounds``).
    federation : CheckpointSource or MlflowRunSource, optional
        The federation's weights. None trains a FedBN and a FedAvg federation on
        ``config.sites`` in this process first (their averaged BN scale and shift stand
        in for a consortium that shares them).
    fedavg : CheckpointSource or MlflowRunSource, optional
        A FedAvg run's full weights, for the FedAvg rows.
    bn_affine : path, optional
        File of averaged BN scale and shift (:func:`save_bn_affine`); else they are reset.
    options : OnboardingOptions, optional
        Shots, fine-tuning and reference settings.
    tracking_uri : str, optional
        MLflow store; defaults to the tracker's default.
    log : bool
        Log the result to MLflow (experiment ``abide-onboarding``).
    """
    if site.name in config.sites and federation is None:
        raise ValueError(
            f"Site '{site.name}' is one of the training sites ({', '.join(config.sites)}); "
            "onboarding is for a site that took no part in training."
        )
    affine = load_bn_affine(bn_affine) if bn_affine is not None else None
    loaded = [src.load() for src in (federation, fedavg) if src is not None]
    data = prepare_site_data(site, config)
    notes = []
    if federation is None:
        note = (f"No checkpoint or MLflow run given: training a quick FedBN and FedAvg "
                f"federation in-process on {', '.join(config.sites)} ({config.rounds} rounds) "
                "first; the FedBN sites' averaged BN scale and shift are used.")
        logger.info(note)
        notes.append(note)
        training = load_sites(list(config.sites))
        datas = {n: prepare_site_data(cfg, config) for n, cfg in training.items()}
        check_site_fits(site.name, data.input_shape, next(iter(datas.values())).input_shape)
        fedbn_run = train_federation(config.replace(strategy="fedbn"), datas)
        loaded = [fedbn_run.weights, *(loaded or [
            train_federation(config.replace(strategy="fedavg"), datas).weights])]
        affine = affine if affine is not None else dict(fedbn_run.bn_affine)
        input_shape = fedbn_run.input_shape
    else:
        input_shape = abide_input_shape(loaded[0].weights)
    if affine is None:
        notes.append("No averaged BN scale/shift given: the new site's are reset (1, 0).")
    check_site_fits(site.name, data.input_shape, input_shape)
    result = onboard(site.name, data, lambda: build_model(int(input_shape[0]), config),
                     loaded, input_shape=input_shape, affine=affine, options=options,
                     device=str(resolve_device(config.device)))
    result.notes = notes + result.notes
    if log:
        run_id = log_onboarding(result, params={**config.params(),
                                                **_option_params(options)},
                                tracking_uri=tracking_uri)
        result.notes.append(f"Logged to MLflow experiment '{ONBOARDING_EXPERIMENT}', "
                            f"site run {run_id}.")
    return result


def _option_params(options: OnboardingOptions | None) -> dict[str, object]:
    opts = options or OnboardingOptions()
    return {f"onboarding_{k}": v for k, v in dataclasses.asdict(opts).items()}


def log_onboarding(result: OnboardingResult, *, params: Mapping[str, object] | None = None,
                   tracking_uri: str | None = None,
                   experiment: str = ONBOARDING_EXPERIMENT) -> str:
    """Log an onboarding as a parent run with a new site run; return the site run's ID."""
    from fedbn_med.tracking import FederationTracker

    tags = {"kind": "onboarding", "onboarded_site": result.site,
            "weights_source": " | ".join(result.sources)[:5000]}
    tracker = FederationTracker(experiment, f"onboard-{result.site}",
                                {**(params or {}), **{f"count_{k}": v for k, v in
                                                      result.counts.items()}},
                                (), tracking_uri=tracking_uri, tags=tags)
    step = result.round or 0
    run_id = tracker.add_site(result.site, first_round=step + 1)
    tracker.log_round(step, {result.site: result.flat_metrics()})
    tracker.log_text(result.table() + "\n", "onboarding.md")
    tracker.finish()
    return run_id


def method_table(per_method: Mapping[str, Sequence[Mapping[str, float]]],
                 labels: Mapping[str, str],
                 columns: Sequence[str] = ("test_accuracy", "test_auc")) -> str:
    """Return a markdown table, one row per method, mean (std) over runs in %."""
    header = ["method", *[c.replace("test_", "") for c in columns], "runs"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for method, runs in per_method.items():
        row = [labels.get(method, method)]
        for col in columns:
            vals = np.array([float(r[col]) for r in runs if col in r], dtype=float)
            vals = vals[~np.isnan(vals)]
            if vals.size == 0:
                row.append("n/a")
            elif vals.size == 1:
                row.append(f"{100 * vals[0]:.1f}")
            else:
                row.append(f"{100 * vals.mean():.1f} ({100 * vals.std():.1f})")
        row.append(str(len(runs)))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)
