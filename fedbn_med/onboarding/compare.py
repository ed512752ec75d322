"""Compare the ways of onboarding a new site, on its test split, and log the comparison.

:func:`onboard` scores the FedAvg global model as it is (with a FedAvg run's full
weights), the same with local BN statistics, FedBN's shared weights with local BN
statistics, each plus BN fine-tuning, and a model trained on the few labeled cases alone
(SingleSet reference), every score through the site's objective (binary metrics for
ABIDE, Dice for MRI). :func:`fedbn_med.onboarding.new_site.onboard_new_site` does it for
a site of any task; :func:`log_onboarding` logs the result as a new site run and
:func:`method_table` prints it.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fedbn_med.evaluation.tables import format_interval
from fedbn_med.fl.partition import partition_model, select
from fedbn_med.fl.strategies import SingleSet
from fedbn_med.onboarding.bn_adapt import adapt_model, bn_affine_keys, check_weights, finetune_bn
from fedbn_med.onboarding.cases import draw_labeled, unlabeled_inputs
from fedbn_med.onboarding.weights import ONBOARDING_EXPERIMENT, FederationWeights, check_site_fits
from fedbn_med.training.objective import BinaryClassification, Objective
from fedbn_med.training.trainer import SiteTrainer, derive_seed

__all__ = [
    "OnboardingOptions",
    "OnboardingResult",
    "log_onboarding",
    "method_table",
    "onboard",
]

logger = logging.getLogger(__name__)

#: The table's columns unless a task says otherwise (ABIDE's: accuracy and AUC).
DEFAULT_COLUMNS = ("test_accuracy", "test_auc")


@dataclass(frozen=True)
class OnboardingOptions:
    """Settings of test-time onboarding.

    Attributes
    ----------
    shots : int
        Labeled cases for BN fine-tuning and the local reference (0: neither): per class
        where the labels are classes (ABIDE, X-ray), in all where they are label maps
        (MRI segmentation); see :mod:`fedbn_med.onboarding.cases`.
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
        ``{method: {"test_<metric>": ..., "val_<metric>": ...}}``, the site objective's
        metrics (ABIDE: accuracy, AUC, ...; MRI: Dice, ...).
    labels : dict
        ``{method: row label for tables}``.
    counts : dict
        Unlabeled, labeled and test examples used.
    sources : list of str
        Where each set of weights came from.
    notes : list of str
        What was done that a reader should know (e.g. a quick federation was trained).
    round : int or None
        The round of the federation's weights, when known.
    columns : tuple of str
        The metrics :meth:`table` shows (the task's headline first).
    """

    site: str
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    round: int | None = None
    columns: tuple[str, ...] = DEFAULT_COLUMNS

    def flat_metrics(self) -> dict[str, float]:
        """Return ``{"<method>_<metric>": value}`` for logging."""
        return {f"{m}_{k}": v for m, vals in self.metrics.items() for k, v in vals.items()}

    def ordered(self) -> list[str]:
        """Return the methods in table order: (a) FedAvg as is, (b) and (c) FedBN, the rest."""
        first = [m for m in _ORDER if m in self.metrics]
        return first + [m for m in self.metrics if m not in first]

    def one_class(self) -> list[str]:
        """Return the methods whose model predicts one class only at this site's test split."""
        return [m for m, v in self.metrics.items()
                if v.get("test_positive_rate") in (0.0, 1.0)]

    def table(self, columns: Sequence[str] | None = None) -> str:
        """Return the comparison as a markdown table (rates in %; default: :attr:`columns`).

        Rows in a fixed order, each lettered; where the site's scores have it, the share
        of test cases predicted positive, and a flag on a model that predicts one class
        only (its accuracy is then that class's share of the test split).
        """
        columns = tuple(self.columns if columns is None else columns)
        if any("test_positive_rate" in v for v in self.metrics.values()):
            columns = (*columns, "test_positive_rate")
        order = self.ordered()
        others = [m for m in order if m not in _ORDER]
        letter = {m: chr(ord("a") + i) for i, m in enumerate([*_ORDER, *others])}
        labels = {m: f"({letter[m]}) {self.labels.get(m, m)}" for m in order}
        table = method_table({m: [self.metrics[m]] for m in order}, labels, columns)
        table = table.replace("| positive_rate |", "| predicted positive |", 1)
        flagged = self.one_class()
        if flagged:
            table += "\n\nWarning: predicts one class only at this site: " + ", ".join(
                labels[m].split(")")[0] + ")" for m in flagged if m in labels) + \
                " (its accuracy is that class's share of the test split)."
        return table


def _name(strategy: str | None, full: bool) -> str:
    if strategy:
        return re.sub(r"[^a-z0-9]+", "_", strategy.lower()).strip("_")
    return "fedavg" if full else "fedbn"


#: An onboarding table's rows, each with its letter whichever are present: (a) FedAvg's
#: global model as is, (b) FedBN's shared layers with the site's own BN statistics, (c)
#: the same, BN fine-tuned, then the variants and the local few-shot reference.
_ORDER = ("fedavg_as_is", "fedbn_local_bn", "fedbn_local_bn_finetune", "fedbn_local_bn_reset",
          "fedavg_local_bn", "fedavg_local_bn_finetune", "local_few_shot")


def _labels(name: str, shots: str, affine: str) -> dict[str, str]:
    pretty = {"fedavg": "FedAvg", "fedbn": "FedBN"}.get(name, name)
    return {
        f"{name}_as_is": f"{pretty} global model as is",
        f"{name}_local_bn_reset": f"{pretty} + local BN stats, scale/shift reset",
        f"{name}_local_bn": f"{pretty} + local BN stats, {affine} scale/shift",
        f"{name}_local_bn_finetune": f"{pretty} + local BN stats + BN fine-tune ({shots})",
    }


def _evaluate(site: str, model: nn.Module, data: Any, objective: Objective, device: str
              ) -> dict[str, float]:
    # SingleSet exchanges nothing, so score() loads no weight and scores the model as is.
    return SiteTrainer(site, model, data, SingleSet(), objective, device=device).score()


def onboard(
    site: str,
    data: Any,
    make_model: Callable[[], nn.Module],
    sources: Sequence[FederationWeights],
    *,
    input_shape: Sequence[int],
    affine: Mapping[str, torch.Tensor] | None = None,
    options: OnboardingOptions | None = None,
    device: str = "cpu",
    trainer: SiteTrainer | None = None,
) -> OnboardingResult:
    """Onboard a site that never trained and score every method on its test split.

    Parameters
    ----------
    site : str
        The new site's name.
    data : SiteData or ImageSiteData
        Its data: BN statistics come from its unlabeled inputs, the labeled cases from
        the train split (:mod:`fedbn_med.onboarding.cases` says which, per kind of
        data), the scores from val and test.
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
    trainer : SiteTrainer, optional
        The site's trainer as its task builds it: its objective scores every method,
        batches the cases and gives the fine-tuning loss; its optimiser trains the
        reference and its batch size batches a dataset site's statistics pass. Default:
        binary classification of tensors, the reference trained by SGD (ABIDE's).

    Returns
    -------
    OnboardingResult
    """
    options = options or OnboardingOptions()
    objective = trainer.objective if trainer is not None else BinaryClassification()
    check_site_fits(site, data.input_shape, input_shape)
    if not sources:
        raise ValueError("Onboarding needs the weights of at least one federation; none given.")
    for src in sources:
        check_weights(make_model(), src.weights, src.source)
    # a dataset site's statistics pass runs in training batches (tensors: stats_batch_size)
    unlabeled = unlabeled_inputs(data, objective, trainer.batch_size if trainer is not None
                                 else options.stats_batch_size,
                                 derive_seed(options.seed, site, "unlabeled"))
    result = OnboardingResult(site=site, sources=[s.source for s in sources],
                              round=next((s.round for s in sources if s.round), None))
    labeled = (draw_labeled(data, objective, options.shots,
                            derive_seed(options.seed, site, "few-shot"))
               if options.shots else None)
    result.counts = {"unlabeled": (int(unlabeled.shape[0]) if isinstance(unlabeled, torch.Tensor)
                                   else len(data.train)),  # rows, or a dataset's cases
                     "labeled": 0 if labeled is None else labeled.cases,
                     "test": _size(data.test)}
    shots = "" if labeled is None else (f"{options.shots}/class" if labeled.per_class
                                        else f"{options.shots} cases")

    def evaluate(key: str, model: nn.Module, labels: Mapping[str, str]) -> None:
        result.metrics[key] = _evaluate(site, model, data, objective, device)
        result.labels[key] = labels[key]

    for src in sources:
        probe = make_model()
        full = partition_model(probe).private <= set(src.weights)
        name = _name(src.strategy, full)
        labels = _labels(name, shots, "global" if full else
                         "reset" if affine is None else "averaged")
        if full:
            model = make_model()
            model.load_state_dict(dict(src.weights))
            evaluate(f"{name}_as_is", model, labels)
        own = select(src.weights, bn_affine_keys(probe)) if full else affine
        if not full and affine is not None:  # what sharing the averaged scale/shift buys
            model = adapt_model(make_model(), src.weights, unlabeled, affine=None,
                                batch_size=options.stats_batch_size, source=src.source)
            evaluate(f"{name}_local_bn_reset", model, labels)
        model = adapt_model(make_model(), src.weights, unlabeled, affine=own,
                            batch_size=options.stats_batch_size, source=src.source)
        evaluate(f"{name}_local_bn", model, labels)
        if labeled is not None:
            finetune_bn(model, labeled.inputs, labeled.targets, steps=options.finetune_steps,
                        lr=options.finetune_lr, loss=objective.loss)
            evaluate(f"{name}_local_bn_finetune", model, labels)

    if labeled is not None and options.reference:
        torch.manual_seed(derive_seed(options.seed, site, "reference-init"))
        local = SiteTrainer(site, make_model(), labeled.data, SingleSet(), objective,
                            trainer.optimiser.fresh() if trainer is not None else "sgd",
                            batch_size=max(2, min(32, labeled.cases)),
                            local_epochs=options.reference_epochs, seed=options.seed,
                            device=device)
        local.fit({}, {"round": 1})
        result.metrics["local_few_shot"] = local.score()
        result.labels["local_few_shot"] = f"local only, {shots} labeled (SingleSet ref.)"
    return result


def _size(split: Any) -> int:
    """Return the examples of a split: a ``(features, labels)`` pair, or a dataset."""
    return int(split[1].numel()) if isinstance(split, tuple) else len(split)




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
