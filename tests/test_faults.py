"""Faults on a real federation on 127.0.0.1: a site killed mid-run, the server killed."""

from __future__ import annotations

import signal
from collections import Counter

import pytest
from mlflow.tracking import MlflowClient

from fedbn_med.checkpoint import load_tensors, state_hash
from fedbn_med.federation.config import ServerSettings, run_config
from fedbn_med.federation.events import Event, Joined, Rejoined, Round, Trained
from fedbn_med.federation.launcher import LocalFederation
from fedbn_med.spec import RunSpec
from fedbn_med.tracking import read_sites_per_round

from .stores import sqlite_store

pytestmark = pytest.mark.integration

SITES = ("NYU", "UM", "USM", "UCLA")


class _Stop(Exception):
    pass


def _run_config(config, tmp_path, **server):
    return run_config(config, ServerSettings(**{
        "workdir": tmp_path / "run", "tracking_uri": sqlite_store(tmp_path / "mlflow.db"),
        "federation_id": "faults", "wait_timeout": 120.0, **server}))


def _metric_steps(store, metric="test_accuracy"):
    client = MlflowClient(tracking_uri=store)
    exp = client.get_experiment_by_name("abide-fedbn")
    runs = client.search_runs([exp.experiment_id])
    parent = next(r for r in runs if r.data.tags.get("kind") == "federation")
    steps = {r.data.tags["site"]: [m.step for m in client.get_metric_history(r.info.run_id,
                                                                             metric)]
             for r in runs if r.data.tags.get("kind") == "site"}
    return parent, steps


@pytest.fixture(scope="module")
def fed(small_cohort, tmp_path_factory):
    """A SuperLink and four site processes; the tests below kill parts of it.

    The sites are forked from a site host, as the main job starts them.
    """
    with LocalFederation(tmp_path_factory.mktemp("faults")) as federation:
        federation.start_site_host(threads=1, preload=["abide"])
        federation.start_superlink()
        for site in SITES:
            federation.start_site(site, data_dir=small_cohort, device="cpu", threads=1)
        federation.wait_sites_ready(list(SITES), timeout=180)
        yield federation


def test_killed_site_misses_a_round_rejoins_with_its_own_state(fed, small_cohort, tmp_path):
    config = RunSpec(strategy="fedbn", rounds=8, sites=SITES, data_dir=small_cohort)
    events: list[Event] = []
    saved_hash = {}

    def on_event(event):
        events.append(event)
        if isinstance(event, Trained) and event.round == 2:
            # round 3 starts now: the site dies with whatever it had saved
            fed.stop_process("site-USM", sig=signal.SIGKILL)
            path = next((fed.workdir / "sites" / "faults-1").rglob("USM.safetensors"))
            tensors, meta = load_tensors(path)
            saved_hash.update(hash=state_hash(tensors), round=meta["round"])
            fed.start_site("USM", data_dir=small_cohort, device="cpu", threads=1)

    results = fed.watch(fed.submit(_run_config(config, tmp_path, **{
        "min_sites": 3, "round_timeout": 6.0, "federation_id": "faults-1"}),
        results_dir=tmp_path / "run"),
        on_event=on_event, timeout=600, results_dir=tmp_path / "run")

    assert [e.round for e in events if isinstance(e, Round)] == list(range(1, 9))
    missed = [e.round for e in events if isinstance(e, Trained) and "USM" in e.missing]
    # killed as round 3 starts: it misses round 3, or round 4 if it answered 3 first
    assert missed and missed[0] in (3, 4), events
    rejoin = [e for e in events if isinstance(e, Rejoined) and e.site == "USM"]
    assert rejoin, "the restarted site rejoined"
    assert rejoin[0].private_hash == saved_hash["hash"]
    assert rejoin[0].resumed_round == saved_hash["round"]
    assert set(results["final"]) == set(SITES), "USM is back by the last round"

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent, steps = _metric_steps(store)
    took_part = read_sites_per_round(store, parent.info.run_id)
    assert "USM" not in took_part[missed[0]]
    assert set(took_part[8]) == set(SITES)
    for site, site_steps in steps.items():
        assert len(site_steps) == len(set(site_steps)), site  # never twice the same round
    assert steps["NYU"] == list(range(1, 9))


def test_server_killed_after_round_3_resumes_without_gaps_or_duplicates(fed, small_cohort,
                                                                        tmp_path):
    config = RunSpec(strategy="fedbn", rounds=6, sites=SITES, data_dir=small_cohort)

    def crash_after_round_3(event):
        if isinstance(event, Trained) and event.round == 3:
            raise _Stop

    with pytest.raises(_Stop):
        fed.watch(fed.submit(_run_config(config, tmp_path), results_dir=tmp_path / "run"),
                  on_event=crash_after_round_3, timeout=600, results_dir=tmp_path / "run")
    fed.stop_process("superlink", sig=signal.SIGKILL)  # the ServerApp dies with it
    _, meta = load_tensors(tmp_path / "run" / "server" / "global.safetensors")
    assert meta["round"] >= 3

    fed.start_superlink()  # same address; the sites find it again by themselves
    results = fed.watch(fed.submit(_run_config(config, tmp_path, resume=True),
                                   results_dir=tmp_path / "run"),
                        timeout=600, results_dir=tmp_path / "run")

    assert results["rounds"] == 6
    parent, steps = _metric_steps(f"sqlite:///{tmp_path / 'mlflow.db'}")
    for site in SITES:
        assert steps[site] == [1, 2, 3, 4, 5, 6], (site, steps[site])
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("abide-fedbn")
    parents = [r for r in client.search_runs([exp.experiment_id])
               if r.data.tags.get("kind") == "federation"]
    assert len(parents) == 1, "the resumed run logs into the same MLflow run"
    counts = Counter(r["round"] for r in results["rows"])
    assert all(counts[r] == len(SITES) for r in range(1, 7)), counts


def test_new_site_joins_a_running_federation(fed, small_cohort, tmp_path):
    # The new site starts once round 2 is done; it takes part from round 3 or later.
    rounds = 8
    config = RunSpec(strategy="fedbn", rounds=rounds, sites=SITES[:3],
                              data_dir=small_cohort)
    fed.stop_process("site-UCLA")
    events: list[Event] = []

    def on_event(event):
        events.append(event)
        if isinstance(event, Trained) and event.round == 2:
            fed.start_site("UCLA", data_dir=small_cohort, device="cpu", threads=1)

    # until_done: the last test of the module, whose federation is stopped next
    results = fed.watch(fed.submit(_run_config(config, tmp_path, **{
        "allow_join": True, "federation_id": "join"}), results_dir=tmp_path / "run"),
        on_event=on_event, timeout=600, results_dir=tmp_path / "run", until_done=True)
    joined = [e for e in events if type(e) is Joined and e.site == "UCLA"]  # not Rejoined
    assert joined and joined[0].resumed_round == 0
    first = min(r["round"] for r in results["rows"] if r["site"] == "UCLA")
    assert first > 2
    _, steps = _metric_steps(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert steps["UCLA"] == list(range(first, rounds + 1))
    assert steps["NYU"] == list(range(1, rounds + 1))
