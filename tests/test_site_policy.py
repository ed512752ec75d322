"""A site's own policy and files, through the real readers: what the server cannot change.

Site files (``split_seed``, ``dp_noise``, ``dp_epsilon_max``, ``max_scores_per_run``),
the site's state file and privacy ledger, and the run config a site reads.
"""

from __future__ import annotations

import json

import pytest
import torch

from fedbn_med.checkpoint import load_tensors, save_tensors
from fedbn_med.federation.client_app import SiteRuntime, bounded
from fedbn_med.federation.config import (
    ServerSettings,
    read_run_config,
    read_site_config,
    run_config,
    seal_run_config,
)
from fedbn_med.fl.privacy import PrivacyLedger, UpdatePrivacy, epsilon
from fedbn_med.fl.registry import get_strategy
from fedbn_med.spec import RUN_CONFIG_KEY, RunSpec
from fedbn_med.tasks.abide.model import AbideMLP
from fedbn_med.tasks.abide.sites import load_site
from fedbn_med.tasks.site_toml import DEFAULT_MAX_SCORES, site_policy
from fedbn_med.training.trainer import SiteData, SiteTrainer


def _write(folder, text):
    path = folder / "UCLA.toml"
    path.write_text('abide_site_ids = ["UCLA_1"]\n' + text)
    return path


