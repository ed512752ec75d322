"""Task ``"abide"``: autism diagnosis from resting-state connectivity across ABIDE sites.

Each site classifies subjects (ASD or control) from the 6105 Fisher-z correlations of
their 111 Harvard-Oxford ROI time series, with the FedBN paper's MLP; under FedBN its
batch-norm layers stay at their site.

The task's files: ``sites`` (one TOML file per institution), ``data`` (ABIDE PCP files to
features), ``cohort`` (the built-in ABIDE-format cohort), ``splits`` (per-site folds),
``model`` (the MLP), ``objective`` (loss and metrics), ``settings`` and ``build`` (a
site's trainer from these). Importing this package registers the task (see
:mod:`fedbn_med.tasks`) without importing torch: the builders are imported when a site or
the server model is first built.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fedbn_med.tasks import Task, register_task
from fedbn_med.tasks.abide.settings import Settings

if TYPE_CHECKING:
    from fedbn_med.spec import RunSpec
    from fedbn_med.tasks.abide.model import AbideMLP
    from fedbn_med.trainer import SiteTrainer

__all__ = ["ABIDE_TASK"]


def _build_site(name: str, config: RunSpec, data_dir: Path | None,
                device: str) -> SiteTrainer:
    from fedbn_med.tasks.abide.build import build_site

    return build_site(name, config, data_dir, device)


def _build_server_model(config: RunSpec, input_shape: tuple[int, ...]) -> AbideMLP:
    from fedbn_med.tasks.abide.build import build_server_model

    return build_server_model(config, input_shape)


def _build_pooled(trainers: Mapping[str, SiteTrainer], config: RunSpec) -> SiteTrainer:
    from fedbn_med.tasks.abide.build import build_pooled

    return build_pooled(trainers, config)


def _prepare(config: RunSpec) -> None:
    from fedbn_med.tasks.abide.build import prepare

    prepare(config)


def _check_sites(names: Sequence[str]) -> None:
    from fedbn_med.tasks.abide.sites import load_sites

    load_sites(list(names))


ABIDE_TASK = register_task(Task(
    name="abide", experiment="abide-fedbn", build_site=_build_site,
    build_server_model=_build_server_model, default_input_shape=Settings().input_shape(),
    check_sites=_check_sites, build_pooled=_build_pooled, prepare=_prepare,
    preload=("fedbn_med.tasks.abide.build", "fedbn_med.tasks.abide.data",
             "fedbn_med.tasks.abide.cohort", "fedbn_med.tasks.abide.splits"),
))
