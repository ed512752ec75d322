"""Integration tests: a real Flower SuperLink and one site process per site on 127.0.0.1."""

from __future__ import annotations

import time

import psutil
import pytest
import torch
from mlflow.tracking import MlflowClient

from fedbn_med.checkpoint import load_tensors
from fedbn_med.federation.config import ServerSettings, run_config
from fedbn_med.federation.events import Event, Round, SiteRefused, Trained, read_events
from fedbn_med.federation.launcher import FederationError, LocalFederation, free_port
from fedbn_med.federation.run import run_site
from fedbn_med.fl.scaffold import split_controls
from fedbn_med.spec import RunSpec
from fedbn_med.training.inprocess import build_federation

from .stores import sqlite_store
from .test_privacy import (
    check_no_clean_update_left_the_site,
    check_no_private_tensor_left_the_site,
)
from .wiretap import Wiretap

pytestmark = pytest.mark.integration

SITES = ("NYU", "UM")


@pytest.fixture(scope="module")
def federation(small_cohort, tmp_path_factory):
    """A SuperLink and two site processes, shared by the runs of this module.

    Site NYU dials the SuperLink through a relay that records every byte it sends
    (``fed.wiretap``), so the privacy test can read what crossed the wire.
    """
    workdir = tmp_path_factory.mktemp("federation")
    # A test worker may hold processes of its own from earlier test files (such as
    # multiprocessing's resource tracker); only those started from here on must go.
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with LocalFederation(workdir) as fed:
        fed.start_superlink()
        fed.wiretap = Wiretap(fed.port)
        fed.start_site("NYU", data_dir=small_cohort, device="cpu", threads=1,
                       superlink=f"127.0.0.1:{fed.wiretap.port}")
        fed.start_site("UM", data_dir=small_cohort, device="cpu", threads=1)
        fed.wait_sites_ready(list(SITES), timeout=180)
        yield fed
        fed.wiretap.close()
    # every process the federation started is gone, children included
    started = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    for proc in started:
        assert proc.status() == psutil.STATUS_ZOMBIE, proc.cmdline()


def _submit(fed, config, tmp_path, **server):
    rc = run_config(config, ServerSettings(**{
        "workdir": tmp_path, "tracking_uri": sqlite_store(tmp_path / "mlflow.db"),
        "federation_id": tmp_path.name, "wait_timeout": 60.0, **server}))
    run = fed.submit(rc, results_dir=tmp_path)
    events: list[Event] = []
    return fed.watch(run, on_event=events.append, timeout=300, results_dir=tmp_path,
                     until_done=True), events


def test_flower_run_matches_in_process_driver_and_is_tracked(federation, small_cohort, tmp_path):
    config = RunSpec(strategy="fedbn", rounds=3, sites=SITES, data_dir=small_cohort,
                              device="cpu")
    result, events = _submit(federation, config, tmp_path)
    # one exchange with the sites a round: train (with the previous round's scores)
    assert [e.exchanges for e in events if isinstance(e, Trained)] == [1, 1, 1]

    torch.set_num_threads(1)
    reference = build_federation(config).run().final()
    assert list(result["final"]) == list(SITES)
    for site in SITES:
        got, want = result["final"][site], reference[site]
        for key in ("test_accuracy", "test_auc", "val_accuracy", "test_loss", "train_loss"):
            assert got[key] == pytest.approx(want[key], abs=1e-4), (site, key)
        assert got["num_examples"] == want["num_examples"]
    # data loading and model set-up happened once per site, not once per round
    assert all(r["setups"] == 1 for r in result["rows"])
    assert [e.round for e in events if isinstance(e, Round)] == [1, 2, 3]

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("abide-fedbn")
    runs = client.search_runs([exp.experiment_id])
    parent = [r for r in runs if r.data.tags.get("kind") == "federation"]
    site_runs = {r.data.tags["site"]: r for r in runs if r.data.tags.get("kind") == "site"}
    assert len(parent) == 1 and set(site_runs) == set(SITES)
    assert parent[0].data.params["strategy"] == "fedbn"
    for site, run in site_runs.items():
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "test_accuracy")]
        assert steps == [1, 2, 3], site
    artifacts = {a.path for a in client.list_artifacts(parent[0].info.run_id)}
    assert {"results.md", "convergence.png", "model"} <= artifacts
    note = parent[0].data.tags["mlflow.note.content"]  # what the table says, then the table
    assert note.startswith("Round ") and sorted(filter(None, note.splitlines())) == sorted(
        filter(None, result["table"].replace("<", "\\<").splitlines()))  # markdown

    # Privacy boundary: what NYU sent during this run holds no BN tensor of NYU.
    check_no_private_tensor_left_the_site(bytes(federation.wiretap.sent), config, "NYU",
                                          tmp_path, tmp_path / "artifacts")