@pytest.mark.parametrize("text, message", [
    ("split_seed = 9223372036854775807\n",
     r"UCLA.toml: 'split_seed' must be an integer from 0 to 2\*\*32 - 1 \(4294967295\), "
     r"got 9223372036854775807"),
    ("dp_noise = 1e308\ndp_clip = 1.0\n",
     r"UCLA.toml: dp_noise must be a noise multiplier from 0 to 1e\+06, got 1e\+308"),
])
def test_site_file_values_out_of_range_name_the_file(tmp_path, text, message):
    path = _write(tmp_path, text)
    with pytest.raises(ValueError, match=message) as err:
        load_site("UCLA", tmp_path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("text, message", [
    ("dp_epsilon_max = -1\n", r"'dp_epsilon_max' must be a positive finite number .*got -1"),
    ("dp_epsilon_max = inf\n", r"'dp_epsilon_max' must be a positive finite number .*got inf"),
    ("max_scores_per_run = 2.5\n", r"'max_scores_per_run' must be an integer from 0 to "
                                   r"1000000, got 2.5"),
    ("max_message_mb = 0\n", r"'max_message_mb' must be a number of MiB from 1 to 65536 "
                             r"\(the largest message from the server this site downloads\), "
                             r"got 0"),
    ("message_timeout_s = true\n", r"'message_timeout_s' must be a number of seconds from "
                                   r"0.5 to 3600, got True"),
])
def test_site_policy_errors(tmp_path, monkeypatch, text, message):
    monkeypatch.setenv("FEDBN_MED_SITES", str(tmp_path))
    path = _write(tmp_path, text)
    load_site("UCLA", tmp_path)  # the task's reader takes the policy keys
    with pytest.raises(ValueError, match=message) as err:
        site_policy("UCLA")
    assert str(path) in str(err.value)


def test_site_policy_defaults_and_values(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDBN_MED_SITES", str(tmp_path))
    assert site_policy("UCLA").max_scores == DEFAULT_MAX_SCORES
    assert (site_policy("UCLA").max_message_bytes, site_policy("UCLA").message_timeout) == (
        512 << 20, 60.0)
    _write(tmp_path, "dp_epsilon_max = 8\nmax_scores_per_run = 0\nmax_message_mb = 1.5\n"
                     "message_timeout_s = 4\n")
    policy = site_policy("UCLA")
    assert (policy.epsilon_max, policy.max_scores) == (8.0, 0)
    assert (policy.max_message_bytes, policy.message_timeout) == (3 << 19, 4.0)


def test_run_spec_values_out_of_range_are_value_errors():
    with pytest.raises(ValueError, match=r"dp_noise must be a noise multiplier from 0 to "
                                         r"1e\+06, got 1e\+308"):
        RunSpec(dp_clip=1.0, dp_noise=1e308)
    with pytest.raises(ValueError, match=r"seed must be from 0 to 2\*\*32 - 1 \(4294967295\)"):
        RunSpec(seed=2**63 - 1)


def _runtime(tmp_path) -> SiteRuntime:
    torch.manual_seed(0)
    split = (torch.randn(8, 4), torch.tensor([0, 1] * 4))
    trainer = SiteTrainer("UCLA", AbideMLP(4), SiteData(split, split, split),
                          get_strategy("fedbn"), device="cpu")
    return SiteRuntime(trainer=trainer, state_path=tmp_path / "f" / "UCLA.safetensors")


@pytest.mark.parametrize("meta, message", [
    ({"round": "abc"}, r"UCLA.safetensors: 'round' must be a whole number >= 0, got 'abc'"),
    ({"round": 2, "scores": -1}, r"'scores' must be a whole number >= 0, got -1"),
    ({"round": 2, "dp_history": [[1.0, "x", 2]]}, r"'dp_history' must be a list of \[noise"),
    ({"round": 2, "trained": [5]}, r"'trained' must list rounds from 1 to its round 2"),
])
def test_a_bad_state_file_names_itself(tmp_path, meta, message):
    rt = _runtime(tmp_path)
    save_tensors(rt.state_path, {}, meta)
    with pytest.raises(ValueError, match=message) as err:
        rt.restore()
    assert str(rt.state_path) in str(err.value)


def test_a_state_file_round_trips_what_the_site_released(tmp_path):
    rt = _runtime(tmp_path)
    rt.trained, rt.scored_through, rt.scores = {2, 3}, 2, 2
    rt.save(3)
    again = _runtime(tmp_path)
    assert again.restore() == 3
    assert (again.trained, again.scored_through, again.scores) == ({2, 3}, 2, 2)
    assert again.score_refusal(3) is None  # a restarted site still scores round 3's model
    again.scored_through = 3
    assert again.score_refusal(3) is not None and "already scored" in again.score_refusal(3)
    assert "did not train round 4" in again.score_refusal(4)


def test_the_same_weights_asked_again_get_the_same_scores_and_others_none(tmp_path):
    # A server that resumes after a crash asks again for the round whose reply it lost.
    rt = _runtime(tmp_path)
    rt.trained = {1}
    shared = {k: v for k, v in rt.trainer.model.state_dict().items() if k not in rt.kept_keys}
    sent = rt.score(shared, 1)
    rt.save(1)
    again = _runtime(tmp_path)
    again.restore()
    assert again.scores_again(shared, 1) == sent
    assert again.scores == 1  # a score sent again is not a new one
    crafted = {k: v + 0.5 for k, v in shared.items()}
    assert again.scores_again(crafted, 1) is None
    assert "already scored" in again.score_refusal(1)
    assert again.scores_again(shared, 2) is None


def test_a_bad_last_scored_entry_names_the_state_file(tmp_path):
    rt = _runtime(tmp_path)
    save_tensors(rt.state_path, {}, {"round": 1, "last_scored": {"weights": 3}})
    with pytest.raises(ValueError, match="'last_scored' must be") as err:
        rt.restore()
    assert str(rt.state_path) in str(err.value)


def test_scores_leave_at_bounded_precision():
    out = bounded({"test_loss": 1234.56789, "test_accuracy": 0.123456789, "x": float("nan")})
    assert out["test_loss"] == 100.0 and out["test_accuracy"] == 0.1235
    assert out["x"] != out["x"]


def test_the_ledger_composes_every_federation_and_refuses_a_damaged_file(tmp_path):
    ledger = PrivacyLedger(tmp_path / "UCLA.dp_ledger.json", "UCLA")
    assert ledger.spent(1e-5) == 0.0
    ledger.record("a", [(1.0, 1.0, 3)])
    ledger.record("b", [(1.0, 1.0, 2)])
    again = PrivacyLedger(tmp_path / "UCLA.dp_ledger.json", "UCLA")
    assert again.spent(1e-5) == pytest.approx(epsilon(1.0, 5, 1e-5))
    assert again.spent(1e-5, exclude="b") == pytest.approx(epsilon(1.0, 3, 1e-5))
    (tmp_path / "UCLA.dp_ledger.json").write_text("{not json")
    with pytest.raises(ValueError, match="Privacy ledger .*UCLA.dp_ledger.json of site UCLA "
                                         "is damaged"):
        PrivacyLedger(tmp_path / "UCLA.dp_ledger.json", "UCLA")


def test_a_site_ceiling_refuses_a_run_that_would_cross_it(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDBN_MED_SITES", str(tmp_path))
    _write(tmp_path, "dp_epsilon_max = 20.0\n")
    rt = _runtime(tmp_path)
    rt.policy = site_policy("UCLA")
    rt.ledger = PrivacyLedger(tmp_path / "UCLA.dp_ledger.json", "UCLA")
    with pytest.raises(PermissionError, match="would send its updates without DP"):
        rt.check_budget(10)
    rt.trainer.privacy = UpdatePrivacy(clip=1.0, noise=1.0)
    rt.ledger.record("other", [(1.0, 1.0, 3)])
    rt.check_budget(1)
    with pytest.raises(PermissionError, match=r"it has spent epsilon \d+\.\d\d over its "
                                              r"federations .*above its ceiling "
                                              r"dp_epsilon_max = 20"):
        rt.check_budget(20)


def test_a_site_reads_no_path_and_no_server_setting(tmp_path, monkeypatch):
    spec = RunSpec(rounds=2, data_dir=tmp_path / "operator")
    server = ServerSettings(workdir=tmp_path / "srv", federation_id="f-1",
                            tracking_uri="https://user:secret@mlflow.example",
                            node_sites={"7": "NYU"})
    site_spec, fid = read_site_config(run_config(spec, server))
    assert site_spec.data_dir is None and fid == "f-1"
    sealed = seal_run_config(run_config(spec, server), tmp_path / "home")
    text = sealed[RUN_CONFIG_KEY]
    assert "secret" not in text and "srv" not in text and "operator" not in text
    assert set(json.loads(text)) == {"run", "federation_id", "server-token"}
    assert read_site_config(sealed) == (site_spec, "f-1")
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "home"))
    assert read_run_config(sealed) == (spec, server)
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "elsewhere"))
    with pytest.raises(ValueError, match="which do not exist on this host"):
        read_run_config(sealed)
    bad = {RUN_CONFIG_KEY: json.dumps({"run": spec.to_dict(), "federation_id": "../x"})}
    with pytest.raises(ValueError, match="Refused federation id '../x'"):
        read_site_config(bad)


