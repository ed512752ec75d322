"""A site node that misbehaves on purpose: tests start it as a real process.

``python tests/faulty_node.py FAULT NODE-ARGS...`` runs the real node
(:mod:`fedbn_med.federation.node`, same Fleet session, TLS and node key) with its ClientApp
wrapped here, in the test suite: nothing in the package, its options or its messages can
turn a fault on. Faults:

- ``lies``: trains honestly, then reports ``num-examples`` of ``inf`` in round 1, ``-5``
  in round 2, and in round 3 a metric name MLflow refuses;
- ``silent-train``: tells the server who it is, then never answers a training message;
- ``mute``: never answers any message (a node that registered and went quiet);
- ``hostile-upload``: says who it is, then answers training round 1 and every evaluation
  with a reply whose head reaches the SuperLink and whose contents never do (as when a
  site's link dies in the middle of its upload); round 2 with a reply of three times the
  model's bytes, all uploaded; round 3 with a reply whose head names thousands of objects;
- ``dies-in-secagg``: takes part in SecAgg+ honestly until round 2's train message (its
  keys shared with the other sites), then its process exits at once: a site that drops
  out in the middle of a SecAgg+ round.

Each message it gets is logged as ``faulty node got a <type> message``.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

import numpy as np
from flwr.app import Array, ArrayRecord, Message, RecordDict

from fedbn_med.federation import _flwr_compat as flwr_compat
from fedbn_med.federation import client_app
from fedbn_med.federation.node import main
from fedbn_med.federation.records import RECORD

logger = logging.getLogger("faulty_node")
_LIES = {1: ("metrics/num-examples", float("inf")), 2: ("metrics/num-examples", -5.0),
         3: ("metrics/bad metric!", 1.0)}
_CUT = threading.Event()


def _faulty(fault: str, honest):  # noqa: ANN001, ANN202 - a ClientApp
    def app(message, context):  # noqa: ANN001, ANN202
        kind = message.metadata.message_type
        logger.warning("faulty node got a %s message", kind)
        if fault == "mute" or (fault == "silent-train" and kind == "train"):
            threading.Event().wait()  # never answers; the node's heartbeats go on
        if fault == "hostile-upload" and kind in ("train", "evaluate"):
            return _hostile(message, kind)
        records = message.content.config_records
        if (fault == "dies-in-secagg" and kind == "train" and RECORD in records
                and int(records[RECORD]["config/round"]) == 2):
            logger.warning("faulty node dies in the middle of a SecAgg+ round")
            os._exit(9)
        reply = honest(message=message, context=context)
        if fault == "lies" and kind == "train":
            record = reply.content.config_records[RECORD]
            rnd = int(message.content.config_records[RECORD]["config/round"])
            key, value = _LIES.get(rnd, _LIES[1])
            record[key] = value
        return reply

    return app


def _hostile(message: Message, kind: str) -> Message:
    rnd = int(message.content.config_records[RECORD]["config/round"]) if kind == "train" else 0
    arrays = [a for record in message.content.array_records.values() for a in record.values()]
    if rnd == 2:  # bloated: 1 MiB arrays, three times the model's bytes and 2 MiB more
        size = 3 * sum(len(a.data) for a in arrays) + (2 << 20)
        content = {f"a{i}": Array(np.full(1 << 18, i, dtype=np.float32))
                   for i in range(-(-size // (1 << 20)))}
    else:  # round 3: more objects than the model's weights and controls could need
        _CUT.set()  # this reply's upload stops after its head
        count = 4 * len(arrays) + 300 if rnd == 3 else 1
        content = {f"a{i}": Array(np.full(1, i, dtype=np.float32)) for i in range(count)}
    return Message(RecordDict({"hostile": ArrayRecord(content)}), reply_to=message)


if __name__ == "__main__":
    if sys.argv[1] != "mute":  # a mute node never loads its data
        from keyed import preload_task  # this file's folder, tests/, is on sys.path

        preload_task()
    if sys.argv[1] == "hostile-upload":
        _push = flwr_compat.push_object_contents_from_iterable

        def _push_unless_cut(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            if _CUT.is_set():  # the head went; the contents never go
                _CUT.clear()
                return None
            return _push(*args, **kwargs)

        flwr_compat.push_object_contents_from_iterable = _push_unless_cut
    client_app.app = _faulty(sys.argv[1], client_app.app)
    main(sys.argv[2:])
