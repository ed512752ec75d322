"""Onboard a site of any task: its data and model from the task, its weights from a federation.

:func:`onboard_new_site` builds the new site through the task registry
(:func:`fedbn_med.tasks.get_task`: the task's ``site_data`` where it has one, then its
``build_site``; the federation's model from ``build_server_model``), takes the
federation's weights (a server checkpoint, an MLflow run, or a quick federation trained
here on ``config.sites``), compares the onboarding methods with
:func:`~fedbn_med.onboarding.compare.onboard`, scored by the site's own objective (ABIDE:
accuracy and AUC; MRI: Dice), and logs the comparison to ``<task>-onboarding``.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch
from torch import nn

from fedbn_med.onboarding.bn_adapt import load_bn_affine
from fedbn_med.onboarding.compare import (
    OnboardingOptions,
    OnboardingResult,
    log_onboarding,
    onboard,
)
from fedbn_med.onboarding.weights import (
    WeightsSource,
    check_site_fits,
    train_federation,
)
from fedbn_med.tasks import Task, get_task
from fedbn_med.training.trainer import SiteTrainer, resolve_device

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

if TYPE_CHECKING:
    from fedbn_med.spec import RunSpec

__all__ = ["NamedSite", "federation_input_shape", "onboard_new_site", "table_columns"]

logger = logging.getLogger(__name__)


class NamedSite(Protocol):
    """A site's configuration as onboarding reads it: its name (an ABIDE ``SiteConfig``)."""

    @property
    def name(self) -> str:
        """Return the site's name (its file in ``sites/``)."""
        ...


def check_one_kind_of_data(task: str, given: Mapping[str, str | Path | None]) -> None:
    """Refuse onboarding that would mix built-in (generated) sites with real ones.

    ``given`` maps each site to the data root given for it (None: its site file decides).
    A site reads real data when a root is given or its file names one (``data_dir``,
    ``datalist``, ``scans``); else it reads the built-in data. Weights learnt on generated
    data say nothing about a real site, so a mix is refused, naming both groups.
    """
    from fedbn_med.tasks.site_toml import sites_dir

    real: dict[str, str] = {}
    for site, root in given.items():
        if root is not None:
            real[site] = str(root)
            continue
        for path in (sites_dir() / f"{site}.toml", sites_dir() / task / f"{site}.toml"):
            if path.is_file():
                raw = tomllib.loads(path.read_text(encoding="utf-8"))
                named = [str(raw[k]) for k in ("data_dir", "datalist", "scans") if raw.get(k)]
                if named:
                    real[site] = f"{named[0]} (its site file {path})"
                break
    built_in = [s for s in given if s not in real]
    if real and built_in:
        raise ValueError(
            "Onboarding would mix built-in (generated) data and real data: built-in "
            f"{', '.join(built_in)}; real " + "; ".join(f"{s}: {d}" for s, d in real.items())
            + ". Give --data-dir (it applies to every site), or set data_dir in each site's "
            "file.")


def table_columns(task: Task) -> tuple[str, ...]:
    """Return the metrics an onboarding table shows for ``task``.

    The metrics a task's settings name for its comparisons (``METRICS``: MRI Dice and
    Dice per tissue, histo Dice and AJI); else the task's headline first, then its parts
    (``dice_csf``, ...), then AUC where the task scores it (ABIDE accuracy and AUC).
    """
    from fedbn_med.spec import settings_module

    named = getattr(settings_module(task.name), "METRICS", None)
    if named:
        return tuple(f"test_{m}" for m in named)
    head = task.headline
    names = [head, *(m for m in task.score_metrics if m.startswith(f"{head}_")),
             *(["auc"] if "auc" in task.score_metrics else [])]
    return tuple(f"test_{m}" for m in dict.fromkeys(names))


def federation_input_shape(probe: nn.Module, weights: Mapping[str, torch.Tensor],
                           default: tuple[int, ...]) -> tuple[int, ...]:
    """Return the shape of one example the federation's weights take.

    The first dimension (features of an MLP, channels of a convolutional network) is
    the first layer's input in ``weights``; the others are the run's (``default``). The
    first layer is the first weight of two or more dimensions of ``probe``, a model of
    the same architecture. Weights without that layer give ``default`` (and are refused
    when checked against the model).
    """
    state = probe.state_dict()
    first = next((k for k, v in state.items() if v.ndim >= 2), None)
    if first is None or first not in weights or weights[first].ndim != state[first].ndim:
        return default
    return (int(weights[first].shape[1]), *default[1:])


def _site_trainer(task: Task, name: str, config: RunSpec) -> SiteTrainer:
    """Return the site's trainer as its task builds it (its data, objective, optimiser)."""
    given = {"data": task.site_data(name, config)} if task.site_data is not None else {}
    return task.build_site(name, config, None, config.device, **given)


