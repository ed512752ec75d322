"""Secure aggregation (SecAgg+), the part both sides share and the site's part of it.

With ``secagg`` on, every training round's update travels through Flower's own SecAgg+
protocol (``SecAggPlusWorkflow`` at the server, :func:`secaggplus_mod` at the site): the
server learns only the sum of the sites' updates, never one site's. Only the shared keys
enter the masked vector; a site's private (normalisation) layers never leave it, as
without SecAgg.

The vector a site masks is its exchanged tensors in key order, each multiplied by its
weight ``n / scale`` (``n``: its own training examples, the count it registered;
``scale``: the largest count of the round, which the server sends), then one more
element, ``n / scale`` itself. Flower's mod gives every site the same weight (1), so
the unmasked sum is ``sum_i n_i w_i / scale`` and ``sum_i n_i / scale``: the server
divides one by the other and has the weighted average without any site's count, and
checks the total weight against the registered counts (:mod:`.server.secagg`).

A site masks an update only when its own policy allows SecAgg (``secure_aggregation =
true`` in its site file, or ``--secagg`` on its command line), and only after checking it
(:func:`check_outgoing`): keys and shapes of the model it received, no private key,
floating point, finite, every value within the quantisation range (which would clip it
silently), and the update's norm within the bound the server states.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import numpy as np
import torch
from flwr.app import Context, Message, MessageType, RecordDict
from flwr.client.mod import secaggplus_mod
from flwr.clientapp.typing import ClientAppCallable
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
from flwr.common.secure_aggregation.secaggplus_constants import (
    RECORD_KEY_CONFIGS,
    RECORD_KEY_STATE,
    Key,
    Stage,
)
from flwr.compat.common.recorddict_compat import fitres_to_recorddict

from fedbn_med.federation.config import NodeSettings
from fedbn_med.federation.wire import MAX_NORM, SCALE  # a train message's SecAgg keys
from fedbn_med.fl.reply_checks import check_reply, update_norm

__all__ = ["MAX_NORM", "SCALE", "check_outgoing", "clipping_range", "is_secagg", "masked_reply",
           "secagg_gate", "vector_keys"]

#: The fewest sites a SecAgg+ round may have, and the lowest reconstruction threshold a
#: site accepts: with fewer, the sum of the others is one site's update.
MIN_SITES = 2


def vector_keys(keys: Collection[str]) -> list[str]:
    """Return the order in which the exchanged tensors enter the masked vector."""
    return sorted(keys)


def is_secagg(msg: Message) -> bool:
    """Return whether a train message is a stage of the SecAgg+ protocol."""
    return RECORD_KEY_CONFIGS in msg.content.config_records


def secagg_gate(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Run Flower's SecAgg+ mod, for a site whose policy allows it, on SecAgg messages only.

    Plain train messages go straight to the site's handler. A SecAgg+ setup that would
    make one site's update easier to read (fewer than two sites, or a reconstruction
    threshold below a majority of them, or below two) is refused.
    """
    if msg.metadata.message_type != MessageType.TRAIN or not is_secagg(msg):
        return call_next(msg, context)
    node = NodeSettings.from_node_config(context.node_config)
    if not node.secagg:
        raise PermissionError(
            f"Site {node.site} refuses secure aggregation: its policy does not allow it "
            "(secure_aggregation = true in its site file, or --secagg on its command line, "
            "allows it).")
    configs = msg.content.config_records[RECORD_KEY_CONFIGS]
    if configs.get(Key.STAGE) == Stage.SETUP:
        sites, needed = configs.get(Key.SAMPLE_NUMBER), configs.get(Key.THRESHOLD)
        if not (isinstance(sites, int) and isinstance(needed, int) and sites >= MIN_SITES
                and needed >= max(MIN_SITES, sites // 2 + 1)):
            raise PermissionError(
                f"Site {node.site} refuses a SecAgg+ round of {sites!r} sites with a "
                f"reconstruction threshold of {needed!r}: it takes part with at least "
                f"{MIN_SITES} sites and a threshold of a majority of them (at least "
                f"{MIN_SITES}); with less, the server could read one site's update.")
    return secaggplus_mod(msg, context, call_next)


def clipping_range(context: Context) -> float:
    """Return the quantisation range of this site's SecAgg+ round (set by its setup)."""
    state = context.state.config_records.get(RECORD_KEY_STATE)
    value = 0.0 if state is None else state.get("clipping_range", 0.0)
    return float(value) if isinstance(value, (int, float)) else 0.0


def check_outgoing(site: str, sent: Mapping[str, torch.Tensor],
                   received: Mapping[str, torch.Tensor], private: Collection[str],
                   clip: float, max_norm: float) -> None:
    """Refuse to mask an update that is not what an honest site sends.

    Raises
    ------
    ValueError
        Naming the first check it fails: keys, private keys, dtype, shape, finiteness,
        the quantisation range, the update norm.
    """
    # Only floating-point tensors can be quantised; then what the server checks of any
    # reply (fl.reply_checks), then what quantisation and the sum's norm bound need.
    why = next((f"{key} is {value.dtype}, not floating point" for key, value in sent.items()
                if not value.dtype.is_floating_point), None)
    why = why or check_reply(sent, received, private)
    if why is None:
        why = next((f"{key} holds values beyond the quantisation range +-{clip:g} (they "
                    "would be clipped)" for key, value in sent.items()
                    if value.numel() and float(value.abs().max()) > clip), None)
    if why is None:
        norm = update_norm(sent, received)
        if not norm <= max_norm:
            why = f"its update norm {norm:.4g} exceeds the bound {max_norm:g}"
    if why is not None:
        raise ValueError(f"Site {site} refuses to send its update under SecAgg: {why}.")


def masked_reply(content: RecordDict, sent: Mapping[str, torch.Tensor], weight: float,
                 scale: float) -> RecordDict:
    """Add to ``content`` the vector Flower's mod masks: weighted tensors, then the weight.

    The mod reads it as a ``FitRes`` of weight 1 and clears the plain arrays before the
    reply leaves the site: only the masked vector goes.
    """
    if not 0 < weight <= scale:
        raise ValueError(f"A site's SecAgg weight must be in (0, {scale:g}], got {weight:g} "
                         "(its count is above the largest the server registered).")
    share = weight / scale
    arrays = [sent[k].detach().double().cpu().numpy() * share for k in vector_keys(sent)]
    arrays.append(np.array([share]))
    fit = fitres_to_recorddict(FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays),
                                      num_examples=1, metrics={}), keep_input=False)
    for name, record in fit.items():
        content[name] = record
    return content
