"""Compare the ways of onboarding a new site, on its test split, and log the comparison.

:func:`onboard` scores the FedAvg global model as it is (with a FedAvg run's full
weights), the same with local BN statistics, FedBN's shared weights with local BN
statistics, each plus BN fine-tuning, and a model trained on the few labeled cases alone
(SingleSet reference). :func:`onboard_new_site` does it for an ABIDE site config, from a
server checkpoint, an MLflow run or a quick in-process federation, and logs the result
as a new site run (:func:`log_onboarding`); :func:`method_table` prints it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from fedbn_med.evaluation.tables import format_interval
from fedbn_med.fl.partition import partition_model, select
from fedbn_med.fl.strategies import SingleSet
from fedbn_med.onboarding.bn_adapt import (
    adapt_model,
    bn_affine_keys,
    check_weights,
    few_shot_indices,
    finetune_bn,
    load_bn_affine,
)
from fedbn_med.onboarding.weights import (
    ONBOARDING_EXPERIMENT,
    FederationWeights,
    WeightsSource,
    abide_input_shape,
    check_site_fits,
    train_federation,
)
from fedbn_med.tasks.abide.build import build_model, prepare_site_data
from fedbn_med.tasks.abide.sites import SiteConfig, load_sites
from fedbn_med.training.trainer import SiteData, SiteTrainer, derive_seed, resolve_device

if TYPE_CHECKING:
    from fedbn_med.spec import RunSpec

__all__ = [
    "OnboardingOptions",
    "OnboardingResult",
    "log_onboarding",
    "method_table",
    "onboard",
    "onboard_new_site",
]

logger = logging.getLogger(__name__)


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
    # SingleSet exchanges nothing, so score() loads no weight and scores the model as is.
    return SiteTrainer(site, model, data, SingleSet(), device=device).score()


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
        check_weights(make_model(), src.weights, src.source)
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
        trainer.fit({}, {"round": 1})
        result.metrics["local_few_shot"] = trainer.score()
        result.labels["local_few_shot"] = (f"local only, {options.shots}/class labeled "
                                           "(SingleSet ref.)")
    return result


# -- ABIDE sites -------------------------------------------------------------------------
def onboard_new_site(
    site: SiteConfig,
    config: RunSpec,
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
    config : RunSpec
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
    from fedbn_med.tracking import tracked

    tags = {"kind": "onboarding", "onboarded_site": result.site,
            "weights_source": " | ".join(result.sources)[:5000]}
    logged = {**(params or {}), **{f"count_{k}": v for k, v in result.counts.items()}}
    step = result.round or 0
    with tracked(experiment, f"onboard-{result.site}", logged, tracking_uri=tracking_uri,
                 tags=tags) as tracker:
        run_id = tracker.add_site(result.site, first_round=step + 1)
        tracker.log_round(step, {result.site: result.flat_metrics()})
        tracker.log_text(result.table() + "\n", "onboarding.md")
    return run_id


def method_table(per_method: Mapping[str, Sequence[Mapping[str, float]]],
                 labels: Mapping[str, str],
                 columns: Sequence[str] = ("test_accuracy", "test_auc")) -> str:
    """Return a markdown table, one row per method, mean [95 % CI] over runs in %."""
    header = ["method", *[c.replace("test_", "") for c in columns], "runs"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for method, runs in per_method.items():
        row = [labels.get(method, method)]
        for col in columns:
            row.append(format_interval([float(r[col]) for r in runs if col in r]))
        row.append(str(len(runs)))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)