def onboard_new_site(
    site: str | NamedSite,
    config: RunSpec,
    *,
    data_dir: str | Path | None = None,
    federation: WeightsSource | None = None,
    fedavg: WeightsSource | None = None,
    bn_affine: str | Path | None = None,
    options: OnboardingOptions | None = None,
    tracking_uri: str | None = None,
    log: bool = True,
) -> OnboardingResult:
    """Onboard a site of ``config.task`` from a federation's weights, score it and log it.

    Parameters
    ----------
    site : str or NamedSite
        The new site's name (its file in ``sites/``, ``sites/<task>/``), or its
        configuration: an ABIDE ``SiteConfig`` whose ``data_dir`` is where its data are.
    config : RunSpec
        Task, fold, seed, device and the task's settings; with no ``federation``, also
        the quick federation's settings (strategy FedBN and FedAvg, ``config.sites``,
        ``config.rounds``).
    data_dir : path, optional
        The new site's data root (ABIDE: the folder holding ``ABIDE_pcp/``); the
        training sites keep theirs.
    federation : CheckpointSource, RunFolderSource or MlflowRunSource, optional
        The federation's weights. None trains a FedBN and a FedAvg federation on
        ``config.sites`` in this process first (their averaged BN scale and shift stand
        in for a consortium that shares them).
    fedavg : CheckpointSource, RunFolderSource or MlflowRunSource, optional
        A FedAvg run's full weights, for the FedAvg rows.
    bn_affine : path, optional
        File of averaged BN scale and shift (:func:`save_bn_affine`); else they are reset.
    options : OnboardingOptions, optional
        Shots, fine-tuning and reference settings.
    tracking_uri : str, optional
        MLflow store; defaults to the tracker's default.
    log : bool
        Log the result to MLflow (experiment ``<task>-onboarding``).
    """
    name = site if isinstance(site, str) else site.name
    own_dir = data_dir if data_dir is not None else getattr(site, "data_dir", None)
    if data_dir is not None:  # the data root of every site: the new one and the training ones
        config = config.replace(data_dir=Path(data_dir))
    if federation is None:
        check_one_kind_of_data(config.task, {name: own_dir, **{
            s: config.data_dir for s in config.sites}})
    if name in config.sites and federation is None:
        raise ValueError(
            f"Site '{name}' is one of the training sites ({', '.join(config.sites)}); "
            "onboarding is for a site that took no part in training."
        )
    task = get_task(config.task)
    affine = load_bn_affine(bn_affine) if bn_affine is not None else None
    loaded = [src.load() for src in (federation, fedavg) if src is not None]
    own = _site_trainer(task, name, config if own_dir is None
                        else config.replace(data_dir=Path(own_dir)))
    notes = []
    if federation is None:
        note = (f"No checkpoint or MLflow run given: training a quick FedBN and FedAvg "
                f"federation in-process on {', '.join(config.sites)} ({config.rounds} rounds) "
                "first; the FedBN sites' averaged BN scale and shift are used.")
        logger.info(note)
        notes.append(note)
        datas = ({n: task.site_data(n, config) for n in config.sites}
                 if task.site_data is not None else None)
        if datas:  # refused before minutes of training
            check_site_fits(name, own.input_shape, next(iter(datas.values())).input_shape)
        fedbn_run = train_federation(config.replace(strategy="fedbn"), datas)
        loaded = [fedbn_run.weights, *(loaded or [
            train_federation(config.replace(strategy="fedavg"), datas).weights])]
        affine = affine if affine is not None else dict(fedbn_run.bn_affine)
        input_shape = fedbn_run.input_shape
    else:
        input_shape = federation_input_shape(
            task.build_server_model(config, config.input_shape()), loaded[0].weights,
            config.input_shape())
    if affine is None:
        notes.append("No averaged BN scale/shift given: the new site's are reset (1, 0).")
    check_site_fits(name, own.input_shape, input_shape)
    result = onboard(name, own.data, lambda: task.build_server_model(config, input_shape),
                     loaded, input_shape=input_shape, affine=affine, options=options,
                     device=str(resolve_device(config.device)), trainer=own)
    result.columns = table_columns(task)
    result.notes = notes + result.notes
    if log:
        experiment = f"{task.name}-onboarding"
        run_id = log_onboarding(result, params={**config.params(), **_option_params(options)},
                                tracking_uri=tracking_uri, experiment=experiment)
        result.notes.append(f"Logged to MLflow experiment '{experiment}', site run {run_id}.")
    return result


def _option_params(options: OnboardingOptions | None) -> dict[str, object]:
    opts = options or OnboardingOptions()
    return {f"onboarding_{k}": v for k, v in dataclasses.asdict(opts).items()}
