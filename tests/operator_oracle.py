"""A compromised server operator's ServerApp: read a site's BN layer back from its scores.

The test copies this file into a Flower app of its own and runs it with ``flwr run``
against the consortium's SuperLink, under the federation id of a real federation, so the
sites load their trained private layers. Nothing in the package can start it.

The probe, on the ABIDE network ``in -> 16 -> BN -> 16 -> BN -> 2``: the second linear
layer's weights are zero and its bias is ``b`` for every channel, so the second BN layer
(in eval mode) outputs ``a_c * b + c_c`` per channel, with ``a = gamma / sqrt(var + eps)``
and ``c = beta - a * mean``. The last layer passes channel ``c`` alone, with sign ``+1``
or ``-1``, to the second logit; every test example then has the same logit gap ``g`` or
``-g``, and the two test losses add up to ``2 log(2 cosh(g / 2))``, whatever the labels.
Two values of ``b`` give ``a_c`` and ``c_c``.

Then it sends crafted train messages with ``evaluate-first`` and counts the scores that
come back. It writes what it got as JSON to the path its run config names.

The run config's ``channels`` (default: all 16) says how many channels it probes, so how
many crafted evaluations each site gets (4 per channel). It collects replies as the
package's own server does (:class:`~fedbn_med.federation.server.grid.FastGrid`), not
with Flower's ``send_and_receive``, which waits 3 s between looks: an operator may use
any client of the SuperLink's ServerAppIo API it likes.
"""

from __future__ import annotations

import json
import math
import time

import torch
from flwr.app import Context, Message, MessageType
from flwr.serverapp import Grid, ServerApp

from fedbn_med.federation.records import pack, unpack
from fedbn_med.federation.server.grid import FastGrid

app = ServerApp()

HIDDEN = 16
BIASES = (4.0, 8.0)


def _probe(in_features: int, channel: int, bias: float, sign: float) -> dict[str, torch.Tensor]:
    last = torch.zeros(2, HIDDEN)
    last[1, channel] = sign
    return {"net.0.weight": torch.zeros(HIDDEN, in_features),
            "net.0.bias": torch.zeros(HIDDEN),
            "net.2.weight": torch.zeros(HIDDEN, HIDDEN),
            "net.2.bias": torch.full((HIDDEN,), bias),
            "net.4.weight": last, "net.4.bias": torch.zeros(2)}


