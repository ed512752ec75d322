"""Run and node configuration as Flower passes it, parsed once into our own objects."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from fedbn_med.experiment import ExperimentConfig

__all__ = [
    "NodeSettings",
    "ServerSettings",
    "experiment_from_run_config",
    "run_config_from_experiment",
]


def _get(cfg: Mapping[str, object], key: str, default: object) -> object:
    value = cfg.get(key, default)
    return default if value is None else value


def run_config_from_experiment(config: ExperimentConfig) -> dict[str, object]:
    """Return the Flower run-config entries describing ``config``."""
    return {
        "strategy": config.strategy,
        "mu": -1.0 if config.mu is None else float(config.mu),
        "rounds": config.rounds,
        "local-epochs": config.local_epochs,
        "batch-size": config.batch_size,
        "lr": config.lr,
        "dropout": config.dropout,
        "seed": config.seed,
        "fold": config.fold,
        "n-folds": config.n_folds,
        "sites": ",".join(config.sites),
        "site-effect": config.site_effect,
        # task-specific settings (image size, subjects...), as "key=value;key=value"
        "extra": ";".join(f"{k}={v}" for k, v in sorted(config.extra.items())),
    }


def experiment_from_run_config(cfg: Mapping[str, object]) -> ExperimentConfig:
    """Parse Flower's run config into a validated :class:`ExperimentConfig`."""
    mu = float(_get(cfg, "mu", -1.0))  # type: ignore[arg-type]
    sites = tuple(s for s in str(_get(cfg, "sites", "NYU,UM,USM,UCLA")).split(",") if s)
    return ExperimentConfig(
        strategy=str(_get(cfg, "strategy", "fedbn")),
        mu=None if mu < 0 else mu,
        rounds=int(_get(cfg, "rounds", 30)),  # type: ignore[arg-type]
        local_epochs=int(_get(cfg, "local-epochs", 1)),  # type: ignore[arg-type]
        batch_size=int(_get(cfg, "batch-size", 32)),  # type: ignore[arg-type]
        lr=float(_get(cfg, "lr", 1e-2)),  # type: ignore[arg-type]
        dropout=float(_get(cfg, "dropout", 0.0)),  # type: ignore[arg-type]
        seed=int(_get(cfg, "seed", 0)),  # type: ignore[arg-type]
        fold=int(_get(cfg, "fold", 0)),  # type: ignore[arg-type]
        n_folds=int(_get(cfg, "n-folds", 5)),  # type: ignore[arg-type]
        sites=sites,
        site_effect=float(_get(cfg, "site-effect", 1.0)),  # type: ignore[arg-type]
        extra=dict(item.split("=", 1) for item in str(_get(cfg, "extra", "")).split(";")
                   if "=" in item),
    )


@dataclass(frozen=True)
class ServerSettings:
    """Server-side settings of a federation (not hyper-parameters of training)."""

    federation_id: str
    min_sites: int
    wait_timeout: float
    round_timeout: float
    task: str
    input_shape: tuple[int, ...]
    workdir: Path
    tracking_uri: str
    experiment: str
    resume: bool
    allow_join: bool = False

    @classmethod
    def from_run_config(cls, cfg: Mapping[str, object], n_sites: int) -> ServerSettings:
        """Parse the server entries of Flower's run config."""
        min_sites = int(_get(cfg, "min-sites", 0))  # type: ignore[arg-type]
        workdir = str(_get(cfg, "workdir", ""))
        if not workdir:
            raise ValueError("The run config must name a 'workdir' for checkpoints and results.")
        return cls(
            federation_id=str(_get(cfg, "federation-id", "default")),
            min_sites=min_sites if min_sites > 0 else n_sites,
            wait_timeout=float(_get(cfg, "wait-timeout", 120.0)),  # type: ignore[arg-type]
            round_timeout=float(_get(cfg, "round-timeout", 600.0)),  # type: ignore[arg-type]
            task=str(_get(cfg, "task", "abide")),
            input_shape=tuple(int(d) for d in str(_get(cfg, "input-shape", "")).split(",")
                              if d.strip()),
            workdir=Path(workdir),
            tracking_uri=str(_get(cfg, "tracking-uri", "")),
            experiment=str(_get(cfg, "experiment", "")),
            resume=bool(_get(cfg, "resume", False)),
            allow_join=bool(_get(cfg, "allow-join", False)),
        )


@dataclass(frozen=True)
class NodeSettings:
    """A site node's own settings (its Flower node config)."""

    site: str
    data_dir: Path | None
    device: str
    state_dir: Path

    @classmethod
    def from_node_config(cls, cfg: Mapping[str, object]) -> NodeSettings:
        """Parse Flower's node config of a site."""
        site = str(_get(cfg, "site", ""))
        if not site:
            raise ValueError("The node config must name its 'site' (e.g. site='UCLA').")
        data_dir = str(_get(cfg, "data-dir", ""))
        state_dir = str(_get(cfg, "state-dir", ""))
        if not state_dir:
            raise ValueError(f"The node config of site '{site}' must name a 'state-dir'.")
        return cls(site=site, data_dir=Path(data_dir) if data_dir else None,
                   device=str(_get(cfg, "device", "auto")), state_dir=Path(state_dir))
