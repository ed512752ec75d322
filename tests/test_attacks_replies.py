"""A dishonest site with its own valid key attacks the server through its replies.

One federation with TLS and node authentication (the consortium set-up), honest NYU and
UM, and USM: a real node process holding USM's registered key, which trains honestly and
then tampers with its reply, one attack per round (see :data:`ATTACKS`). Every attack
must be refused, or bounded, with a logged reason naming USM, while the rounds go on and
nothing of what USM sent is stored.

Run as a script (``python tests/test_attacks_replies.py NODE-ARGS...``), this file is
that dishonest node: the real node (:mod:`fedbn_med.federation.node`) with its ClientApp
wrapped here, in the test suite, so nothing in the package can turn an attack on.
"""

from __future__ import annotations

import json
import logging
import math
import signal
import sys
from pathlib import Path

import pytest

from fedbn_med.federation.events import EvaluationRefused, Trained, UpdateRefused

pytestmark = pytest.mark.integration

#: Round -> the attack the dishonest site makes in that round's train reply.
ATTACKS = {
    1: "claims 10^9 training examples",
    2: "sends a weight as int64 values of 10^12",
    3: "sends a tensor layout with dims [-1, -1]",
    4: "sends 5,000 metric names",
    5: "scores test_auc = 1e308",
    6: "is honest",
}
ROUNDS = len(ATTACKS)
#: Metric names of the flood (the issue sent 52,000; any count over the bound shows it,
#: and fewer keep the test quick; tests/test_reply_checks.py refuses 52,000 as well).
FLOOD = 5_000
#: The final evaluation's attack (a NaN accuracy; train_loss = -inf and other values
#: outside their ranges are refused in tests/test_reply_checks.py).
FINAL = ("test_accuracy", math.nan)


# --------------------------------------------------------------- the dishonest node
def _tamper(record, rnd: int) -> None:  # noqa: ANN001 - a Flower ConfigRecord
    import torch
    from flwr.app import RecordDict

    from fedbn_med.federation.records import RECORD, pack, unpack

    if rnd == 1:
        record["metrics/num-examples"] = 1e9
    elif rnd == 2:
        tensors = dict(unpack(RecordDict({RECORD: record})).tensors)
        key = next(k for k, v in tensors.items() if v.dtype.is_floating_point and v.dim() == 2)
        tensors[key] = torch.full(tensors[key].shape, 10**12, dtype=torch.int64)
        fresh = pack(tensors).config_records[RECORD]
        for name in [k for k in record if k.startswith("tensors/")]:
            record[name] = fresh[name]
    elif rnd == 3:
        record["tensors/float-keys"] = [record["tensors/float-keys"][0]]
        record["tensors/int-keys"] = []
        record["tensors/ndims"] = [2]
        record["tensors/dims"] = [-1, -1]
        record["tensors/float"] = b"\0\0\x80\x3f"
        record["tensors/int"] = b""
    elif rnd == 4:
        for i in range(FLOOD):
            record[f"metrics/m{i:05d}"] = 1.0
    elif rnd == 5:
        record["eval/test_auc"] = 1e308


def _dishonest(honest):  # noqa: ANN001, ANN202 - a ClientApp
    from fedbn_med.federation.records import RECORD

    log = logging.getLogger("dishonest_node")

    def app(message, context):  # noqa: ANN001, ANN202
        reply = honest(message=message, context=context)
        record = reply.content.config_records[RECORD]
        if message.metadata.message_type == "train":
            rnd = int(message.content.config_records[RECORD]["config/round"])
            log.warning("dishonest node, round %d: it %s", rnd, ATTACKS.get(rnd, "is honest"))
            _tamper(record, rnd)
        elif message.metadata.message_type == "evaluate":
            record[f"metrics/{FINAL[0]}"] = FINAL[1]
        return reply

    return app


# --------------------------------------------------------------------------- the test
@pytest.fixture(scope="module")
def attacked(small_cohort, tmp_path_factory):
    """One keyed federation of NYU, UM and the dishonest USM, and its finished run."""
    from fedbn_med.federation.launcher.processes import terminate_tree
    from fedbn_med.spec import RunSpec

    from .keyed import keyed_federation, run_federation, start_honest, start_wrapped

    root = tmp_path_factory.mktemp("attacks")
    names = ("NYU", "UM", "USM")
    with keyed_federation(root, names) as c:
        usm = start_wrapped(c, Path(__file__), "USM", small_cohort)
        try:
            start_honest(c, ("NYU", "UM"), small_cohort)
            c.fed.wait_sites_ready(["NYU", "UM"], timeout=180)
            spec = RunSpec(strategy="fedbn", rounds=ROUNDS, sites=names, data_dir=small_cohort)
            results, events, settings = run_federation(c, "attacked", spec, timeout=400,
                                                       wait_timeout=120.0)
            yield {"results": results, "events": events, "root": root,
                   "workdir": settings.workdir}
        finally:
            terminate_tree(usm.pid, signal.SIGTERM, 10.0)


