"""The ClientApp: one site's :class:`SiteTrainer` behind Flower messages.

The site is named by the node config (:class:`~fedbn_med.federation.config.NodeSettings`);
the run config carries the :class:`~fedbn_med.spec.RunSpec`. A site sends only the keys its strategy exchanges: under FedBN never a
normalisation-layer tensor. Whatever the site keeps (its BN layers; under SingleSet its
whole model) is saved after every round, atomically, in the node's ``state-dir``, so a
restarted site resumes with its own state and a runtime that starts a fresh process per
message still sees it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fedbn_med.checkpoint import load_tensors, save_tensors, state_hash
from fedbn_med.federation.config import NodeSettings, read_run_config
from fedbn_med.federation.records import pack, unpack
from fedbn_med.partition import select
from fedbn_med.rounds import plan_round
from fedbn_med.scaffold import join_controls, split_controls
from fedbn_med.tasks import get_task
from fedbn_med.trainer import SiteTrainer

__all__ = ["SiteRuntime", "app"]

logger = logging.getLogger(__name__)

app = ClientApp()


@dataclass
class SiteRuntime:
    """A site's trainer and where its kept state lives, built once per run."""

    trainer: SiteTrainer
    state_path: Path
    setups: int = 1

    @property
    def kept_keys(self) -> frozenset[str]:
        """Return the keys that never leave the site under this strategy."""
        return self.trainer.partition.all - self.trainer.exchanged

    def kept_hash(self) -> str:
        """Return the hash of the state this site keeps, as it is in memory now."""
        return state_hash(select(self.trainer.model.state_dict(), self.kept_keys))

    def save(self, rnd: int) -> str:
        """Persist the kept state after a round; return its hash.

        With it go the site's SCAFFOLD control variate and the DP it has spent, so that a
        restarted site neither forgets its variate nor counts its epsilon from zero.
        """
        kept = select(self.trainer.model.state_dict(), self.kept_keys)
        extra, meta = self.trainer.site_state()
        save_tensors(self.state_path, {**kept, **extra},
                     {"round": rnd, "site": self.trainer.site, **meta})
        return state_hash(kept)

    def restore(self) -> int:
        """Load the last saved kept state, if any; return its round (0 when none)."""
        if not self.state_path.exists():
            return 0
        tensors, meta = load_tensors(self.state_path)
        tensors, controls = split_controls(tensors)
        self.trainer._load(tensors, allowed=self.kept_keys)
        self.trainer.load_site_state(join_controls({}, controls), meta)
        rnd = int(meta.get("round", 0))  # type: ignore[call-overload]
        self.trainer.rounds_trained = rnd
        logger.info("Site %s resumed its private state of round %d from %s",
                    self.trainer.site, rnd, self.state_path)
        return rnd


_RUNTIMES: dict[tuple[int, str], SiteRuntime] = {}
_SETUPS = {"count": 0}


def runtime(context: Context) -> SiteRuntime:
    """Return this site's runtime for the run, building it on the run's first message."""
    node = NodeSettings.from_node_config(context.node_config)
    key = (context.run_id, node.site)
    if key not in _RUNTIMES:
        config, server = read_run_config(context.run_config)
        task = get_task(config.task)
        trainer = task.build_site(node.site, config, node.data_dir, node.device)
        # The site's own policy, on the keys its strategy would actually send.
        if trainer.exchanged & trainer.partition.private and not node.share_private:
            raise PermissionError(_refusal(node.site, config.strategy))
        state_path = node.state_path(server.federation_id)
        rt = SiteRuntime(trainer=trainer, state_path=state_path)
        rt.restore()
        _SETUPS["count"] += 1
        rt.setups = _SETUPS["count"]
        _RUNTIMES.clear()  # one run at a time per site process
        _RUNTIMES[key] = rt
    return _RUNTIMES[key]


def _refusal(site: str, strategy: str) -> str:
    reason = (f"Site {site} refuses strategy '{strategy}': it would send this site's private "
              "(normalisation) layers, and the site's policy keeps them home "
              "(share_private_layers = false in its site file; --share-private-layers "
              "on its command line allows it).")
    logger.error(reason)
    return reason


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Tell the server who this site is and what its data look like."""
    rt = runtime(context)
    info = {
        "site": rt.trainer.site,
        "input-shape": [int(d) for d in rt.trainer.input_shape],
        "num-train": rt.trainer.data.num_train,
        "resumed-round": rt.trainer.rounds_trained,
        "private-hash": rt.kept_hash(),
        "device": str(rt.trainer.device),
    }
    return Message(pack(info=info), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Evaluate the incoming global weights if asked, then train and send the update."""
    rt = runtime(context)
    payload = unpack(msg.content)
    cfg = payload.section("config")
    rnd = int(cfg.get("round", rt.trainer.rounds_trained + 1))  # type: ignore[arg-type]
    sections: dict[str, dict] = {}
    weights, control = split_controls(payload.tensors)  # control: SCAFFOLD's server variate
    if bool(cfg.get("evaluate-first", False)):
        # The previous round's global weights with this site's current private layers:
        # exactly what the site would have scored right after that round's aggregation.
        sections["eval"] = _numbers(rt.trainer.score(weights))
    epochs = cfg.get("local-epochs")
    plan = plan_round(rnd, local_epochs=None if epochs is None else int(epochs))  # type: ignore[arg-type]
    weights, n, fit = rt.trainer.fit(weights, plan.trainer_config(), control)
    digest = rt.save(rnd)
    sections["metrics"] = _numbers({"num-examples": n, **fit, "setups": rt.setups})
    sections["state"] = {"private-hash": digest, "round": rnd}
    return Message(pack(join_controls(weights, rt.trainer.control_delta), **sections),
                   reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Score the global weights on this site's validation and test splits."""
    rt = runtime(context)
    metrics = rt.trainer.score(split_controls(unpack(msg.content).tensors)[0])
    return Message(pack(metrics=_numbers(metrics)), reply_to=msg)


def _numbers(metrics: dict[str, float]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items()}
