"""A training round through Flower's SecAgg+ workflow: the server learns only the sum.

Flower's ``SecAggPlusWorkflow`` is written for its own round loop (a ``LegacyContext``, a
strategy that configures and aggregates ``FitIns``/``FitRes``). Its four stages are public
methods, so our round driver runs them itself, unchanged: setup (public keys), share keys
(encrypted shares of each site's secrets), collect masked vectors (the train message, with
the global weights, and each site's masked update), unmask (the shares that remove the
masks, and those of a site that dropped out, so that its pairwise masks cancel). Between
setup and collection the workflow's ``FitIns`` are replaced by our own train message; its
replies go through :class:`~.grid.FastGrid`, paced per stage.

What the server gets is ``sum_i n_i w_i / scale`` and ``sum_i n_i / scale`` (the site's
vector, :mod:`fedbn_med.federation.secagg`). The checks that need one site's update (its
norm against the others', its count against its registered one) cannot run here; what
runs instead, on the unmasked sum (:func:`sum_reason`): the layout, finite values, the
total weight against the counts registered for the sites that contributed (a site that
weighed itself with another count shows), every average value within the quantisation
range, and the average update's norm within the bound each site checked its own against.
A site that drops out during the round is left out of the sum: with at least
``threshold`` sites left, the shares of the others remove its masks.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.common import FitIns, Parameters, parameters_to_ndarrays
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import Strategy
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey
from flwr.server.workflow.secure_aggregation.secaggplus_workflow import (
    SecAggPlusWorkflow,
    WorkflowState,
)

from fedbn_med.federation.secagg import MIN_SITES, vector_keys
from fedbn_med.fl.reply_checks import update_norm
from fedbn_med.fl.rounds import RoundOutcome

if TYPE_CHECKING:
    from fedbn_med.federation.server.grid import FastGrid
    from fedbn_med.federation.server.rounds import FederationServer

__all__ = ["SecAggRound", "SecAggSum", "secagg_fit", "sum_reason", "threshold"]

logger = logging.getLogger("fedbn_med.server")

#: How far the unmasked total weight may stray from the registered counts (quantisation)
WEIGHT_TOLERANCE = 1e-3


def threshold(n_nodes: int) -> int:
    """Return the shares that rebuild a site's secrets: a majority, and at least two."""
    return max(MIN_SITES, n_nodes // 2 + 1)


@dataclass
class SecAggSum:
    """What a SecAgg+ round gave the server.

    Attributes
    ----------
    replies : list of Message
        The train replies (the sites' metrics and scores; their updates only masked).
    answered : set of int
        The nodes that answered any stage.
    contributors : list of int
        The nodes whose masked vector entered the sum.
    mean : list of ndarray or None
        The unmasked sum divided by the contributors (Flower's workflow divides), or
        None when the protocol stopped (``why`` says why).
    """

    replies: list[Message] = field(default_factory=list)
    answered: set[int] = field(default_factory=set)
    contributors: list[int] = field(default_factory=list)
    mean: list[np.ndarray] | None = None
    why: str = ""


class _StageGrid:
    """The ``send_and_receive`` the workflow calls, over our grid, one pace per stage."""

    def __init__(self, grid: FastGrid, timeout: float) -> None:
        self.grid, self.timeout = grid, timeout
        self.replies: dict[str, list[Message]] = {}
        self.seconds: dict[str, float] = {}

    def send_and_receive(self, messages: Any, *, timeout: float | None = None
                         ) -> list[Message]:
        messages = list(messages)
        stage = (str(messages[0].content.config_records[RECORD_KEY_CONFIGS].get(Key.STAGE))
                 if messages else "")
        started = time.monotonic()
        replies = self.grid.send(messages, timeout=self.timeout, pace=f"secagg-{stage}")
        self.seconds[stage] = time.monotonic() - started
        self.replies[stage] = replies
        return replies


class _Capture(Strategy):
    """The strategy the workflow asks: every node of the round, then keep the sum."""

    def __init__(self, nodes: list[int], grid: Any) -> None:
        self.proxies = [GridClientProxy(n, grid, 0) for n in nodes]
        self.mean: list[np.ndarray] | None = None

    def configure_fit(self, server_round: int, parameters: Parameters, client_manager: Any
                      ) -> list[tuple[Any, FitIns]]:
        return [(p, FitIns(Parameters([], ""), {})) for p in self.proxies]

    def aggregate_fit(self, server_round: int, results: Any, failures: Any
                      ) -> tuple[None, dict]:
        if results:
            self.mean = parameters_to_ndarrays(results[0][1].parameters)
        return None, {}

    def initialize_parameters(self, client_manager: Any) -> None:
        return None

    def configure_evaluate(self, server_round: int, parameters: Parameters,
                           client_manager: Any) -> list:
        return []

    def aggregate_evaluate(self, server_round: int, results: Any, failures: Any
                           ) -> tuple[None, dict]:
        return None, {}

    def evaluate(self, server_round: int, parameters: Parameters) -> None:
        return None


def secagg_fit(grid: FastGrid, contents: Mapping[int, RecordDict], rnd: int, *,
               clip: float, timeout: float) -> SecAggSum:
    """Run one training round as Flower's SecAgg+ stages; return the unmasked mean.

    ``contents`` is each node's train message content (ours); each stage waits at most
    ``timeout`` seconds.
    """
    nodes = sorted(contents)
    capture = _Capture(nodes, grid.grid)
    context = LegacyContext(Context(run_id=0, node_id=0, node_config={}, state=RecordDict(),
                                    run_config={}), strategy=capture)
    context.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord(
        {WorkflowKey.CURRENT_ROUND: rnd})
    context.state.array_records[MAIN_PARAMS_RECORD] = ArrayRecord()
    # max_weight 1: every site masks with weight 1 (its own weight is in its vector)
    workflow = SecAggPlusWorkflow(num_shares=1.0, reconstruction_threshold=threshold(len(nodes)),
                                  max_weight=1.0, clipping_range=clip)
    staged = _StageGrid(grid, timeout)
    state = WorkflowState()
    out = SecAggSum()
    try:
        done = workflow.setup_stage(staged, context, state)  # type: ignore[arg-type]
        if done:
            state.nid_to_fitins = {n: contents[n] for n in state.nid_to_fitins}
            done = (workflow.share_keys_stage(staged, context, state)  # type: ignore[arg-type]
                    and workflow.collect_masked_vectors_stage(staged, context,  # type: ignore[arg-type]
                                                              state)
                    and workflow.unmask_stage(staged, context, state))  # type: ignore[arg-type]
    except Exception as err:  # a malformed reply stops the protocol: no sum this round
        out.why = f"the SecAgg+ protocol failed ({type(err).__name__}: {err})"
        done = False
    out.replies = staged.replies.get(Stage.COLLECT_MASKED_VECTORS, [])
    out.contributors = sorted(m.metadata.src_node_id for m in out.replies if not m.has_error())
    out.answered = {m.metadata.src_node_id for r in staged.replies.values() for m in r}
    logger.info("Round %d SecAgg+ stages (s, exchange only): %s", rnd,
                ", ".join(f"{k} {v:.2f}" for k, v in staged.seconds.items()))
    if done and capture.mean is not None:
        out.mean = capture.mean
    elif not out.why:
        out.why = (f"the SecAgg+ protocol stopped with {len(out.contributors)} of {len(nodes)} "
                   f"sites' vectors (it needs {threshold(len(nodes))} to remove the masks)")
    return out


def sum_reason(mean: list[np.ndarray], contributors: int, reference: Mapping[str, torch.Tensor],
               expected_weight: float, scale: float, clip: float, max_norm: float
               ) -> tuple[dict[str, torch.Tensor] | None, str]:
    """Return the weighted average the unmasked sum gives, or None and why it is refused.

    ``mean`` is the workflow's sum over ``contributors``; ``expected_weight`` the counts
    registered for them, in all; ``scale`` the round's scale.
    """
    keys = vector_keys(reference)
    if len(mean) != len(keys) + 1 or any(
            tuple(m.shape) != tuple(reference[k].shape) for m, k in zip(mean, keys)):
        return None, "its layout is not the model's"
    if not all(bool(np.isfinite(m).all()) for m in mean):
        return None, "it holds NaN or Inf"
    total = float(mean[-1].reshape(-1)[0]) * contributors  # sum of n_i / scale
    weight = total * scale
    if not abs(weight - expected_weight) <= WEIGHT_TOLERANCE * expected_weight + 0.5:
        return None, (f"its total weight is {weight:.1f} but the contributing sites' counts "
                      f"sum to {expected_weight:g} (a site weighed itself with another count)")
    average = {k: torch.from_numpy(m * contributors / total).to(reference[k].dtype)
               for m, k in zip(mean, keys)}
    largest = max((float(v.abs().max()) for v in average.values() if v.numel()), default=0.0)
    if largest > clip * (1 + 1e-6):
        return None, f"its average holds a value {largest:.4g} beyond +-{clip:g}"
    norm = update_norm(average, reference)
    if not norm <= max_norm:
        return None, f"its average update norm {norm:.4g} exceeds the bound {max_norm:g}"
    return average, ""


class SecAggRound:
    """One training round of a :class:`~.rounds.FederationServer` under SecAgg+.

    Each site weighs its own count; the server sends the round's ``scale`` (the largest
    count registered for its sites, else the largest they reported) and checks the sum's
    total weight against those counts.
    """

    def __init__(self, server: FederationServer, rnd: int, nodes: Mapping[int, str],
                 evaluate_first: bool) -> None:
        settings = server.settings
        self.server, self.nodes = server, dict(nodes)
        equal = server.config.weighting == "equal"
        self.counts = {site: 1 if equal else settings.registered_counts.get(
            site, server.registry.counts.get(site, 0)) for site in self.nodes.values()}
        self.scale = float(max(1, *self.counts.values()))
        # one payload record (the global weights) in every node's message: serialised
        # once, and stored once by the SuperLink; each message gets its own SecAgg+ record
        payload = server._content(dataclasses.replace(
            server._instruction(rnd, evaluate_first), secagg_scale=self.scale,
            secagg_max_norm=settings.secagg_max_norm))
        contents = {n: RecordDict(dict(payload.items())) for n in self.nodes}
        self.summed = secagg_fit(server.grid, contents, rnd, clip=settings.secagg_clip,
                                 timeout=settings.round_timeout)

    def outcome(self, readable: Collection[str]) -> RoundOutcome:
        """Return the round's new global weights, or every contributor refused and why.

        ``readable``: the sites whose reply (metrics, scores) the server accepted. A site
        whose masked vector entered the sum but whose reply was refused cannot be taken
        out of it: the sum is refused.
        """
        server, summed = self.server, self.summed
        out = RoundOutcome(global_weights=server.global_weights, control=server.control,
                           norm_reference=server.norm_reference)
        sites = sorted(self.nodes[n] for n in summed.contributors if n in self.nodes)
        why = summed.why
        unread = sorted(set(sites) - set(readable))
        if unread:
            why = (f"the replies of {', '.join(unread)} were refused, and their masked "
                   "vectors are in the sum")
        elif summed.mean is not None:
            settings = server.settings
            average, why = sum_reason(summed.mean, len(summed.contributors),
                                      server.global_weights,
                                      sum(self.counts[s] for s in sites), self.scale,
                                      settings.secagg_clip, settings.secagg_max_norm)
            if average is not None:
                out.global_weights, out.accepted = average, sites
                return out
        logger.error("The round's SecAgg sum is refused: %s", why)
        out.refused = {site: f"the round's SecAgg sum is refused: {why}" for site in sites}
        return out