def _refused(attacked) -> dict[int, str]:
    return {e.round: e.reason for e in attacked["events"]
            if isinstance(e, UpdateRefused) and e.site == "USM"}


def _trained(attacked) -> dict[int, Trained]:
    return {e.round: e for e in attacked["events"] if isinstance(e, Trained)}


def test_every_round_goes_on_and_only_the_attacks_are_refused(attacked):
    assert "error" not in attacked["results"], attacked["results"]
    trained = _trained(attacked)
    assert sorted(trained) == list(range(1, ROUNDS + 1))
    assert set(_refused(attacked)) == {2, 3, 4, 5}
    for rnd, event in trained.items():
        want = ["NYU", "UM", "USM"] if rnd in (1, ROUNDS) else ["NYU", "UM"]
        assert event.sites == want, (rnd, event)
    assert set(attacked["results"]["final"]) >= {"NYU", "UM"}
    assert f"dishonest node, round {ROUNDS}" in (attacked["root"] / "USM.log").read_text()


def test_a_claimed_count_of_10_9_weighs_at_most_half(attacked):
    # item 2: in hospital mode no site outweighs the others together, whatever it claims
    shares = _trained(attacked)[1].shares
    assert set(shares) == {"NYU", "UM", "USM"}
    assert shares["USM"] == pytest.approx(0.5)
    assert shares["NYU"] + shares["UM"] == pytest.approx(0.5)


def test_an_int64_weight_is_refused_by_its_dtype(attacked):
    # item 3: every tensor's dtype is the global's
    assert "is torch.int64, expected torch.float32" in _refused(attacked)[2]


def test_a_reply_that_cannot_be_decoded_refuses_that_reply_only(attacked):
    # item 4: dims [-1, -1] made reshape raise and ended the run on the server
    reason = _refused(attacked)[3]
    assert "tensor layout 'dims' must be a list of whole numbers >= 0" in reason


def test_a_flood_of_metric_names_is_refused_and_never_stored(attacked):
    # item 5: only the task's metrics, a bounded count
    assert f"its metrics section holds {FLOOD + 3} metrics (at most 64" in _refused(attacked)[4]
    workdir = attacked["workdir"]
    assert (workdir / "progress.jsonl").stat().st_size < 200_000
    assert (workdir / "server" / "global.safetensors").stat().st_size < 2_000_000
    assert "m00001" not in (workdir / "progress.jsonl").read_text()
    assert "m00001" not in (workdir / "results.json").read_text()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{attacked['root'] / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("abide-fedbn")
    runs = client.search_runs([experiment.experiment_id])
    names = {name for run in runs for name in run.data.metrics}
    assert names and not any(n.startswith("m0") for n in names), sorted(names)[:10]


def test_metric_values_outside_their_range_are_refused(attacked):
    # item 6: finite and in range, or refused; the parent run's means stay scores
    refused = _refused(attacked)
    assert "its metric 'test_auc' (eval) is 1e+308 (expected a finite number from 0 to 1" \
        in refused[5]
    final = [e for e in attacked["events"] if isinstance(e, EvaluationRefused)]
    assert [e.site for e in final] == ["USM"]
    assert "its metric 'test_accuracy' (eval) is nan" in final[0].reason
    assert "test_accuracy" not in attacked["results"]["final"].get("USM", {})
    rows = attacked["results"]["rows"]
    for row in rows:
        for key, value in row.items():
            if key.endswith("_n"):  # a split's size: a whole number the server checked
                assert value >= 1 and float(value).is_integer(), (row["site"], key, value)
            elif key.startswith(("test_", "val_")) and not key.endswith("loss"):
                assert math.isnan(value) or 0.0 <= value <= 1.0, (row["site"], key, value)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{attacked['root'] / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("abide-fedbn")
    (parent,) = client.search_runs([experiment.experiment_id], "tags.kind = 'federation'")
    for step in client.get_metric_history(parent.info.run_id, "mean_test_auc"):
        assert 0.0 <= step.value <= 1.0, step
    assert json.loads((attacked["workdir"] / "results.json").read_text())["rounds"] == ROUNDS


if __name__ == "__main__":
    from keyed import preload_task  # this file's folder, tests/, is on sys.path

    from fedbn_med.federation import client_app
    from fedbn_med.federation.node import main

    preload_task()
    client_app.app = _dishonest(client_app.app)
    main(sys.argv[1:])
