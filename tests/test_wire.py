"""The wire schema (fedbn_med.federation.wire): every message type round-trips, every
malformed one is refused naming its key, and the server and the site speak it alike."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from fedbn_med.federation import client_app
from fedbn_med.federation.records import Payload, pack, unpack
from fedbn_med.federation.server.checks import read_evaluate, read_query, read_train, score_names
from fedbn_med.federation.server.rounds import FederationServer
from fedbn_med.federation.wire import (
    EvaluateInstruction,
    EvaluateResult,
    SiteFacts,
    SiteState,
    TrainInstruction,
    TrainResult,
    config_round,
)

from .test_layout import import_graph

HASH = "ab" * 32
SCORES = score_names()


def _parsed(message, *tensors):  # noqa: ANN001, ANN202
    return type(message).from_payload(unpack(message.content(*tensors)))


@pytest.mark.parametrize("message", [
    TrainInstruction(round=3, local_epochs=2, evaluate_first=True, selected_round=2),
    TrainInstruction(round=1),
    TrainInstruction(),  # no round: the site trains its next one
    TrainInstruction(round=4, local_epochs=1, secagg_scale=80.0, secagg_max_norm=100.0),
    EvaluateInstruction(round=5, selected_round=3),
    TrainResult(num_examples=10.0, metrics={"train_loss": 0.5, "setups": 1.0}),
    TrainResult(num_examples=3.0, metrics={"dp_epsilon": 1.5}, evals={"val_loss": 0.6},
                state=SiteState(HASH, 2)),
    EvaluateResult({"test_auc": math.nan, "val_loss": 0.4}),
    EvaluateResult(),
], ids=lambda m: type(m).__name__)
def test_every_message_type_round_trips(message):
    tensors = ({"w": torch.ones(2, 3)},) if isinstance(message, (TrainInstruction,
                                                                 TrainResult)) else ()
    back = _parsed(message, *tensors)
    if isinstance(message, EvaluateResult):  # NaN != NaN: compare the names and the text
        assert repr(back) == repr(message)
    else:
        assert back == message


def test_site_facts_round_trip_and_read_as_the_server_reads_them():
    facts = SiteFacts("NYU", (6105,), num_train=80, resumed_round=2, private_hash=HASH,
                      device="cpu")
    assert SiteFacts.from_payload(unpack(facts.content())) == facts
    assert read_query(facts.content()) == facts
    # a site that says less: the defaults
    bare = SiteFacts.from_payload(unpack(pack(info={"site": "UM", "input-shape": [4],
                                                    "resumed-round": 0})))
    assert bare == SiteFacts("UM", (4,))


# -- malformed messages: each refused, the message naming the key ---------------------------
@pytest.mark.parametrize("config, message", [
    ({"round": "3"}, "its round '3' is not a whole number"),
    ({"round": True}, "its round True is not a whole number"),
    ({"round": 2.0}, "its round 2.0 is not a whole number"),
    ({"round": 1, "local-epochs": 1.5}, "its local-epochs 1.5 is not a whole number"),
    ({"round": 1, "local-epochs": False}, "its local-epochs False is not"),
    ({"round": 1, "evaluate-first": 1}, "its evaluate-first 1 is not true or false"),
    ({"round": 1, "selected-round": -1}, "its selected-round -1 is not a whole number from 0"),
    ({"round": 1, "selected-round": "2"}, "its selected-round '2' is not"),
    ({"round": 1, "secagg-scale": math.nan}, "its secagg-scale nan is not a positive finite"),
    ({"round": 1, "secagg-scale": -1.0}, "its secagg-scale -1.0 is not a positive finite"),
    ({"round": 1, "secagg-max-norm": math.inf}, "its secagg-max-norm inf is not"),
    ({"round": 1, "secagg-max-norm": True}, "its secagg-max-norm True is not"),
])
def test_a_malformed_train_instruction_is_refused_naming_its_key(config, message):
    with pytest.raises(ValueError) as err:
        TrainInstruction.from_payload(unpack(pack(config=config)))
    assert message in str(err.value)


@pytest.mark.parametrize("config, message", [
    ({}, "its round is missing (expected a whole number"),
    ({"round": "5"}, "its round '5' is not a whole number"),
    ({"round": False}, "its round False is not"),
    ({"round": 5, "selected-round": 1.5}, "its selected-round 1.5 is not"),
])
def test_a_malformed_evaluate_instruction_is_refused_naming_its_key(config, message):
    with pytest.raises(ValueError) as err:
        EvaluateInstruction.from_payload(unpack(pack(config=config)))
    assert message in str(err.value)


INFO = {"site": "NYU", "input-shape": [6105], "resumed-round": 0, "private-hash": HASH,
        "num-train": 80, "device": "cpu"}


@pytest.mark.parametrize("key, value, message", [
    ("site", "../x", "its site name '../x' is not 1 to 64 letters"),
    ("site", None, "its site name None is not"),
    ("input-shape", [True], "its input-shape [True] is not 1 to 8 whole numbers from 1"),
    ("input-shape", 7, "its input-shape 7 is not"),
    ("resumed-round", None, "its resumed-round is missing (expected a whole number from 0)"),
    ("resumed-round", 1.0, "its resumed-round 1.0 is not a whole number from 0"),
    ("private-hash", "x", "its private-hash 'x' is not a SHA-256 in hex"),
    ("num-train", -3, "its num-train -3 is not a whole number from 0"),
    ("num-train", True, "its num-train True is not"),
    ("device", 3, "its device 3 is not a string of at most 64 characters"),
    ("device", "d" * 65, "its device 'ddd"),
])
def test_malformed_site_facts_are_refused_naming_the_key(key, value, message):
    info = {k: v for k, v in INFO.items() if k != key}
    if value is not None:
        info[key] = value
    with pytest.raises(ValueError) as err:
        SiteFacts.from_payload(unpack(pack(info=info)))
    assert message in str(err.value) and len(str(err.value)) < 200


SOUND = {"metrics": {"num-examples": 10.0, "train_loss": 0.5},
         "eval": {"val_loss": 0.6}, "state": {"private-hash": HASH, "round": 2}}


@pytest.mark.parametrize("change, message", [
    ({"junk": {"a": 1}}, "its reply holds sections ['junk'] (a train reply holds only "
                         "metrics, eval and state)"),
    ({"metrics": {"train_loss": 0.5}}, "its metrics section lacks num-examples"),
    ({"metrics": {"num-examples": True}}, "its metric 'num-examples' (metrics) is bool, "
                                          "not a number"),
    ({"metrics": {"num-examples": 3, "train_loss": "low"}}, "its metric 'train_loss' "
                                                           "(metrics) is str"),
    ({"eval": {"val_loss": [1.0]}}, "its metric 'val_loss' (eval) is list, not a number"),
    ({"state": {"private-hash": 7, "round": 2}}, "its private-hash '7' is not a SHA-256"),
    ({"state": {"private-hash": HASH, "round": True}}, "its state round is bool, not a "
                                                       "whole number"),
    ({"state": {"private-hash": HASH, "round": 1, "x": 1}}, "its state section holds ['x'] "
                                                           "(expected only private-hash"),
])
def test_a_malformed_train_result_is_refused_naming_its_key(change, message):
    with pytest.raises(ValueError) as err:
        TrainResult.from_payload(unpack(pack(**{**SOUND, **change})))
    assert message in str(err.value)


@pytest.mark.parametrize("sections, message", [
    ({"metrics": {}, "eval": {"a": 1.0}}, "its reply holds sections ['eval'] (an evaluate reply "
                                  "holds only metrics)"),
    ({"metrics": {"val_loss": "0.5"}}, "its metric 'val_loss' (eval) is str, not a number"),
    ({"metrics": {"val_loss": False}}, "its metric 'val_loss' (eval) is bool"),
])
def test_a_malformed_evaluate_result_is_refused_naming_its_key(sections, message):
    with pytest.raises(ValueError) as err:
        EvaluateResult.from_payload(unpack(pack(**sections)))
    assert message in str(err.value)


def test_the_round_a_log_line_names_never_raises():
    assert config_round(unpack(TrainInstruction(round=4).content())) == 4
    assert config_round(unpack(pack(config={"round": "4"}))) is None
    assert config_round(Payload()) is None


# -- one schema, both sides ----------------------------------------------------------------
def _server(best: int = 2) -> FederationServer:
    server = FederationServer.__new__(FederationServer)
    server.global_weights = {"w": torch.ones(2, 3)}
    server.control = {}
    server.config = SimpleNamespace(local_epochs=2, rounds=5)  # type: ignore[assignment]
    server.recorder = SimpleNamespace(running=SimpleNamespace(best=best))  # type: ignore[assignment]
    return server


def _site(site: str = "NYU") -> SimpleNamespace:
    return SimpleNamespace(trainer=SimpleNamespace(site=site))


def test_what_the_server_sends_the_site_parses_with_the_same_types():
    server = _server()
    sent = server._instruction(3, True)
    content = server._content(sent)
    # the bytes of today: the same config entries, in the same order
    assert list(unpack(content).sections["config"].items()) == [
        ("round", 3), ("local-epochs", 2), ("evaluate-first", True), ("selected-round", 2)]
    read = client_app._instruction(_site(), TrainInstruction.from_payload, unpack(content),
                                   "a train")
    assert read == sent and torch.equal(unpack(content).tensors["w"], torch.ones(2, 3))
    closing = server._content(EvaluateInstruction(5, selected_round=2))
    assert client_app._instruction(_site(), EvaluateInstruction.from_payload,
                                   unpack(closing), "an evaluate") == EvaluateInstruction(5, 2)


def test_the_site_refuses_a_malformed_instruction_naming_itself_and_the_key():
    with pytest.raises(ValueError, match=r"Site NYU refuses an evaluate message: its round "
                                         r"'x' is not a whole number"):
        client_app._instruction(_site(), EvaluateInstruction.from_payload,
                                unpack(pack(config={"round": "x"})), "an evaluate")


def test_what_the_site_replies_the_server_reads_with_the_same_types():
    result = TrainResult(10.0, {"train_loss": 0.5, "setups": 1.0}, {"val_loss": 0.6},
                         SiteState(HASH, 3))
    content = result.content({"w": torch.ones(2, 3)})
    # the bytes of today: eval, then metrics (num-examples first), then state
    assert list(unpack(content).sections) == ["eval", "metrics", "state"]
    read = read_train(content, "NYU", SCORES)
    assert read.update.num_examples == 10.0 and read.private_hash == HASH
    assert read.fits == {"num_examples": 10.0, "train_loss": 0.5, "setups": 1.0}
    assert read.evals == {"val_loss": 0.6}
    assert read_evaluate(EvaluateResult({"test_auc": 0.7}).content(), SCORES) == {
        "test_auc": 0.7}


def test_the_wire_module_imports_neither_the_server_nor_the_client_app():
    imported = import_graph(in_functions=True)["fedbn_med.federation.wire"]
    assert not {m for m in imported if m.startswith(("fedbn_med.federation.server",
                                                     "fedbn_med.federation.client_app"))}
