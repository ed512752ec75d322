"""A malicious operator's ServerApp: hostile global models and the paced score oracle.

The test copies this file into a Flower app of its own and runs it with ``flwr run``
against the consortium's SuperLink, under the id of a federation the sites have trained
in, so they hold trained private layers and their own last update. To every site it
sends, one message at a time:

- ``nan``: the last global model with one NaN, as a train message;
- ``big``: the same with one value of 1e6;
- ``single``: the single-reply leak of issue 44, an all-zero model whose output bias is
  ``[0, 2]`` (the last layer's update over the bias update would be relu(shift) of BN2);
- ``paced-train``: the last global model, honestly, as the next round's train message;
- ``paced-zero``: then an evaluate message of that round carrying the score oracle's
  probe (``tests/operator_oracle.py``: the first two layers zeroed);
- ``paced-noise``: the same probe with the zeroed layers replaced by noise of std 1e-3,
  which no all-zero rule sees.

For each it writes whether the reply was an error, its reason, and the metric names of
the reply, as JSON to the path its run config names.
"""

from __future__ import annotations

import json
import time

import torch
from flwr.app import Context, Message, MessageType
from flwr.serverapp import Grid, ServerApp

from fedbn_med.checkpoint import load_tensors
from fedbn_med.federation.records import pack, unpack
from fedbn_med.federation.server.grid import FastGrid

app = ServerApp()

HIDDEN = 16


def _probe(in_features: int, noise: float) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    last = torch.zeros(2, HIDDEN)
    last[1, 0] = 1.0
    return {"net.0.weight": noise * torch.randn(HIDDEN, in_features, generator=gen),
            "net.0.bias": torch.zeros(HIDDEN),
            "net.2.weight": noise * torch.randn(HIDDEN, HIDDEN, generator=gen),
            "net.2.bias": torch.full((HIDDEN,), 4.0),
            "net.4.weight": last, "net.4.bias": torch.zeros(2)}


def _fate(reply: Message) -> dict:
    if reply.has_error():
        return {"error": True, "reason": reply.error.reason}
    payload = unpack(reply.content)
    return {"error": False, "metrics": sorted(payload.floats("metrics")),
            "eval": sorted(payload.floats("eval")) if "eval" in payload.sections else None}


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Send every probe to every connected site; write each reply's fate."""
    cfg = json.loads(str(context.run_config["probes"]))
    fast = FastGrid(grid)
    deadline = time.monotonic() + 60
    nodes: list[int] = []
    while time.monotonic() < deadline and len(nodes) < int(cfg["sites"]):
        nodes = sorted(grid.get_node_ids())
        time.sleep(0.2)
    answers = fast.send(
        [Message(pack(), dst_node_id=n, message_type=MessageType.QUERY, group_id="who")
         for n in nodes], timeout=60)
    out: dict[str, dict] = {}
    errors = [a.error.reason for a in answers if a.has_error()]
    if errors:
        out["query-errors"] = {"reasons": errors}
    sites = {a.metadata.src_node_id: (str(unpack(a.content).section("info")["site"]),
                                      int(unpack(a.content).section("info")["input-shape"][0]))
             for a in answers if not a.has_error()}
    honest, _ = load_tensors(cfg["global"])
    rnd = int(cfg["round"]) + 1
    for node, (site, in_features) in sites.items():
        nan = {k: v.clone() for k, v in honest.items()}
        nan["net.2.weight"][0, 0] = float("nan")
        big = {k: v.clone() for k, v in honest.items()}
        big["net.2.weight"][0, 0] = 1e6
        single = {k: torch.zeros_like(v) for k, v in honest.items()}
        single["net.4.bias"] = torch.tensor([0.0, 2.0])
        plan = [("nan", MessageType.TRAIN, nan), ("big", MessageType.TRAIN, big),
                ("single", MessageType.TRAIN, single),
                ("paced-train", MessageType.TRAIN, honest),
                ("paced-zero", MessageType.EVALUATE, _probe(in_features, 0.0)),
                ("paced-noise", MessageType.EVALUATE, _probe(in_features, 1e-3))]
        fates = {}
        for name, mtype, weights in plan:
            config = {"round": rnd, "local-epochs": 1}
            (reply,) = fast.send([Message(pack(weights, config=config), dst_node_id=node,
                                          message_type=mtype, group_id=f"{name}-{rnd}")],
                                 timeout=120)
            fates[name] = _fate(reply)
        out[site] = fates
    with open(cfg["out"], "w", encoding="utf-8") as handle:
        json.dump(out, handle)
