"""Secure aggregation (SecAgg+): the site's checks, the server's checks on the sum, and
real federations (a SuperLink and site processes on 127.0.0.1) with BN kept local."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Context, Message, MessageType, Metadata, RecordDict
from flwr.app.message import make_message
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage

from fedbn_med.checkpoint import load_tensors
from fedbn_med.federation.config import NodeSettings, ServerSettings, run_config
from fedbn_med.federation.events import Event, Round, Trained, UpdateRefused
from fedbn_med.federation.launcher import LocalFederation
from fedbn_med.federation.secagg import check_outgoing, secagg_gate
from fedbn_med.federation.server.secagg import sum_reason, threshold
from fedbn_med.spec import RunSpec
from fedbn_med.tasks.abide.build import build_trainer
from fedbn_med.tasks.abide.sites import load_sites
from fedbn_med.training.inprocess import build_federation

from .keyed import stop_nodes
from .stores import sqlite_store
from .test_privacy import check_no_clean_update_left_the_site
from .wiretap import Wiretap

FAULTY_NODE = Path(__file__).with_name("faulty_node.py")
SITES = ("NYU", "UM", "USM")


# -- the site's checks of what it masks ------------------------------------------------------
def _weights(**values: float) -> dict[str, torch.Tensor]:
    return {k: torch.full((2, 3), v) for k, v in values.items()}


@pytest.mark.parametrize("sent, match", [
    ({**_weights(a=0.1, b=0.2), "bn.running_mean": torch.zeros(3)}, "private keys"),
    (_weights(a=0.1), "keys differ"),
    ({"a": torch.zeros(2, 3, dtype=torch.int64), "b": torch.zeros(2, 3)}, "not floating point"),
    ({"a": torch.zeros(3, 2), "b": torch.zeros(2, 3)}, "has shape"),
    (_weights(a=float("nan"), b=0.0), "NaN or Inf"),
    (_weights(a=9.0, b=0.0), "beyond the quantisation range"),
    (_weights(a=7.0, b=-7.0), "update norm"),
])
def test_a_site_refuses_to_mask_an_update_an_honest_site_does_not_send(sent, match):
    received = _weights(a=0.0, b=0.0)
    with pytest.raises(ValueError, match=f"Site NYU refuses to send its update under SecAgg: "
                                         f".*{match}"):
        check_outgoing("NYU", sent, received, ["bn.running_mean"], clip=8.0, max_norm=10.0)
    check_outgoing("NYU", _weights(a=0.5, b=-0.5), received, ["bn.running_mean"], clip=8.0,
                   max_norm=10.0)


def _secagg_message(stage: str, group: str = "", **configs: int) -> Message:
    content = RecordDict({RECORD_KEY_CONFIGS: ConfigRecord({Key.STAGE: stage, **configs})})
    metadata = Metadata(run_id=1, message_id="", src_node_id=0, dst_node_id=1,
                        message_type=MessageType.TRAIN, group_id=group, ttl=60.0,
                        reply_to_message_id="", created_at=time.time())
    return make_message(metadata=metadata, content=content)


def _context(tmp_path: Path, secagg: bool) -> Context:
    node = NodeSettings(site="NYU", state_dir=tmp_path, secagg=secagg)
    return Context(run_id=1, node_id=1, node_config=node.to_node_config(),  # type: ignore[arg-type]
                   state=RecordDict(), run_config={})


def test_a_site_takes_part_in_secagg_only_when_its_policy_allows_it(tmp_path):
    def never(msg, ctx):  # noqa: ANN001, ANN202
        raise AssertionError("the site's handler must not run")

    msg = _secagg_message(Stage.SETUP, **{Key.SAMPLE_NUMBER: 3, Key.THRESHOLD: 2})
    with pytest.raises(PermissionError, match="Site NYU refuses secure aggregation: its "
                                              "policy does not allow it"):
        secagg_gate(msg, _context(tmp_path, secagg=False), never)
    for sites, needed in ((1, 1), (4, 2), (5, 2)):
        low = _secagg_message(Stage.SETUP, **{Key.SAMPLE_NUMBER: sites, Key.THRESHOLD: needed})
        with pytest.raises(PermissionError, match=f"refuses a SecAgg\\+ round of {sites} sites "
                                                  f"with a reconstruction threshold of {needed}"):
            secagg_gate(low, _context(tmp_path, secagg=True), never)


def test_node_and_server_settings_validate_secagg():
    with pytest.raises(ValueError, match="secagg must be true or false, got 'yes'"):
        NodeSettings(site="NYU", state_dir=Path("/tmp"), secagg="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="secagg_clip must be a positive number, got -1"):
        ServerSettings(workdir=Path("/tmp"), secagg=True, secagg_clip=-1)
    assert [threshold(n) for n in (2, 3, 4, 5)] == [2, 2, 3, 3]


# -- the server's checks of the unmasked sum ------------------------------------------------
def _sum(updates: list[dict[str, torch.Tensor]], counts: list[int], scale: float
         ) -> list[np.ndarray]:
    # what Flower's workflow hands over: the sum of the sites' vectors over their number
    keys = sorted(updates[0])
    vectors = [[u[k].double().numpy() * n / scale for k in keys] + [np.array([n / scale])]
               for u, n in zip(updates, counts)]
    return [sum(parts) / len(updates) for parts in zip(*vectors)]


def test_the_server_averages_the_unmasked_sum_and_checks_its_bounds():
    reference = _weights(a=0.0, b=0.0)
    updates = [_weights(a=1.0, b=2.0), _weights(a=3.0, b=-1.0)]
    mean = _sum(updates, [100, 300], 300.0)
    average, why = sum_reason(mean, 2, reference, 400, 300.0, clip=8.0, max_norm=100.0)
    assert why == "" and average is not None
    assert torch.allclose(average["a"], torch.full((2, 3), 2.5))
    assert torch.allclose(average["b"], torch.full((2, 3), -0.25))
    # a site that weighed itself 300 where 100 was registered shows in the total
    assert "its total weight is 600.0 but the contributing sites' counts sum to 400" in \
        sum_reason(_sum(updates, [300, 300], 300.0), 2, reference, 400, 300.0, 8.0, 100.0)[1]
    assert "exceeds the bound 1" in sum_reason(mean, 2, reference, 400, 300.0, 8.0, 1.0)[1]
    assert "layout" in sum_reason(mean[1:], 2, reference, 400, 300.0, 8.0, 100.0)[1]
    mean[0][0, 0] = np.inf
    assert "NaN or Inf" in sum_reason(mean, 2, reference, 400, 300.0, 8.0, 100.0)[1]


# -- real federations ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def federation(small_cohort, tmp_path_factory):
    """A SuperLink, three honest sites that accept SecAgg (NYU through a wiretap), and UCLA,
    a real node that dies in the middle of round 2 of a SecAgg federation."""
    workdir = tmp_path_factory.mktemp("secagg")
    with LocalFederation(workdir) as fed:
        fed.start_superlink()
        cmd = fed.node_command("UCLA", workdir / "sites", small_cohort, "cpu", secagg=True)
        log = workdir / "UCLA.log"
        with open(log, "ab") as out:
            dying = subprocess.Popen(
                [sys.executable, str(FAULTY_NODE), "dies-in-secagg", *cmd[3:]], stdout=out,
                stderr=subprocess.STDOUT, env={**fed.env, "OMP_NUM_THREADS": "1"},
                start_new_session=True)
        try:
            fed.wiretap = Wiretap(fed.port)
            fed.start_site("NYU", data_dir=small_cohort, device="cpu", threads=1,
                           superlink=f"127.0.0.1:{fed.wiretap.port}", secagg=True)
            for site in SITES[1:]:
                fed.start_site(site, data_dir=small_cohort, device="cpu", threads=1,
                               secagg=True)
            fed.wait_sites_ready(list(SITES), timeout=180)
            deadline = time.monotonic() + 120
            while "connected to" not in log.read_text() and time.monotonic() < deadline:
                time.sleep(0.5)
            yield fed
        finally:
            fed.wiretap.close()
            if dying.poll() is None:
                stop_nodes([dying], grace=2.0)


def _submit(fed, config, tmp_path, **server):
    rc = run_config(config, ServerSettings(**{
        "workdir": tmp_path, "tracking_uri": sqlite_store(tmp_path / "mlflow.db"),
        "federation_id": tmp_path.name, "wait_timeout": 60.0, **server}))
    run = fed.submit(rc, results_dir=tmp_path)
    events: list[Event] = []
    return fed.watch(run, on_event=events.append, timeout=240, results_dir=tmp_path,
                     until_done=True), events


@pytest.mark.integration
def test_secagg_fedbn_reaches_the_plain_fedbn_model_from_masked_vectors_only(
        federation, small_cohort, tmp_path):
    # One round: the models differ by the quantisation of SecAgg+ alone (later rounds
    # train on top of it). The round with scores first runs in the drop-out test.
    config = RunSpec(strategy="fedbn", rounds=1, sites=SITES, data_dir=small_cohort,
                     device="cpu")
    with federation.wiretap.lock:  # only what NYU sends during the SecAgg run
        federation.wiretap.sent.clear()
    result, events = _submit(federation, config, tmp_path, secagg=True)
    wire = bytes(federation.wiretap.sent)

    assert "error" not in result, result
    trained = [e for e in events if isinstance(e, Trained)]
    assert [e.sites for e in trained] == [list(SITES)]
    assert trained[0].exchanges == 4  # SecAgg+'s four stages, one exchange each
    assert trained[0].shares == {} and trained[0].norms == {}  # no one update seen
    torch.set_num_threads(1)
    plain = build_federation(config).run().global_weights  # plain FedBN, the in-process driver
    secure, _ = load_tensors(tmp_path / "server" / "global.safetensors")
    assert set(secure) == set(plain)
    for key in plain:  # 2**22 levels over +-8, three sites: a few 1e-6 at most
        torch.testing.assert_close(secure[key], plain[key], atol=2e-5, rtol=0)
    assert not torch.equal(secure["net.0.weight"], plain["net.0.weight"])

    # On the wire from NYU: SecAgg+ messages and a masked vector (8 bytes a value, more
    # than the update), never its clean update, never a BN key.
    assert b"secaggplus" in wire
    check_no_clean_update_left_the_site(wire, config, "NYU")
    trainer = build_trainer(load_sites(["NYU"])["NYU"], config, device="cpu")
    assert trainer.partition.private
    for key in trainer.partition.private:
        assert key.encode() not in wire, f"BN key {key} crossed the wire"


@pytest.mark.integration
def test_a_site_dropping_out_mid_round_leaves_the_sum_of_the_others(
        federation, small_cohort, tmp_path):
    config = RunSpec(strategy="fedbn", rounds=2, sites=(*SITES, "UCLA"), data_dir=small_cohort,
                     device="cpu")
    result, events = _submit(federation, config, tmp_path, secagg=True, round_timeout=10.0)

    assert "error" not in result, result
    trained = [e for e in events if isinstance(e, Trained)]
    assert [e.sites for e in trained] == [sorted((*SITES, "UCLA")), sorted(SITES)]
    assert trained[1].missing == ["UCLA"]
    assert [e.exchanges for e in trained] == [4, 4]  # SecAgg+'s four stages, every round
    # the masks of UCLA were removed from its shares: the sum's total weight matched the
    # three sites' counts, and nothing was refused
    assert not [e for e in events if isinstance(e, UpdateRefused)], events
    weights, _ = load_tensors(tmp_path / "server" / "global.safetensors")
    assert all(bool(torch.isfinite(v).all()) and float(v.abs().max()) < 8 for v in
               weights.values())


def test_secagg_needs_the_flower_engine(capsys):
    from fedbn_med.cli import main

    assert main(["--secagg", "--engine", "inprocess", "--rounds", "1", "--quiet"]) == 2
    assert "--secagg aggregates over Flower; got --engine inprocess" in capsys.readouterr().err


def test_the_site_console_says_what_left_in_each_secagg_stage():
    from fedbn_med.federation.records import pack
    from fedbn_med.federation.site_console import SiteConsole

    lines: list[str] = []
    console = SiteConsole("NYU", lines.append)
    setup = _secagg_message(Stage.SETUP, "7", **{Key.SAMPLE_NUMBER: 3, Key.THRESHOLD: 2})
    for key in (Key.PUBLIC_KEY_1, Key.CIPHERTEXT_LIST, Key.SHARE_LIST):
        keys = RecordDict({RECORD_KEY_CONFIGS: ConfigRecord({key: b"k"})})
        console.answered(setup, Message(keys, reply_to=setup))
    masked = pack(metrics={"num-examples": 10.0})
    masked[RECORD_KEY_CONFIGS] = ConfigRecord({Key.MASKED_PARAMETERS: [b"m"]})
    console.answered(setup, Message(masked, reply_to=setup))
    assert lines[:3] == [
        "[NYU] round 7: SecAgg+ setup: sent its public keys",
        "[NYU] round 7: SecAgg+ key sharing: sent its secrets' shares, encrypted for each "
        "other site",
        "[NYU] round 7: SecAgg+ unmasking: sent the shares that remove the masks of the "
        "round's sum"]
    assert "sent 0 tensors (0 B) and its update masked (SecAgg+" in lines[3]
    odd = _secagg_message(Stage.SETUP, "\x1b[2J1", **{Key.SAMPLE_NUMBER: 3, Key.THRESHOLD: 2})
    console.answered(odd, Message(RecordDict({RECORD_KEY_CONFIGS: ConfigRecord(
        {Key.PUBLIC_KEY_1: b"k"})}), reply_to=odd))
    assert lines[4] == "[NYU] round ?: SecAgg+ setup: sent its public keys"  # never printed


@pytest.fixture(scope="module")
def keyed(small_cohort, tmp_path_factory):
    """Hospital mode: TLS, node authentication, three sites that accept SecAgg."""
    from .keyed import keyed_federation

    root = tmp_path_factory.mktemp("keyed-secagg")
    with keyed_federation(root, list(SITES)) as c:
        for site in SITES:
            c.fed.start_site(site, data_dir=small_cohort, device="cpu", threads=1,
                             auth_key=c.keys.site_keys[site][0], secagg=True)
        c.fed.wait_sites_ready(list(SITES), timeout=180)
        yield c


@pytest.mark.integration
def test_hospital_mode_secagg_checks_the_sum_against_the_registered_counts(keyed,
                                                                          small_cohort):
    from .keyed import run_federation

    spec = RunSpec(strategy="fedbn", rounds=1, sites=SITES, data_dir=small_cohort)
    # no counts registered: the sum's weight is checked against what the sites reported
    results, events, _ = run_federation(keyed, "claimed", spec, timeout=180, secagg=True)
    assert "error" not in results, results
    (row,) = [e for e in events if isinstance(e, Round)]
    counts = {site: int(row.sites[site]["num_examples"]) for site in SITES}
    # the smallest site weighs itself with its own count, 50 more than the consortium
    # registered (the largest would refuse: its count is above the round's scale)
    liar = min(counts, key=counts.__getitem__)
    registered = {**counts, liar: counts[liar] - 50}
    results, events, _ = run_federation(keyed, "registered", spec, timeout=180, secagg=True,
                                        registered_counts=registered)
    assert "error" in results
    refused = [e.reason for e in events if isinstance(e, UpdateRefused)]
    expected = sum(registered.values())
    assert len(refused) == len(SITES) and all(
        f"the round's SecAgg sum is refused: its total weight is {expected + 50}" in r
        for r in refused), refused
