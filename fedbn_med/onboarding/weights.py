"""Where a new site's federation weights come from, and whether they fit it.

Four sources: a server checkpoint (:class:`CheckpointSource`), a federation's run folder
(:class:`RunFolderSource`), the shared weights a federation logged on its MLflow parent
run (:class:`MlflowRunSource`), or a quick federation trained in this process
(:func:`train_federation`). Each gives
:class:`FederationWeights`: the weights with their origin, round and strategy.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from fedbn_med.checkpoint import load_tensors
from fedbn_med.onboarding.bn_adapt import average_bn_affine
from fedbn_med.tasks import get_task
from fedbn_med.training.inprocess import build_federation
from fedbn_med.training.trainer import ShapeMismatchError, SiteData

if TYPE_CHECKING:
    from fedbn_med.spec import RunSpec

__all__ = [
    "ONBOARDING_EXPERIMENT",
    "SHARED_WEIGHTS_ARTIFACT",
    "CheckpointSource",
    "FederationWeights",
    "MlflowRunSource",
    "RUN_FOLDER_FILES",
    "RunFolderSource",
    "TrainedFederation",
    "WeightsSource",
    "abide_input_shape",
    "check_site_fits",
    "train_federation",
]

ONBOARDING_EXPERIMENT = "abide-onboarding"
SHARED_WEIGHTS_ARTIFACT = "model/shared_weights.safetensors"


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


#: Where a federation's run folder (its ``--workdir``) holds its global weights, in the
#: order looked for: an in-process run's selected round (:func:`fedbn_med.run`, the
#: pipelines), then a Flower run's selected and last rounds.
RUN_FOLDER_FILES = ("shared.selected.safetensors", "server/selected.safetensors",
                    "server/global.safetensors", "run-*/server/selected.safetensors",
                    "run-*/server/global.safetensors")


@dataclass(frozen=True)
class RunFolderSource:
    """Weights from a federation's run folder: its selected round's global weights."""

    folder: Path

    def checkpoint(self) -> Path:
        """Return the folder's weights file (the first of :data:`RUN_FOLDER_FILES` found).

        Raises
        ------
        ValueError
            When the folder is missing or holds none of them, naming what was expected.
        """
        folder = Path(self.folder)
        if not folder.is_dir():
            raise ValueError(f"Run folder {folder} does not exist; expected a federation's "
                             "--workdir (e.g. pipelines/histo_fedbn.py --workdir DIR).")
        for pattern in RUN_FOLDER_FILES:
            found = sorted(folder.glob(pattern))
            if found:
                return found[0]
        raise ValueError(
            f"Run folder {folder} holds no global weights: expected one of "
            f"{', '.join(RUN_FOLDER_FILES)} (a FedBN or FedAvg run; SingleSet and "
            "Centralized share none).")

    def load(self) -> FederationWeights:
        """Read the folder's weights and their metadata (round, strategy)."""
        return CheckpointSource(self.checkpoint()).load()


WeightsSource = CheckpointSource | MlflowRunSource | RunFolderSource


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
    fedbn_med.training.trainer.ShapeMismatchError
        A ``ValueError`` naming both shapes.
    """
    if tuple(data_shape) != tuple(model_shape):
        raise ShapeMismatchError(
            f"Site '{site}' has data of shape (N, {', '.join(map(str, data_shape))}) but the "
            f"federation's model takes (N, {', '.join(map(str, model_shape))}). Compute the "
            "site's features with the federation's atlas and connectivity pipeline."
        )


def abide_input_shape(weights: Mapping[str, torch.Tensor]) -> tuple[int, ...]:
    """Return the input shape of the ABIDE network these weights belong to.

    That is the width of its first linear layer: ``net.0.weight`` of the MLP, ``net.1.weight``
    of the linear model (its ``net.0`` is the input BN layer).
    """
    layers = sorted((int(k.split(".")[1]), v) for k, v in weights.items()
                    if k.startswith("net.") and k.endswith(".weight")
                    and k.split(".")[1].isdigit() and v.ndim == 2)
    if not layers:
        raise ValueError(
            "Expected weights of an ABIDE network (fedbn_med.tasks.abide.model: a first linear "
            "layer 'net.N.weight' of shape (outputs, features)); got keys "
            f"{sorted(weights)[:6]}.")
    return (int(layers[0][1].shape[1]),)


# -- a quick federation in this process --------------------------------------------------
@dataclass(frozen=True)
class TrainedFederation:
    """An in-process federation's final weights and its sites' averaged BN scale and shift."""

    weights: FederationWeights
    bn_affine: Mapping[str, torch.Tensor]
    input_shape: tuple[int, ...]


def train_federation(config: RunSpec,
                     datas: Mapping[str, SiteData] | None = None) -> TrainedFederation:
    """Train a federation of ``config.sites`` in this process.

    Parameters
    ----------
    config : RunSpec
        Strategy, rounds, seed and the training sites.
    datas : mapping, optional
        Already loaded site data, to avoid reading it again (a task with ``site_data``
        only; the sites not in it load theirs).
    """
    strategy = config.strategy_obj()
    if strategy.pooled or not strategy.exchanges:
        raise ValueError(f"Strategy '{strategy.label}' has no global model to onboard from; "
                         "use a federated strategy such as 'fedbn' or 'fedavg'.")
    task = get_task(config.task)
    loaded = None
    if task.site_data is not None:  # the sites' data not given are the task's own
        given = datas or {}
        loaded = {n: given.get(n) or task.site_data(n, config) for n in config.sites}
    federation = build_federation(config, loaded if loaded is not None else datas)
    shapes = {n: t.input_shape for n, t in federation.trainers.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"The training sites' data differ in shape: {shapes}.")
    # The driver's rounds without their per-round evaluation, which (scikit-learn
    # scoring) is about 80 % of a small run's time and unused here.
    history = federation.run(evaluate=False)
    affine = (average_bn_affine(federation.trainers.values()) if strategy.keeps_private
              else {})
    weights = FederationWeights(
        weights=history.global_weights,
        source=f"in-process {strategy.label} federation of {', '.join(config.sites)} "
               f"({config.rounds} rounds, seed {config.seed})",
        round=config.rounds, strategy=strategy.label,
    )
    return TrainedFederation(weights, affine, next(iter(shapes.values())))
