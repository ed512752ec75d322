"""The federation server's round loop, without processes: a grid of scripted sites.

The server is the real one (:class:`fedbn_med.federation.server.FederationServer`, with
its registry, recorder, checks and a real sqlite MLflow store); only the SuperLink is
replaced by :class:`ScriptedGrid`, whose nodes answer each message at once. Every event
the server writes must decode, strictly, as its class.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from fedbn_med.federation import events
from fedbn_med.federation.config import ServerSettings
from fedbn_med.federation.records import pack, unpack
from fedbn_med.federation.server import FederationServer
from fedbn_med.spec import RunSpec

SHAPE = (12,)
HASH = "0" * 64


@dataclass
class _Reply:
    """What the server reads of a Flower reply."""

    metadata: SimpleNamespace
    content: object = None
    error: SimpleNamespace | None = None

    def has_error(self) -> bool:
        return self.error is not None


class ScriptedGrid:
    """Nodes that answer every message at once, as ``answer(node, message)`` says."""

    def __init__(self, nodes: dict[int, str], answer) -> None:  # noqa: ANN001
        self.nodes = nodes
        self.answer = answer
        self.empty_polls = 0
        self.exchanges = 0
        self.sent: list[tuple[str, int]] = []

    def node_ids(self) -> list[int]:
        return list(self.nodes)

    def send(self, messages, timeout, until=None):  # noqa: ANN001, ANN201, ARG002
        self.exchanges += 1
        replies = []
        for message in messages:
            node, kind = message.metadata.dst_node_id, message.metadata.message_type
            self.sent.append((kind, node))
            got = self.answer(node, kind, unpack(message.content))
            if got is not None:
                replies.append(_Reply(SimpleNamespace(src_node_id=node), *got))
        return replies


def honest(site: str, kind: str, payload, rnd_scale: float = 0.01):  # noqa: ANN001, ANN201
    """Return an honest site's answer: who it is, a small update and sound scores."""
    if kind == "query":
        return (pack(info={"site": site, "input-shape": list(SHAPE), "resumed-round": 0,
                           "private-hash": HASH}),)
    scores = {"val_loss": 0.6, "val_accuracy": 0.5, "test_accuracy": 0.5, "test_loss": 0.6,
              "test_auc": 0.5}
    if kind == "evaluate":
        return (pack(metrics=scores),)
    config = payload.section("config")
    weights = {k: v + rnd_scale if v.is_floating_point() else v
               for k, v in payload.tensors.items()}
    sections = {"metrics": {"num-examples": 20, "train_loss": 0.5, "setups": 1},
                "state": {"private-hash": HASH, "round": int(config["round"])}}
    if config["evaluate-first"]:
        sections["eval"] = scores
    return (pack(weights, **sections),)


def crashing(sites: dict[int, str], crash: dict[str, int]):  # noqa: ANN201
    """Return honest answers, except that the SuperLink goes away in ``crash["round"]``."""

    def answer(node, kind, payload):  # noqa: ANN001, ANN202
        if kind == "train" and payload.section("config")["round"] == crash["round"]:
            raise ConnectionError("the SuperLink went away")
        return honest(sites[node], kind, payload)

    return answer


def _server(tmp_path, grid, rounds=3, **settings) -> FederationServer:  # noqa: ANN001
    spec = RunSpec(strategy="fedbn", rounds=rounds, sites=("NYU", "UM", "USM"),
                   data_dir=tmp_path / "unused")
    return FederationServer(grid, spec, ServerSettings(
        workdir=tmp_path / "run", tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
        wait_timeout=2.0, round_timeout=5.0, input_shape=SHAPE, **settings))


def _events(tmp_path) -> list[events.Event]:  # noqa: ANN001
    lines = (tmp_path / "run" / "progress.jsonl").read_text().splitlines()
    return list(events.read_events(lines))  # strict: a field a class lacks raises


def test_every_event_the_server_writes_decodes_as_its_class(tmp_path, patched_flower):
    sites = {1: "NYU", 2: "UM", 3: "USM", 4: "UM", 5: "NYU"}

    def answer(node, kind, payload):  # noqa: ANN001, ANN202
        if node == 4 and kind == "query":  # a second UM whose data do not fit
            return (pack(info={"site": "UM", "input-shape": [5], "resumed-round": 0}),)
        if node == 5:  # a node that cannot start its site
            return (None, SimpleNamespace(reason="x" * 5000))
        if node == 3 and kind == "train" and payload.section("config")["round"] == 2:
            return honest("USM", kind, payload, rnd_scale=math.nan)
        if node == 3 and kind == "evaluate":
            return (pack(metrics={"test_accuracy": math.nan}),)
        return honest(sites[node], kind, payload)

    _server(tmp_path, ScriptedGrid(sites, answer)).run()
    written = _events(tmp_path)
    kinds = [e.kind for e in written]
    assert kinds[0] == "server-started" and kinds[-1] == "done"
    assert {"tracking-warm", "tracking-ready", "ready", "joined", "site-error",
            "site-refused", "update-refused", "trained", "round",
            "evaluation-refused"} <= set(kinds)
    by_kind: dict[str, list] = {}
    for event in written:
        by_kind.setdefault(event.kind, []).append(event)
    (refused,) = by_kind["site-refused"]
    assert refused.node == 4 and "shape (N, 5)" in refused.reason
    (error,) = by_kind["site-error"]
    assert error.node == 5 and len(error.reason) <= 500  # a site's text is bounded
    assert {e.site: e.node for e in by_kind["joined"]} == {"NYU": 1, "UM": 2, "USM": 3}
    (update,) = by_kind["update-refused"]
    assert (update.round, update.site) == (2, "USM") and "NaN" in update.reason
    trained = {e.round: e for e in by_kind["trained"]}
    assert trained[2].sites == ["NYU", "UM"] and set(trained[1].shares) == {"NYU", "UM", "USM"}
    assert trained[1].private_hashes == {s: HASH for s in ("NYU", "UM", "USM")}
    assert [e.round for e in by_kind["round"]] == [1, 2, 3]
    assert [e.site for e in by_kind["evaluation-refused"]] == ["USM"]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["rounds"] == 3 and "test_accuracy" not in results["final"].get("USM", {})


def test_a_crash_loses_no_completed_round(tmp_path, patched_flower):
    sites = {1: "NYU", 2: "UM", 3: "USM"}
    crash = {"round": 3}
    answer = crashing(sites, crash)

    with pytest.raises(ConnectionError):
        _server(tmp_path, ScriptedGrid(sites, answer), rounds=4).run()
    before = [e.round for e in _events(tmp_path) if isinstance(e, events.Round)]
    assert before == [1]  # round 2 trained and checkpointed; its scores come with round 3
    crash["round"] = 0
    _server(tmp_path, ScriptedGrid(sites, answer), rounds=4, resume=True).run()
    rounds = [e.round for e in _events(tmp_path) if isinstance(e, events.Round)]
    assert rounds == [1, 2, 3, 4]
    rows = json.loads((tmp_path / "run" / "results.json").read_text())["rows"]
    assert sorted((r["round"], r["site"]) for r in rows) == sorted(
        (rnd, s) for rnd in range(1, 5) for s in sites.values())
    assert all(math.isfinite(r["val_loss"]) for r in rows)
