"""What the ServerApp and the ClientApp of the stock-Flower baseline share: the run spec."""

from __future__ import annotations

from flwr.app import UserConfig

from fedbn_med.spec import RunSpec

__all__ = ["run_spec", "site_names"]


def site_names(run_config: UserConfig) -> tuple[str, ...]:
    """Return the sites named by the run config's ``sites`` (comma-separated)."""
    names = tuple(s.strip() for s in str(run_config["sites"]).split(",") if s.strip())
    if not names:
        raise ValueError(f"run config 'sites' names no site, got {run_config['sites']!r}.")
    return names


def run_spec(run_config: UserConfig) -> RunSpec:
    """Return the ABIDE run spec the run config describes (validated by RunSpec)."""
    return RunSpec.for_task(
        "abide",
        strategy=str(run_config["strategy"]),
        rounds=int(run_config["num-server-rounds"]),
        local_epochs=int(run_config["local-epochs"]),
        batch_size=int(run_config["batch-size"]),
        lr=float(run_config["lr"]),
        seed=int(run_config["seed"]),
        fold=int(run_config["fold"]),
        sites=site_names(run_config),
    )
