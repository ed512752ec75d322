"""The federation server: every round over the connected sites, checkpointed after each.

The loop is ours rather than Flower's ``FedAvg.start`` because FedBN needs what that
loop does not give: the site behind each node, a bounded wait for sites, and a checkpoint
after every round. The round itself (its plan, the checks on every reply, the average)
is :mod:`fedbn_med.fl.rounds`, the same pure functions the in-process driver calls.

To keep a round's overhead small, one message per site per round does both jobs: it
carries the new global weights, the site first scores them (the previous round's
evaluation) and then trains. After the last round one evaluate message closes the run.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from flwr.app import Message, MessageType

from fedbn_med.checkpoint import load_tensors, write_text_atomic
from fedbn_med.federation.records import pack, unpack
from fedbn_med.federation.server.background import SerialWorker
from fedbn_med.federation.server.checks import score_names, train_reason
from fedbn_med.federation.server.discovery import SiteDiscovery
from fedbn_med.federation.server.results import RunResults, warm_up_tracking
from fedbn_med.fl.partition import partition_model
from fedbn_med.fl.rounds import Reply, close_round, plan_round
from fedbn_med.fl.scaffold import join_controls, split_controls, zero_controls
from fedbn_med.tasks import get_task

if TYPE_CHECKING:
    import torch

    from fedbn_med.federation.config import ServerSettings
    from fedbn_med.federation.server.grid import FastGrid
    from fedbn_med.fl.partition import Partition
    from fedbn_med.spec import RunSpec
    from fedbn_med.tracking import FederationTracker

__all__ = ["HOSPITAL_MAX_SHARE", "FederationServer", "resume_point"]

logger = logging.getLogger("fedbn_med.server")

#: With a consortium's key list (hospital mode), the largest share of the average one
#: site may have under ``weighting="samples"``, whatever count it claims: a site cannot
#: outweigh all the others together (:func:`fedbn_med.fl.rounds.capped_weights`).
HOSPITAL_MAX_SHARE = 0.5


class FederationServer(SiteDiscovery, RunResults):
    """Run one federation over the connected site nodes."""

    def __init__(self, grid: FastGrid, config: RunSpec, settings: ServerSettings) -> None:
        self.grid = grid
        self.config = config
        self.settings = settings
        self.strategy = config.strategy_obj()
        if self.strategy.pooled:
            raise ValueError(
                f"Strategy '{self.strategy.name}' pools every site's data in one place; it is "
                "not federated and runs in-process (pipelines/abide_fedbn.py does that)."
            )
        self.task = get_task(config.task)
        self.scores = score_names(self.task.score_metrics)  # the only scores a site may send
        # Sites are strangers to each other in hospital mode: no claim outweighs the rest.
        self.max_share = HOSPITAL_MAX_SHARE if settings.node_sites else None
        self.norm_reference = 0.0  # the outlier rule's memory (rounds.close_round)
        self.input_shape = settings.input_shape or config.input_shape()
        self.min_sites = settings.needed(len(config.sites))
        # Set by _build_model, which runs while the sites connect (see run).
        self.partition: Partition
        self.exchanged: frozenset[str] = frozenset()
        self.global_weights: dict[str, torch.Tensor] = {}
        self.control: dict[str, torch.Tensor] = {}
        self.sites: dict[int, str] = {}
        self.asked: set[int] = set()
        self.query_attempts: dict[int, int] = {}
        self.waiting: dict[int, str] = {}
        self.silent: set[int] = set()
        self.pending: dict[str, dict[str, float]] = {}
        self.rows: list[dict[str, object]] = []
        self.workdir = settings.workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.checkpoint = self.workdir / "server" / "global.safetensors"
        self.start_round = 1
        self.tracker: FederationTracker | None = None
        self.worker: SerialWorker | None = None
        self._unlogged: list[tuple[int, dict[str, dict[str, float]]]] = []
        self._handed_over = time.monotonic()

    # -- set-up --------------------------------------------------------------------------
    def _build_model(self) -> None:
        # The task's network (for ABIDE, MONAI blocks: seconds of imports) is built while
        # the sites connect, since only the rounds need it.
        model = self.task.build_server_model(self.config, self.input_shape)
        self.partition = partition_model(model)
        self.exchanged = self.strategy.exchanged_keys(self.partition)
        state = model.state_dict()
        self.global_weights = {k: state[k].detach().clone() for k in self.exchanged}
        # SCAFFOLD's server variate (empty for other strategies); checkpointed with the weights
        self.control = zero_controls(self.global_weights, self.strategy.controlled_keys(
            self.partition, frozenset(n for n, _ in model.named_parameters())))
        self._write_reply_bound()

    def _write_reply_bound(self) -> None:
        # A site's reply is the exchanged weights plus a few numbers: twice the payload
        # and 1 MiB more is generous. The public port (fleet_gate) refuses any larger
        # request body before the SuperLink stores it.
        payload = sum(t.numel() * t.element_size() for t in self.global_weights.values())
        write_text_atomic(self.settings.workdir / "server" / "max_body",
                          str(2 * payload + (1 << 20)))

    def _event(self, **event: object) -> None:
        with open(self.workdir / "progress.jsonl", "a", encoding="utf-8") as handle:
            handle.write(json.dumps({**event, "t": time.time()}, default=float) + "\n")

    def resume(self) -> str | None:
        """Load the last global checkpoint; return the MLflow parent run ID it names."""
        if not self.checkpoint.exists():
            raise FileNotFoundError(
                f"--resume was given but there is no checkpoint at {self.checkpoint}.")
        tensors, meta = load_tensors(self.checkpoint)
        tensors, control = split_controls(tensors)
        if set(control) != set(self.control):
            raise ValueError(f"Checkpoint {self.checkpoint} does not fit this strategy's "
                             "control variates.")
        self.control = control
        if set(tensors) != set(self.global_weights):
            raise ValueError(f"Checkpoint {self.checkpoint} does not fit this model/strategy.")
        self.global_weights = tensors
        done, reference = resume_point(meta, self.checkpoint)
        self.start_round = done + 1
        self.rows = list(meta.get("rows", []))  # type: ignore[call-overload]
        self.pending = dict(meta.get("pending", {}))  # type: ignore[call-overload]
        self.norm_reference = reference
        logger.info("Resuming after round %d from %s", self.start_round - 1, self.checkpoint)
        return str(meta.get("parent_run_id") or "") or None

    # -- rounds --------------------------------------------------------------------------
    def _messages(self, nodes: Iterable[int], mtype: str, rnd: int, evaluate_first: bool
                  ) -> list[Message]:
        # Every site gets the same content: packed once, stored once by the SuperLink.
        content = pack(join_controls(self.global_weights, self.control), config={
            "round": rnd, "local-epochs": self.config.local_epochs,
            "evaluate-first": evaluate_first})
        return [Message(content, dst_node_id=n, message_type=mtype, group_id=str(rnd))
                for n in nodes]

    def run(self) -> None:
        """Run every round, then the final evaluation; write results and track them."""
        self.worker = SerialWorker()
        try:
            # Build the model, import MLflow and open its store while the sites connect.
            self._event(event="server-started")
            with ThreadPoolExecutor(1, thread_name_prefix="fedbn-model") as pool:
                built = pool.submit(self._build_model)
                self.worker.submit(warm_up_tracking, self.settings.tracking_uri or None)
                self.worker.submit(functools.partial(self._event, event="tracking-warm"))
                self.discover()
                built.result()  # the model's own error, if building it failed
            parent_id = self.resume() if self.settings.resume else None
            self.worker.flush()
            from fedbn_med.tracking import FederationTracker

            self.tracker = FederationTracker(
                self.settings.experiment or self.task.experiment, self.strategy.label,
                {**self.config.params(), "min_sites": self.min_sites,
                 "federation_id": self.settings.federation_id, "engine": "flower"},
                sorted(set(self.sites.values())),
                tracking_uri=self.settings.tracking_uri or None, parent_run_id=parent_id,
            )
            if parent_id is not None:
                # Rounds the checkpoint holds but the store missed (logging runs behind the
                # rounds), then a round that may have been logged in part before the crash.
                caught_up = self.tracker.log_missing_rounds(self.rows)
                if caught_up:
                    logger.info("Logged rounds %s to MLflow from the checkpoint", caught_up)
                self.tracker.dedupe_next = True
            self._event(event="tracking-ready")
            for rnd in range(self.start_round, self.config.rounds + 1):
                self.pending = self._round(rnd, self.pending)
            self._close(self.pending)
        finally:
            self.worker.close()

    def _round(self, rnd: int, pending: dict[str, dict[str, float]]
               ) -> dict[str, dict[str, float]]:
        connected = self._query_new_nodes()  # a restarted site rejoins here
        nodes = self._live_nodes(connected)
        if len(nodes) < self.min_sites:
            self.discover()
            nodes = self._live_nodes()
        started = time.monotonic()
        plan = plan_round(rnd, local_epochs=self.config.local_epochs, fold_evaluation=True)
        evaluate_first = plan.evaluate_first
        replies = self.grid.send(
            self._messages(nodes, MessageType.TRAIN, rnd, evaluate_first),
            timeout=self.settings.round_timeout,
        )
        answered = {r.metadata.src_node_id for r in replies}
        self.silent = (self.silent | set(nodes)) - answered
        updates: list[Reply] = []
        fits: dict[str, dict[str, float]] = {}
        evals: dict[str, dict[str, float]] = {}
        hashes: dict[str, str] = {}
        refused: dict[str, str] = {}
        for reply in replies:
            site = nodes.get(reply.metadata.src_node_id)
            if site is None:
                continue
            if reply.has_error():
                logger.error("Round %d: site %s failed: %s", rnd, site, reply.error.reason)
                refused[site] = f"it failed: {reply.error.reason}"
                continue
            try:
                payload = unpack(reply.content)
                reason = train_reason(payload.sections, self.scores)
                if reason is not None:
                    raise ValueError(reason)
                metrics = payload.floats("metrics")
                num_examples = metrics["num-examples"]  # checked by close_round
                fits_row = {"num_examples": metrics["num-examples"],
                            "train_loss": metrics["train_loss"],
                            "setups": metrics.get("setups", 0.0),
                            # the (epsilon, delta) a DP site has spent, for its MLflow run
                            **{k: v for k, v in metrics.items() if k.startswith("dp_")}}
                weights, controls = split_controls(payload.tensors)
            except Exception as err:  # whatever is wrong with one reply refuses it alone
                why = str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"
                why = why[:500]
                logger.warning("Round %d: update of site %s refused: %s", rnd, site, why)
                self._event(event="update-refused", round=rnd, site=site, reason=why)
                refused[site] = why
                continue
            if "eval" in payload.sections:
                evals[site] = payload.floats("eval")
            if "state" in payload.sections:
                hashes[site] = str(payload.section("state").get("private-hash", ""))
            updates.append(Reply(site, weights, num_examples, controls=controls))
            fits[site] = fits_row
        outcome = close_round(self.strategy, self.global_weights, updates,
                              self.partition.all - self.exchanged, control=self.control,
                              n_sites=max(len(self.config.sites), len(nodes)),
                              weighting=self.config.weighting, max_share=self.max_share,
                              norm_reference=self.norm_reference)
        refused.update(outcome.refused)
        for site, reason in outcome.refused.items():
            logger.warning("Round %d: update of site %s refused: %s", rnd, site, reason)
            self._event(event="update-refused", round=rnd, site=site, reason=reason)
            fits.pop(site, None)
            hashes.pop(site, None)
        self.global_weights = outcome.global_weights
        self.control = outcome.control
        self.norm_reference = outcome.norm_reference
        missing = sorted(set(nodes.values()) - set(fits))
        if len(fits) < self.min_sites:
            why = "; ".join(f"{site} refused: {refused[site]}" if site in refused
                            else f"{site} did not answer within {self.settings.round_timeout:g} s"
                            for site in missing)
            raise RuntimeError(
                f"Round {rnd}: only {len(fits)} sites' updates were accepted (at least "
                f"{self.min_sites} needed). {why}.")
        if missing:
            logger.warning("Round %d completes without sites %s", rnd, missing)
        if evaluate_first:
            self._complete(rnd - 1, pending, evals)
        self._save_checkpoint(rnd, fits)
        self._event(event="trained", round=rnd, seconds=time.monotonic() - started,
                    empty_polls=self.grid.empty_polls,
                    sites=sorted(fits), missing=missing, private_hashes=hashes,
                    shares=outcome.shares, norms=outcome.norms)
        return fits


def resume_point(meta: Mapping[str, object], path: Path) -> tuple[int, float]:
    """Return the rounds a checkpoint has completed and its outlier-rule reference.

    Raises
    ------
    ValueError
        If the checkpoint's metadata holds anything else, naming the file and the value.
    """
    done = meta.get("round")
    if isinstance(done, bool) or not isinstance(done, int) or done < 0:
        raise ValueError(f"Checkpoint {path}: 'round' must be the number of rounds "
                         f"completed, a whole number from 0, got {done!r}.")
    reference = meta.get("norm_reference", 0.0)
    if isinstance(reference, bool) or not isinstance(reference, (int, float)) \
            or not math.isfinite(reference) or reference < 0:
        raise ValueError(f"Checkpoint {path}: 'norm_reference' must be a finite number "
                         f"from 0, got {reference!r}.")
    return done, float(reference)
