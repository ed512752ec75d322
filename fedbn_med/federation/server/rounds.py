"""The federation server: every round over the connected sites, checkpointed after each.

The loop is ours rather than Flower's ``FedAvg.start`` because FedBN needs what that
loop does not give: the site behind each node, a bounded wait for sites, and a checkpoint
after every round. The round itself (its plan, the checks on every reply, the average)
is :mod:`fedbn_med.fl.rounds`, the same pure functions the in-process driver calls.

To keep a round's overhead small, one message per site per round does both jobs: it
carries the new global weights, the site first scores them (the previous round's
evaluation) and then trains. After the last round one evaluate message closes the run.

The server holds the model's state (global weights, control variates, the outlier rule's
memory) and two plain objects of its own: a :class:`~.registry.SiteRegistry` (which node
is which site) and a :class:`~.recorder.RunRecorder` (events, checkpoints, MLflow,
results). What a reply holds is read and checked by :mod:`.checks` alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from flwr.app import Message, MessageType, RecordDict

from fedbn_med.checkpoint import write_text_atomic
from fedbn_med.federation._flwr_replies import reply_bounds
from fedbn_med.federation.events import EvaluationRefused, ServerStarted, Trained, UpdateRefused
from fedbn_med.federation.server.checks import (
    error_reason,
    read_evaluate,
    read_train,
    refusal,
    score_names,
)
from fedbn_med.federation.server.recorder import Fits, RunRecorder
from fedbn_med.federation.server.registry import SiteRegistry
from fedbn_med.federation.server.secagg import SecAggRound
from fedbn_med.federation.wire import EvaluateInstruction, TrainInstruction
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

__all__ = ["HOSPITAL_MAX_SHARE", "FederationServer"]

logger = logging.getLogger("fedbn_med.server")

#: With a consortium's key list (hospital mode), the largest share of the average one
#: site may have under ``weighting="samples"``, whatever count it claims: a site cannot
#: outweigh all the others together (:func:`fedbn_med.fl.rounds.capped_weights`).
HOSPITAL_MAX_SHARE = 0.5


@dataclass
class _Collected:
    """A round's replies, read: the updates to average and what each site sent besides."""

    updates: list[Reply] = field(default_factory=list)
    fits: Fits = field(default_factory=dict)
    evals: Fits = field(default_factory=dict)
    hashes: dict[str, str] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)