def _gap(loss_sum: float) -> float:
    # loss(+g) + loss(-g) = 2 log(2 cosh(g / 2)) for g >= 0
    return 2.0 * math.acosh(max(1.0, math.exp(loss_sum / 2.0) / 2.0))


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Probe every connected site; write the estimates and the replies' fates."""
    cfg = json.loads(str(context.run_config["oracle"]))
    channels = int(cfg.get("channels", HIDDEN))
    fast = FastGrid(grid)
    deadline = time.monotonic() + 60
    nodes: list[int] = []
    while time.monotonic() < deadline and len(nodes) < int(cfg["sites"]):
        nodes = sorted(grid.get_node_ids())
        time.sleep(0.2)
    answers = fast.send(
        [Message(pack(), dst_node_id=n, message_type=MessageType.QUERY, group_id="who")
         for n in nodes], timeout=60)
    sites = {}
    for reply in answers:
        if not reply.has_error():
            info = unpack(reply.content).section("info")
            sites[reply.metadata.src_node_id] = (str(info["site"]), int(info["input-shape"][0]))
    probes = [(c, b, s) for c in range(channels) for b in BIASES for s in (1.0, -1.0)]
    messages = [Message(pack(_probe(in_features, c, b, s), config={"round": cfg["round"]}),
                        dst_node_id=node, message_type=MessageType.EVALUATE,
                        group_id=f"probe-{i}")
                for node, (_, in_features) in sites.items()
                for i, (c, b, s) in enumerate(probes)]
    losses: dict[int, dict[tuple[int, float, float], float]] = {n: {} for n in sites}
    errors: dict[int, list[str]] = {n: [] for n in sites}
    for reply in fast.send(messages, timeout=300):
        node = reply.metadata.src_node_id
        if reply.has_error():
            errors[node].append(reply.error.reason)
            continue
        loss = unpack(reply.content).floats("metrics").get("test_loss")
        if loss is not None:
            losses[node][probes[int(str(reply.metadata.group_id).split("-")[1])]] = loss
    out: dict[str, dict] = {}
    for node, (site, in_features) in sites.items():
        got = losses[node]
        scale, shift = [math.nan] * HIDDEN, [math.nan] * HIDDEN
        for c in range(channels):
            if all((c, b, s) in got for b in BIASES for s in (1.0, -1.0)):
                g = [_gap(got[(c, b, 1.0)] + got[(c, b, -1.0)]) for b in BIASES]
                if min(g) > 0:  # both on the linear side of the ReLU
                    scale[c] = (g[1] - g[0]) / (BIASES[1] - BIASES[0])
                    shift[c] = g[0] - scale[c] * BIASES[0]
        # the same probe through training messages (evaluate-first), one round at a time
        trained_scores = []
        probes_left = cfg.get("train_probes", 0) if site in cfg.get("train_sites", []) else 0
        for rnd in range(cfg["round"] + 1, cfg["round"] + 1 + probes_left):
            message = Message(pack(_probe(in_features, 0, BIASES[0], 1.0), config={
                "round": rnd, "local-epochs": 1, "evaluate-first": True}),
                dst_node_id=node, message_type=MessageType.TRAIN, group_id=f"train-{rnd}")
            (reply,) = fast.send([message], timeout=120)
            evals = {} if reply.has_error() else unpack(reply.content).floats("eval")
            trained_scores.append(evals.get("test_loss"))
        out[site] = {"scale": scale, "shift": shift, "scores": len(got),
                     "errors": errors[node][:3], "error_count": len(errors[node]),
                     "train_scores": trained_scores}
    for node, (site, _) in sites.items():
        if site in cfg.get("hostile_sites", []):
            out[site]["hostile"] = _hostile(grid, fast, node)
    with open(cfg["out"], "w", encoding="utf-8") as handle:
        json.dump(out, handle)


def _hostile(grid: Grid, fast: FastGrid, node: int) -> dict:
    """Send a site a message whose contents never come, then one too large, then a query.

    Returns each one's reply (its error reason, or the site it names) and how long it took.
    """
    from flwr.app.message import remove_content_from_message
    from flwr.common.serde import message_to_proto
    from flwr.proto.runtime_pb2 import PushAppMessagesRequest
    from flwr.supercore.inflatable.inflatable_object import (
        get_object_tree,
        no_object_id_recompute,
    )

    def fate(reply: Message | None, started: float) -> dict:
        if reply is None:
            return {"reply": None, "seconds": time.monotonic() - started}
        what = (reply.error.reason if reply.has_error()
                else str(unpack(reply.content).section("info")["site"]))
        return {"reply": what, "error": reply.has_error(),
                "seconds": time.monotonic() - started}

    result = {}
    # 1. the head alone: its contents are never pushed
    stalled = Message(pack({"x": torch.zeros(1000)}), dst_node_id=node,
                      message_type=MessageType.QUERY, group_id="stalled")
    started = time.monotonic()
    with no_object_id_recompute():
        stalled.metadata.__dict__["_message_id"] = stalled.object_id
        response = grid._runtime_client.PushMessages(PushAppMessagesRequest(  # noqa: SLF001
            messages_list=[message_to_proto(remove_content_from_message(stalled))],
            message_object_trees=[get_object_tree(stalled)]))
    (message_id,) = response.message_ids
    reply = None
    while reply is None and time.monotonic() - started < 120:
        got = list(grid.pull_messages([message_id]))
        reply = got[0] if got else None
        time.sleep(0.2)
    result["stalled"] = fate(reply, started)
    # 2. a message larger than the site accepts
    started = time.monotonic()
    big = Message(pack({"x": torch.zeros(1_500_000)}), dst_node_id=node,
                  message_type=MessageType.QUERY, group_id="big")
    replies = fast.send([big], timeout=60)
    result["big"] = fate(replies[0] if replies else None, started)
    # 3. an ordinary query: the site must still be there
    started = time.monotonic()
    replies = fast.send([Message(pack(), dst_node_id=node, message_type=MessageType.QUERY,
                                 group_id="after")], timeout=60)
    result["after"] = fate(replies[0] if replies else None, started)
    return result