@pytest.mark.parametrize("strategy", ["fedavg_combat", "centralized"])
def test_a_site_never_runs_a_strategy_that_reads_every_site(tmp_path, strategy):
    from flwr.app import Context, RecordDict

    from fedbn_med.federation.client_app import runtime
    from fedbn_med.federation.config import NodeSettings

    spec = RunSpec(strategy=strategy, rounds=1, sites=("NYU", "UM"))
    cfg = run_config(spec, ServerSettings(workdir=tmp_path / "srv", federation_id="f-1"))
    node = NodeSettings(site="NYU", state_dir=tmp_path / "state")
    context = Context(run_id=1, node_id=1, node_config=node.to_node_config(),
                      state=RecordDict(), run_config=cfg)
    with pytest.raises(PermissionError, match=rf"Site NYU does not run strategy '{strategy}': "
                                              r"it reads every site's data in one place"):
        runtime(context)
    assert not (tmp_path / "state").exists()  # refused before anything was built or written


def test_a_site_keeps_its_private_layers_of_the_claimed_best_round_and_its_latest(tmp_path):
    from fedbn_med.federation.kept_rounds import keep_rounds, round_file

    state = tmp_path / "f-1" / "UCLA.safetensors"
    state.parent.mkdir()
    layers = {"bn.running_mean": torch.zeros(3)}
    assert keep_rounds(state, layers, 0, 0) == []  # no round trained yet: nothing written
    assert keep_rounds(state, {}, 4, 2) == []  # no private layers (FedAvg): nothing either
    # the server's claim at each round: the best scored so far, of the rounds before
    for rnd, best in ((1, 0), (2, 1), (3, 2)):
        keep_rounds(state, {"bn.running_mean": torch.full((3,), float(rnd))}, rnd, best)
    assert keep_rounds(state, layers, 4, 2) == [2, 4]  # rounds 1 and 3 can no longer win
    assert load_tensors(round_file(state, 2))[0]["bn.running_mean"].tolist() == [2.0] * 3
    # a claim the site cannot have (a later round, a bool, a string) keeps the latest only
    for claim in (9, True, "2", -1):
        keep_rounds(state, layers, 4, 2)
        assert keep_rounds(state, layers, 5, claim) == [5]
    assert sorted(p.name for p in state.parent.iterdir()) == ["UCLA.round-5.safetensors"]