class FederationServer:
    """Run one federation over the connected site nodes."""

    def __init__(self, grid: FastGrid, config: RunSpec, settings: ServerSettings) -> None:
        self.grid = grid
        self.config = config
        self.settings = settings
        self.strategy = config.strategy_obj()
        if self.strategy.reads_every_site:
            raise ValueError(
                f"Strategy '{self.strategy.name}' reads every site's data in one place; it "
                "is not federated and runs in-process (pipelines/abide_fedbn.py does that)."
            )
        # under SecAgg+, the sites' updates reach the server only summed (.secagg)
        self.secagg = settings.secagg and self.strategy.exchanges  # else nothing is summed
        if self.secagg and self.strategy.controls:
            raise ValueError(
                f"Strategy '{self.strategy.name}' cannot run under SecAgg: SecAgg sums the "
                "exchanged weights only, and this strategy sends control variates too.")
        self.task = get_task(config.task)
        self.scores = score_names(self.task.score_metrics)  # the only scores a site may send
        # Sites are strangers to each other in hospital mode: no claim outweighs the rest.
        self.max_share = HOSPITAL_MAX_SHARE if settings.node_sites else None
        self.min_sites = settings.needed(len(config.sites))
        self.input_shape = settings.input_shape or config.input_shape()
        self.recorder = RunRecorder(settings.workdir, settings.tracking_uri or None,
                                    self.task.selection)
        self.registry = SiteRegistry(grid, config.sites, settings, self.input_shape,
                                     self.min_sites, self.recorder.event)
        # The model's state; set by _build_model, which runs while the sites connect.
        self.partition: Partition
        self.exchanged: frozenset[str] = frozenset()
        self.global_weights: dict[str, torch.Tensor] = {}
        self.control: dict[str, torch.Tensor] = {}
        self.norm_reference = 0.0  # the outlier rule's memory (rounds.close_round)
        self.start_round = 1
        self.pending: Fits = {}  # the last round's training metrics, until its scores come

    # -- set-up --------------------------------------------------------------------------
    def _build_model(self) -> None:
        # The task's network (an imaging task's: MONAI, seconds of imports) is built while
        # the sites connect, since only the rounds need it.
        model = self.task.build_server_model(self.config, self.input_shape)
        self.partition = partition_model(model)
        self.exchanged = self.strategy.exchanged_keys(self.partition)
        state = model.state_dict()
        self.global_weights = {k: state[k].detach().clone() for k in self.exchanged}
        # SCAFFOLD's server variate (empty for other strategies); checkpointed with the weights
        self.control = zero_controls(self.global_weights, self.strategy.controlled_keys(
            self.partition, frozenset(n for n, _ in model.named_parameters())))
        # A site's reply is the exchanged weights (and, for SCAFFOLD, their controls) plus
        # a few numbers: twice the payload and 1 MiB more is generous. The public port
        # (fleet_gate) refuses any larger request body before the SuperLink stores it, and
        # the grid any reply larger in all, or of more objects, before reading it all.
        integers = sorted(k for k, t in self.global_weights.items()
                          if not t.dtype.is_floating_point)
        if self.secagg and integers:
            raise ValueError(f"SecAgg averages floating-point tensors only; strategy "
                             f"'{self.strategy.name}' exchanges {integers[:3]} (keep "
                             "normalisation layers local: FedBN).")
        # under SecAgg the masked vector holds 8-byte integers
        max_bytes, max_objects = reply_bounds(
            t.numel() * (8 if self.secagg else t.element_size())
            for t in self.global_weights.values())
        self.grid.max_reply_bytes, self.grid.max_reply_objects = max_bytes, max_objects
        write_text_atomic(self.settings.workdir / "server" / "max_body", str(max_bytes))

    def resume(self) -> str | None:
        """Load the last global checkpoint; return the MLflow parent run ID it names."""
        resumed = self.recorder.resume()
        path = self.recorder.checkpoint
        tensors, control = split_controls(resumed.tensors)
        if set(control) != set(self.control):
            raise ValueError(f"Checkpoint {path} does not fit this strategy's control "
                             "variates.")
        if set(tensors) != set(self.global_weights):
            raise ValueError(f"Checkpoint {path} does not fit this model/strategy.")
        self.global_weights, self.control = tensors, control
        self.start_round = resumed.round + 1
        self.pending = resumed.pending
        self.norm_reference = resumed.norm_reference
        logger.info("Resuming after round %d from %s", resumed.round, path)
        return resumed.parent_run_id

    # -- rounds --------------------------------------------------------------------------
    def _instruction(self, rnd: int, evaluate_first: bool) -> TrainInstruction:
        # selected round: the best round scored so far, whose private layers each site
        # keeps (the selected model is that round's shared weights with them)
        return TrainInstruction(round=rnd, local_epochs=self.config.local_epochs,
                                evaluate_first=evaluate_first,
                                selected_round=self.recorder.running.best)

    def _content(self, instruction: TrainInstruction | EvaluateInstruction) -> RecordDict:
        return instruction.content(join_controls(self.global_weights, self.control))

    def _messages(self, nodes: Iterable[int], mtype: str,
                  instruction: TrainInstruction | EvaluateInstruction) -> list[Message]:
        # Every site gets the same content: packed once, stored once by the SuperLink.
        content = self._content(instruction)
        return [Message(content, dst_node_id=n, message_type=mtype,
                        group_id=str(instruction.round)) for n in nodes]

    def run(self) -> None:
        """Run every round, then the final evaluation; write results and track them."""
        recorder = self.recorder
        try:
            # Build the model, import MLflow and open its store while the sites connect.
            recorder.event(ServerStarted())
            recorder.start()
            with ThreadPoolExecutor(1, thread_name_prefix="fedbn-model") as pool:
                built = pool.submit(self._build_model)
                self.registry.discover()
                built.result()  # the model's own error, if building it failed
            if not self.settings.resume:
                recorder.start_afresh()
            parent_id = self.resume() if self.settings.resume else None
            recorder.open_tracking(
                self.settings.experiment or self.task.experiment, self.strategy.label,
                {**self.config.params(), "min_sites": self.min_sites,
                 "federation_id": self.settings.federation_id, "engine": "flower"},
                self.registry.names(), parent_id,
                start_time=(self.settings.started_ms or None) if parent_id is None else None)
            for rnd in range(self.start_round, self.config.rounds + 1):
                self.pending = self._round(rnd, self.pending)
            self._close(self.pending)
        except BaseException as err:
            recorder.close(err)  # the MLflow runs end FAILED (KILLED when interrupted)
            raise
        recorder.close()

    def _round(self, rnd: int, pending: Fits) -> Fits:
        nodes = self.registry.refresh()  # a restarted site rejoins here
        if len(nodes) < self.min_sites:
            self.registry.discover()
            nodes = self.registry.live()
        started, exchanges = time.monotonic(), self.grid.exchanges
        plan = plan_round(rnd, local_epochs=self.config.local_epochs, fold_evaluation=True)
        scored = self.global_weights  # round rnd - 1's aggregate: what the sites score now
        if self.secagg:
            secure = SecAggRound(self, rnd, nodes, plan.evaluate_first)
            replies, answered = secure.summed.replies, secure.summed.answered
        else:
            replies = self.grid.send(
                self._messages(nodes, MessageType.TRAIN,
                               self._instruction(rnd, plan.evaluate_first)),
                timeout=self.settings.round_timeout)
            answered = {r.metadata.src_node_id for r in replies}
        self.registry.heard(nodes, answered)
        got = self._read_replies(rnd, nodes, replies)
        if self.secagg:
            outcome = secure.outcome(got.fits)
        else:
            outcome = close_round(self.strategy, self.global_weights, got.updates,
                                  self.partition.all - self.exchanged, control=self.control,
                                  n_sites=max(len(self.config.sites), len(nodes)),
                                  weighting=self.config.weighting, max_share=self.max_share,
                                  norm_reference=self.norm_reference,
                                  registered=self.settings.registered_counts)
        for site, reason in outcome.refused.items():
            self._refuse(rnd, site, reason, got)
        self.global_weights = outcome.global_weights
        self.control = outcome.control
        self.norm_reference = outcome.norm_reference
        missing = sorted(set(nodes.values()) - set(got.fits))
        if len(got.fits) < self.min_sites:
            why = "; ".join(f"{site} refused: {got.refused[site]}" if site in got.refused
                            else f"{site} did not answer within {self.settings.round_timeout:g} s"
                            for site in missing)
            raise RuntimeError(
                f"Round {rnd}: only {len(got.fits)} sites' updates were accepted (at least "
                f"{self.min_sites} needed). {why}.")
        if missing:
            logger.warning("Round %d completes without sites %s", rnd, missing)
        # Round rnd - 1 is complete (its scores came now), then round rnd is checkpointed:
        # a crash from here on loses neither.
        if plan.evaluate_first:
            self.recorder.complete(rnd - 1, pending, got.evals)
            self.recorder.keep_if_best(rnd - 1, scored)
        self.recorder.save(rnd, join_controls(self.global_weights, self.control), got.fits,
                           self.strategy.label, self.norm_reference)
        self.recorder.event(Trained(
            round=rnd, seconds=time.monotonic() - started, empty_polls=self.grid.empty_polls,
            sites=sorted(got.fits), missing=missing, private_hashes=got.hashes,
            shares=outcome.shares, norms=outcome.norms,
            exchanges=self.grid.exchanges - exchanges))
        return got.fits

    def _read_replies(self, rnd: int, nodes: Mapping[int, str], replies: Iterable[Message]
                      ) -> _Collected:
        got = _Collected()
        for reply in replies:
            site = nodes.get(reply.metadata.src_node_id)
            if site is None:
                continue
            if site in got.fits or site in got.refused:
                logger.warning("Round %d: a second reply of site %s ignored", rnd, site)
                continue
            if reply.has_error():
                reason = error_reason(reply)
                logger.error("Round %d: site %s failed: %s", rnd, site, reason)
                self._refuse(rnd, site, f"it failed: {reason}", got)
                continue
            try:
                read = read_train(reply.content, site, self.scores)
            except Exception as err:  # whatever is wrong with one reply refuses it alone
                self._refuse(rnd, site, refusal(err), got)
                continue
            if read.evals is not None:
                got.evals[site] = read.evals
            if read.private_hash is not None:
                got.hashes[site] = read.private_hash
            got.updates.append(read.update)
            got.fits[site] = read.fits
        return got

    def _refuse(self, rnd: int, site: str, reason: str, got: _Collected) -> None:
        logger.warning("Round %d: update of site %s refused: %s", rnd, site, reason)
        self.recorder.event(UpdateRefused(round=rnd, site=site, reason=reason))
        got.refused[site] = reason
        got.fits.pop(site, None)
        got.hashes.pop(site, None)

    def _close(self, pending: Fits) -> None:
        nodes = self.registry.live()
        replies = self.grid.send(
            self._messages(nodes, MessageType.EVALUATE, EvaluateInstruction(
                self.config.rounds, selected_round=self.recorder.running.best)),
            timeout=self.settings.round_timeout)
        evals: Fits = {}
        for reply in replies:
            site = nodes.get(reply.metadata.src_node_id)
            if site is None or reply.has_error() or site in evals:
                continue
            try:
                evals[site] = read_evaluate(reply.content, self.scores)
            except Exception as err:  # one bad reply loses that site's scores only
                why = refusal(err)
                logger.warning("Final evaluation of site %s refused: %s", site, why)
                self.recorder.event(EvaluationRefused(site=site, reason=why))
        if pending:
            self.recorder.complete(self.config.rounds, pending, evals)
            self.recorder.keep_if_best(self.config.rounds, self.global_weights)
        self.recorder.finish(self.strategy.label, self.config.rounds, self.config.sites,
                             self.global_weights,
                             self.strategy.kept_keys(self.partition))
