"""Assemble a federation from site configs: data, splits, models and trainers.

Both engines build their sites through :func:`build_trainer`, so the in-process driver
and the Flower deployment train on the same data with the same initial weights.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from typing import TYPE_CHECKING

import numpy as np
import torch

from fedbn_med.model import AbideMLP
from fedbn_med.sites import SiteConfig, load_sites
from fedbn_med.strategies import Strategy, get_strategy
from fedbn_med.tasks import Task, register_task

if TYPE_CHECKING:  # the data and training stack loads only where a site trains
    from fedbn_med.driver import History
    from fedbn_med.trainer import SiteData, SiteTrainer

__all__ = [
    "ExperimentConfig",
    "build_model",
    "build_trainer",
    "prepare_site_data",
    "resolve_site_data_dir",
    "run_experiment",
]

logger = logging.getLogger(__name__)

DEFAULT_SITES = ("NYU", "UM", "USM", "UCLA")


@dataclass(frozen=True)
class ExperimentConfig:
    """Every setting of a federated ABIDE run; validated on construction.

    Attributes mirror the command-line options of ``pipelines/abide_fedbn.py``.
    ``data_dir`` None means each site's own config, else the built-in cohort.
    """

    strategy: str = "fedbn"
    mu: float | None = None
    rounds: int = 30
    local_epochs: int = 1
    batch_size: int = 32
    lr: float = 1e-2
    dropout: float = 0.0
    seed: int = 0
    fold: int = 0
    n_folds: int = 5
    sites: tuple[str, ...] = DEFAULT_SITES
    data_dir: Path | None = None
    device: str = "auto"
    site_effect: float = 1.0
    extra: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        get_strategy(self.strategy, self.mu)  # validates name and mu
        for name in ("rounds", "local_epochs", "batch_size", "n_folds"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        if not 0 <= self.fold < self.n_folds:
            raise ValueError(f"fold must be in 0..{self.n_folds - 1}, got {self.fold}.")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be a positive number, got {self.lr}.")
        if not self.sites:
            raise ValueError("sites must name at least one site.")

    def strategy_obj(self) -> Strategy:
        """Return the strategy object."""
        return get_strategy(self.strategy, self.mu)

    def params(self) -> dict[str, object]:
        """Return the settings as flat loggable parameters."""
        out = dataclasses.asdict(self)
        out["sites"] = ",".join(self.sites)
        out["strategy_label"] = self.strategy_obj().label
        out.pop("extra")
        return out

    def replace(self, **changes: object) -> ExperimentConfig:
        """Return a copy with some settings changed."""
        return dataclasses.replace(self, **changes)


def resolve_site_data_dir(site: SiteConfig, config: ExperimentConfig) -> Path:
    """Return the folder holding ``ABIDE_pcp/`` for a site.

    Order: the run's ``data_dir``, then the site file's ``data_dir``, then the built-in
    cohort (generated on first use under ``$FEDBN_MED_DATA`` or ``~/fedbn_med_data``).
    """
    if config.data_dir is not None:
        return Path(config.data_dir)
    if site.data_dir is not None:
        return site.data_dir
    from fedbn_med.data.cohort import DEFAULT_SITE_IDS, ensure_cohort

    wanted = tuple(dict.fromkeys((*DEFAULT_SITE_IDS, *site.abide_site_ids)))
    return ensure_cohort(sites=wanted, site_effect=config.site_effect)


def prepare_site_data(site: SiteConfig, config: ExperimentConfig) -> SiteData:
    """Load a site's connectivity features and split them for this run's fold."""
    from fedbn_med.data.abide import load_site_features
    from fedbn_med.data.splits import site_splits
    from fedbn_med.trainer import SiteData

    data_dir = resolve_site_data_dir(site, config)
    feats = load_site_features(data_dir, site.abide_site_ids, name=site.name)
    split = site_splits(feats.labels, n_folds=config.n_folds, fold=config.fold,
                        seed=site.split_seed)
    x = torch.tensor(np.asarray(feats.features), dtype=torch.float32)
    y = torch.tensor(np.asarray(feats.labels), dtype=torch.int64)

    def part(idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.as_tensor(np.array(idx, dtype=np.int64))
        return x[index], y[index]

    return SiteData(train=part(split.train), val=part(split.val), test=part(split.test))


def build_model(in_features: int, config: ExperimentConfig) -> AbideMLP:
    """Build the ABIDE network with the run's seed, identical at every site."""
    torch.manual_seed(config.seed)
    return AbideMLP(in_features, dropout=config.dropout)


def build_trainer(
    site: SiteConfig, config: ExperimentConfig, data: SiteData | None = None,
    device: str | None = None,
) -> SiteTrainer:
    """Build the trainer of one site for this run."""
    from fedbn_med.trainer import SiteTrainer

    data = data if data is not None else prepare_site_data(site, config)
    return SiteTrainer(
        site.name, build_model(data.num_features, config), data, config.strategy_obj(),
        lr=config.lr, batch_size=config.batch_size, local_epochs=config.local_epochs,
        seed=config.seed, device=device or (config.device if config.device != "auto"
                                            else site.device),
    )


def pooled_data(datas: Sequence[SiteData]) -> SiteData:
    """Concatenate every site's training data (validation/test stay per site)."""
    from fedbn_med.trainer import SiteData

    xs = torch.cat([d.train[0] for d in datas])
    ys = torch.cat([d.train[1] for d in datas])
    empty = (xs[:0], ys[:0])
    return SiteData(train=(xs, ys), val=empty, test=empty)


def run_experiment(
    config: ExperimentConfig,
    on_round: Callable[[int, Mapping[str, Mapping[str, float]]], None] | None = None,
    site_configs: Mapping[str, SiteConfig] | None = None,
) -> History:
    """Run one federation in this process and return its history."""
    from fedbn_med.driver import run_in_process
    from fedbn_med.trainer import SiteTrainer

    sites = site_configs or load_sites(list(config.sites))
    datas = {name: prepare_site_data(cfg, config) for name, cfg in sites.items()}
    trainers = {name: build_trainer(sites[name], config, datas[name]) for name in sites}
    pooled = None
    if config.strategy_obj().pooled:
        pooled = SiteTrainer(
            "pooled", build_model(next(iter(datas.values())).num_features, config),
            pooled_data(list(datas.values())), config.strategy_obj(), lr=config.lr,
            batch_size=config.batch_size, local_epochs=config.local_epochs,
            seed=config.seed, device=config.device,
        )
    return run_in_process(trainers, config.strategy_obj(), config.rounds, pooled=pooled,
                          on_round=on_round)


def _abide_site(name: str, config: ExperimentConfig, data_dir: Path | None, device: str
                ) -> SiteTrainer:
    site = load_sites([name])[name]
    config = config.replace(data_dir=data_dir) if data_dir is not None else config
    return build_trainer(site, config, device=device if device != "auto" else site.device)


ABIDE_TASK = register_task(Task(
    name="abide", experiment="abide-fedbn", build_site=_abide_site,
    build_server_model=lambda config, shape: build_model(int(shape[0]), config),
    default_input_shape=(6105,),
))
