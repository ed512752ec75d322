"""The ServerApp: discovers the sites, runs the rounds, aggregates, checkpoints, tracks.

The loop is ours rather than Flower's ``FedAvg.start`` because FedBN needs what that
loop does not give: the site behind each node, a bounded wait for sites, and a checkpoint
after every round. The round itself (its plan, the checks on every reply, the average)
is :mod:`fedbn_med.rounds`, the same pure functions the in-process driver calls.

To keep a round's overhead small, one message per site per round does both jobs: it
carries the new global weights, the site first scores them (the previous round's
evaluation) and then trains. After the last round one evaluate message closes the run.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from flwr.app import Context, Message, MessageType
from flwr.serverapp import Grid, ServerApp

from fedbn_med.background import SerialWorker
from fedbn_med.checkpoint import load_tensors, save_tensors, write_text_atomic
from fedbn_med.federation._flwr_compat import pull_replies
from fedbn_med.federation.config import ServerSettings, read_run_config
from fedbn_med.federation.events import RunFailed, append_event, shorten
from fedbn_med.federation.pacing import Pacer
from fedbn_med.federation.records import pack, unpack
from fedbn_med.partition import partition_model
from fedbn_med.report import convergence_plot, result_columns, site_table
from fedbn_med.rounds import Reply, close_round, plan_round
from fedbn_med.tasks import get_task

if TYPE_CHECKING:
    from fedbn_med.spec import RunSpec
    from fedbn_med.tracking import FederationTracker

__all__ = ["FastGrid", "FederationServer", "app"]

logger = logging.getLogger("fedbn_med.server")

app = ServerApp()


class FastGrid:
    """Send messages and collect their replies, asking for them at the right times.

    Flower's own ``send_and_receive`` looks for replies every 3 s, which would dominate a
    round whose compute takes a fraction of a second. Here a :class:`Pacer` per message
    type learns when replies came in earlier rounds: the first ask comes shortly before
    the first reply is due, then asks come every ``poll`` seconds while replies are
    expected, backing off to ``max_poll`` when they are late. Replies are downloaded
    with a short back-off (:func:`fedbn_med.federation._flwr_compat.pull_replies`), not
    flwr's 1 s first wait when a reply shows before its contents.
    """

    def __init__(self, grid: Grid, poll: float = 0.02, max_poll: float = 0.2) -> None:
        self.grid = grid
        self.poll = poll
        self.max_poll = max_poll
        self.pacers: dict[str, Pacer] = {}
        self.empty_polls = 0

    def node_ids(self) -> list[int]:
        """Return the IDs of the nodes connected now."""
        return list(self.grid.get_node_ids())

    def send(self, messages: Iterable[Message], timeout: float) -> list[Message]:
        """Push messages and return the replies that arrive within ``timeout`` seconds."""
        messages = list(messages)
        kind = messages[0].metadata.message_type if messages else ""
        pacer = self.pacers.setdefault(kind, Pacer(poll=self.poll, max_poll=self.max_poll,
                                                   share=0.8))
        deadline = time.monotonic() + timeout
        pending = {i for i in self.grid.push_messages(messages) if i}
        pacer.start()
        replies: list[Message] = []
        while pending and time.monotonic() < deadline:
            asked_at = time.monotonic()
            got = pull_replies(self.grid, pending)
            replies.extend(got)
            pending -= {m.metadata.reply_to_message_id for m in got}
            if got and len(replies) == len(got):
                pacer.arrived(asked_at)  # learn when the first reply comes
                pacer.expect_more()
            if pending:
                pacer.sleep()
        self.empty_polls = sum(p.empty_total for p in self.pacers.values())
        return replies


class FederationServer:
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
        self.input_shape = settings.input_shape or config.input_shape()
        self.min_sites = settings.needed(len(config.sites))
        model = self.task.build_server_model(config, self.input_shape)
        self.partition = partition_model(model)
        self.exchanged = self.strategy.exchanged_keys(self.partition)
        state = model.state_dict()
        self.global_weights = {k: state[k].detach().clone() for k in self.exchanged}
        self.sites: dict[int, str] = {}
        self.asked: set[int] = set()
        self.query_attempts: dict[int, int] = {}
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
    def _event(self, **event: object) -> None:
        with open(self.workdir / "progress.jsonl", "a", encoding="utf-8") as handle:
            handle.write(json.dumps({**event, "t": time.time()}, default=float) + "\n")

    def discover(self) -> None:
        """Wait (bounded) for the expected sites; ask each node which site it is."""
        expected = set(self.config.sites)
        deadline = time.monotonic() + self.settings.wait_timeout
        while True:
            self._query_new_nodes()
            found = set(self.sites.values())
            if expected <= found:
                break
            if time.monotonic() > deadline:
                missing = sorted(expected - found)
                if len(found & expected) >= self.min_sites:
                    logger.warning("Starting without sites %s after %.0f s", missing,
                                   self.settings.wait_timeout)
                    break
                raise TimeoutError(
                    f"Only {len(found & expected)} of {len(expected)} sites connected within "
                    f"{self.settings.wait_timeout:.0f} s (at least {self.min_sites} "
                    f"needed). Missing sites: {', '.join(missing)}."
                )
            time.sleep(0.2)
        self._event(event="ready", sites=sorted(set(self.sites.values())))

    def _query_new_nodes(self) -> list[int]:
        """Ask nodes not seen before which site they are; return the connected nodes."""
        connected = self.grid.node_ids()
        new = [n for n in connected if n not in self.asked]
        if new:
            self.asked.update(new)
            answered = self._query(new)
            # A node that did not answer (still loading its data, or dead) is asked again
            # later, a few times at most.
            for node in set(new) - answered:
                self.query_attempts[node] = self.query_attempts.get(node, 0) + 1
                if self.query_attempts[node] < 3:
                    self.asked.discard(node)
        return connected

    def _query(self, node_ids: list[int]) -> set[int]:
        messages = [Message(pack(), dst_node_id=n, message_type=MessageType.QUERY)
                    for n in node_ids]
        answered: set[int] = set()
        timeout = min(self.settings.wait_timeout, 30.0)
        for reply in self.grid.send(messages, timeout=timeout):
            node = reply.metadata.src_node_id
            answered.add(node)
            if reply.has_error():
                logger.error("Node %s failed to start its site: %s", node, reply.error.reason)
                self._event(event="site-error", node=node, reason=reply.error.reason)
                continue
            try:
                info = unpack(reply.content).section("info")
                site = str(info["site"])
            except (ValueError, KeyError) as err:
                logger.error("Node %s answered the query with a malformed message: %s", node,
                             err)
                continue
            shape = tuple(int(d) for d in info["input-shape"])  # type: ignore[union-attr]
            if site not in self.config.sites and not self.settings.allow_join:
                logger.error("Node %s is site '%s', which is not in this federation (%s); "
                             "ignored (allow-join is off).", node, site,
                             ", ".join(self.config.sites))
                continue
            if shape != tuple(self.input_shape):
                reason = (f"Site '{site}' has data of shape (N, {', '.join(map(str, shape))}) "
                          "but the federation's model takes "
                          f"(N, {', '.join(map(str, self.input_shape))}); the site is refused.")
                logger.error(reason)
                self._event(event="site-refused", site=site, reason=reason)
                continue
            rejoin = site in self.sites.values()
            if site not in self.config.sites and not rejoin:
                # A new site joins a running federation: it receives the current shared
                # weights with its first round and trains its own BN layers from there.
                logger.info("Site %s joins the federation", site)
            self.sites = {n: s for n, s in self.sites.items() if s != site}
            self.sites[node] = site
            logger.info("Site %s is node %s (resumed round %s)", site, node,
                        info["resumed-round"])
            self._event(event="rejoined" if rejoin else "joined", site=site, node=node,
                        resumed_round=int(info["resumed-round"]),
                        private_hash=str(info.get("private-hash", "")))
        return answered

    def resume(self) -> str | None:
        """Load the last global checkpoint; return the MLflow parent run ID it names."""
        if not self.checkpoint.exists():
            raise FileNotFoundError(
                f"--resume was given but there is no checkpoint at {self.checkpoint}.")
        tensors, meta = load_tensors(self.checkpoint)
        if set(tensors) != set(self.global_weights):
            raise ValueError(f"Checkpoint {self.checkpoint} does not fit this model/strategy.")
        self.global_weights = tensors
        self.start_round = int(meta["round"]) + 1  # type: ignore[call-overload]
        self.rows = list(meta.get("rows", []))  # type: ignore[arg-type]
        self.pending = dict(meta.get("pending", {}))  # type: ignore[arg-type]
        logger.info("Resuming after round %d from %s", self.start_round - 1, self.checkpoint)
        return str(meta.get("parent_run_id") or "") or None

    # -- rounds --------------------------------------------------------------------------
    def _messages(self, nodes: Iterable[int], mtype: str, rnd: int, evaluate_first: bool
                  ) -> list[Message]:
        # Every site gets the same content: packed once, stored once by the SuperLink.
        content = pack(self.global_weights, config={
            "round": rnd, "local-epochs": self.config.local_epochs,
            "evaluate-first": evaluate_first})
        return [Message(content, dst_node_id=n, message_type=mtype, group_id=str(rnd))
                for n in nodes]

    def _live_nodes(self, connected: Iterable[int] | None = None) -> dict[int, str]:
        connected = set(self.grid.node_ids() if connected is None else connected)
        return {n: s for n, s in self.sites.items() if n in connected}

    def run(self) -> None:
        """Run every round, then the final evaluation; write results and track them."""
        parent_id = self.resume() if self.settings.resume else None
        self.worker = SerialWorker()
        try:
            # Import MLflow and open its store while the sites connect.
            self._event(event="server-started")
            self.worker.submit(_warm_up_tracking, self.settings.tracking_uri or None)
            self.worker.submit(functools.partial(self._event, event="tracking-warm"))
            self.discover()
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
        updates: list[Reply] = []
        fits: dict[str, dict[str, float]] = {}
        evals: dict[str, dict[str, float]] = {}
        hashes: dict[str, str] = {}
        for reply in replies:
            site = nodes.get(reply.metadata.src_node_id)
            if site is None:
                continue
            if reply.has_error():
                logger.error("Round %d: site %s failed: %s", rnd, site, reply.error.reason)
                continue
            try:
                payload = unpack(reply.content)
                metrics = payload.floats("metrics")
                num_examples = int(metrics["num-examples"])
                fits_row = {"num_examples": metrics["num-examples"],
                            "train_loss": metrics["train_loss"],
                            "setups": metrics.get("setups", 0.0)}
            except (ValueError, KeyError) as err:
                logger.warning("Round %d: update of site %s left out: %s", rnd, site, err)
                continue
            if "eval" in payload.sections:
                evals[site] = payload.floats("eval")
            if "state" in payload.sections:
                hashes[site] = str(payload.section("state").get("private-hash", ""))
            updates.append(Reply(site, payload.tensors, num_examples))
            fits[site] = fits_row
        outcome = close_round(self.strategy, self.global_weights, updates,
                              self.partition.all - self.exchanged)
        for site, reason in outcome.refused.items():
            logger.warning("Round %d: update of site %s left out: %s", rnd, site, reason)
            self._event(event="update-refused", round=rnd, site=site, reason=reason)
            fits.pop(site, None)
            hashes.pop(site, None)
        self.global_weights = outcome.global_weights
        missing = sorted(set(nodes.values()) - set(fits))
        if len(fits) < self.min_sites:
            raise RuntimeError(
                f"Round {rnd}: only {len(fits)} sites answered (at least "
                f"{self.min_sites} needed); missing: {', '.join(missing)}.")
        if missing:
            logger.warning("Round %d completes without sites %s", rnd, missing)
        if evaluate_first:
            self._complete(rnd - 1, pending, evals)
        self._save_checkpoint(rnd, fits)
        self._event(event="trained", round=rnd, seconds=time.monotonic() - started,
                    empty_polls=self.grid.empty_polls,
                    sites=sorted(fits), missing=missing, private_hashes=hashes)
        return fits

    def _complete(self, rnd: int, fits: Mapping[str, Mapping[str, float]],
                  evals: Mapping[str, Mapping[str, float]]) -> None:
        round_metrics = {site: {**fits[site], **evals.get(site, {})} for site in fits}
        self.rows = [r for r in self.rows if r["round"] != rnd]
        for site, metrics in round_metrics.items():
            self.rows.append({"round": rnd, "site": site, **metrics})
        self._unlogged.append((rnd, round_metrics))
        self._hand_over_logging()
        self._event(event="round", round=rnd, sites=round_metrics)

    def _hand_over_logging(self, now: bool = False, every: float = 2.0) -> None:
        # Rounds go to MLflow in batches, every ``every`` seconds, on the tracking thread:
        # the store sees each round within seconds, and a round never waits for it. What
        # a crash leaves unlogged is in the checkpoint and logged on resume.
        if self._unlogged and (now or time.monotonic() - self._handed_over >= every):
            assert self.tracker is not None and self.worker is not None
            self.worker.submit(self.tracker.log_rounds, list(self._unlogged))
            self._unlogged.clear()
            self._handed_over = time.monotonic()

    def _save_checkpoint(self, rnd: int, fits: Mapping[str, Mapping[str, float]]) -> None:
        # Everything needed to go on after a crash: the global weights of round ``rnd``,
        # the training metrics of ``rnd`` whose evaluation comes with the next round, and
        # the MLflow run to log into. Written atomically: a crash leaves the last one whole.
        assert self.tracker is not None
        save_tensors(self.checkpoint, self.global_weights,
                     {"round": rnd, "parent_run_id": self.tracker.parent_id,
                      "rows": self.rows, "pending": fits, "strategy": self.strategy.label})

    def _close(self, pending: dict[str, dict[str, float]]) -> None:
        nodes = self._live_nodes()
        replies = self.grid.send(
            self._messages(nodes, MessageType.EVALUATE, self.config.rounds, False),
            timeout=self.settings.round_timeout,
        )
        evals = {}
        for reply in replies:
            site = nodes.get(reply.metadata.src_node_id)
            if site is not None and not reply.has_error():
                try:
                    evals[site] = unpack(reply.content).floats("metrics")
                except ValueError as err:
                    logger.warning("Final evaluation of site %s left out: %s", site, err)
        if pending:
            self._complete(self.config.rounds, pending, evals)
        assert self.tracker is not None and self.worker is not None
        self._hand_over_logging(now=True)
        self.worker.flush()
        last = {str(r["site"]): {k: v for k, v in r.items() if k not in ("round", "site")}
                for r in self.rows if r["round"] == self.config.rounds}
        final = {site: last[site] for site in self.config.sites if site in last}
        table = site_table(final, result_columns(final))  # type: ignore[arg-type]
        results = {"strategy": self.strategy.label, "rounds": self.config.rounds,
                   "rows": self.rows, "final": final, "table": table,
                   "parent_run_id": self.tracker.parent_id,
                   "tracking_uri": self.tracker.tracking_uri}
        write_text_atomic(self.workdir / "results.json", json.dumps(results, default=float,
                                                                   indent=1))
        self.tracker.log_text(table + "\n", "results.md")
        plot = convergence_plot({self.strategy.label: self.rows},  # type: ignore[dict-item]
                                self.workdir / "convergence.png",
                                title=f"{self.strategy.label}, {len(final)} sites")
        self.tracker.log_file(plot)
        if self.global_weights:
            self.tracker.log_shared_weights(
                self.global_weights,
                self.partition.private if self.strategy.keeps_private else ())
        self.tracker.finish()
        self._event(event="done", table=table)


def _warm_up_tracking(tracking_uri: str | None) -> None:
    from fedbn_med.tracking import warm_up

    warm_up(tracking_uri)


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the federation described by the run config."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    try:
        config, settings = read_run_config(context.run_config)
    except (TypeError, ValueError) as err:
        logger.error("The run config is not usable: %s", err)
        raise
    try:
        FederationServer(FastGrid(grid), config, settings).run()
    except Exception as err:
        # The launcher reads this typed event to say why the run stopped.
        append_event(settings.workdir / "progress.jsonl", RunFailed(reason=shorten(str(err))))
        raise