def test_the_saved_selected_model_is_the_model_the_result_scores(federation, small_cohort,
                                                                  tmp_path):
    """The selected round's shared weights (server) with each site's private layers of that
    round (kept at the site) score, at the site, what the results table reports."""
    from fedbn_med.tasks.abide.build import build_site

    config = RunSpec(strategy="fedbn", rounds=5, sites=SITES, data_dir=small_cohort,
                     device="cpu")
    result, _ = _submit(federation, config, tmp_path)
    chosen = result["selected_round"]
    shared, meta = load_tensors(tmp_path / "server" / "selected.safetensors")
    assert meta["round"] == chosen
    in_process = build_federation(config).run()  # the same run in process: the same weights
    assert in_process.selected_round == chosen
    for key, tensor in in_process.selected_weights.items():
        assert torch.equal(shared[key], tensor), key
    torch.set_num_threads(1)
    for site in SITES:
        (kept,) = federation.workdir.rglob(f"{tmp_path.name}/{site}.round-{chosen}.safetensors")
        others = sorted(p.name for p in kept.parent.glob(f"{site}.round-*.safetensors"))
        assert len(others) <= 2  # the selected round's and the last round's, no more
        trainer = build_site(site, config, small_cohort, "cpu")
        trainer.load_kept(load_tensors(kept)[0])
        scores = trainer.score(shared)
        for name in ("test_accuracy", "test_auc", "val_loss"):
            assert scores[name] == pytest.approx(result["selected"][site][name], abs=1e-4), \
                (site, name)
    if chosen != config.rounds:
        client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
        (parent,) = [r for r in client.search_runs(
            [client.get_experiment_by_name("abide-fedbn").experiment_id])
            if r.data.tags.get("kind") == "federation"]
        assert [a.path for a in client.list_artifacts(parent.info.run_id, "model/selected")] \
            == ["model/selected/shared_weights.safetensors"]
        assert f"the shared weights of the selected round {chosen} (model/selected)" in \
            result["table"]


def test_fedbn_scaffold_over_flower_matches_in_process_driver(federation, small_cohort,
                                                             tmp_path):
    config = RunSpec(strategy="fedbn-scaffold", rounds=3, sites=SITES, data_dir=small_cohort,
                     device="cpu")
    result, _ = _submit(federation, config, tmp_path)

    torch.set_num_threads(1)
    reference = build_federation(config).run().final()
    for site in SITES:
        for key in ("test_accuracy", "test_auc", "val_accuracy", "test_loss", "train_loss"):
            assert result["final"][site][key] == pytest.approx(reference[site][key],
                                                               abs=1e-4), (site, key)
    # the server's variate went into its checkpoint, beside the shared weights only
    ckpt, _ = load_tensors(tmp_path / "server" / "global.safetensors")
    weights, control = split_controls(ckpt)
    assert control and set(control) <= set(weights)


def test_dp_site_never_sends_its_clean_update(federation, small_cohort, tmp_path):
    config = RunSpec(strategy="fedbn", rounds=2, sites=SITES, data_dir=small_cohort,
                     device="cpu", dp_clip=1.0, dp_noise=1.0, dp_delta=1e-5)
    with federation.wiretap.lock:  # only what NYU sends during this run
        federation.wiretap.sent.clear()
    result, _ = _submit(federation, config, tmp_path)

    check_no_clean_update_left_the_site(bytes(federation.wiretap.sent), config, "NYU")
    spent = config.privacy().epsilon(2)
    assert result["final"]["NYU"]["dp_epsilon"] == pytest.approx(spent)
    assert "epsilon" in result["table"]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = next(r for r in client.search_runs(
        [client.get_experiment_by_name("abide-fedbn").experiment_id])
        if r.data.tags.get("site") == "NYU")
    history = client.get_metric_history(run.info.run_id, "dp_epsilon")
    assert [m.step for m in history] == [1, 2] and history[-1].value == pytest.approx(spent)


def test_site_with_other_feature_dimension_is_refused(federation, small_cohort, tmp_path):
    config = RunSpec(strategy="fedbn", rounds=1, sites=SITES, data_dir=small_cohort)
    with pytest.raises(FederationError, match=r"Missing sites: NYU, UM"):
        _submit(federation, config, tmp_path, **{"input_shape": (5995,), "wait_timeout": 5.0})
    events = read_events(tmp_path / "progress.jsonl")
    reasons = [e.reason for e in events if isinstance(e, SiteRefused)]
    assert any("shape (N, 6105)" in r and "takes (N, 5995)" in r for r in reasons)


def test_site_that_cannot_reach_the_server_fails_after_a_bounded_wait(tmp_path):
    port = free_port()
    started = time.monotonic()
    # the bound is the test's to choose: a short one shows it as well as a long one
    with pytest.raises(ConnectionError, match=rf"could not reach the federation server at "
                                              rf"127.0.0.1:{port} within 1 s"):
        run_site("UCLA", f"127.0.0.1:{port}", state_dir=tmp_path, max_wait_time=1.0)
    assert time.monotonic() - started < 60


def test_remote_server_without_tls_is_refused(tmp_path):
    with pytest.raises(ValueError, match="must use TLS"):
        run_site("UCLA", "fl.hospital.example:9092", state_dir=tmp_path)

