"""A malicious operator sends hostile global models and paces a score oracle (issue 44).

One SuperLink with TLS and node authentication, two real site nodes (NYU without DP, UM
with DP demanded in its own site file). First an honest federation ``fed-a`` of one
round, so that each site holds trained private layers and its own last update. Then,
with the server's keys and port, the operator runs its own ServerApps with ``flwr run``
under the id ``fed-a``:

1. ``tests/operator_probes.py`` (see there): a NaN model, a model beyond the sites'
   bound, the single-reply leak's all-zero model, and the paced oracle (one honest train
   round, then evaluate messages carrying crafted weights);
2. the same app under a run spec of ``lr = 1e-12``, which the sites' bounds refuse.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import subprocess
from pathlib import Path

import pytest

from fedbn_med.checkpoint import load_tensors
from fedbn_med.federation.approve import describe
from fedbn_med.federation.config import ServerSettings, run_config
from fedbn_med.federation.launcher.flower_cli import CONNECTION, flwr_tool, write_run_config
from fedbn_med.spec import RunSpec

from .keyed import keyed_federation, run_federation, start_honest

pytestmark = pytest.mark.integration
logger = logging.getLogger(__name__)

PROBES = Path(__file__).with_name("operator_probes.py")
SITES = ("NYU", "UM")
APP_TOML = """[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "operator-probes"
version = "0.1.0"
dependencies = []

[tool.flwr.app]
publisher = "operator"

[tool.flwr.app.components]
serverapp = "operator_probes:app"
clientapp = "fedbn_med.federation.client_app:app"

[tool.flwr.app.config]
fedbn-med = ""
probes = ""
"""


def _site_file(folder: Path, name: str, cohort: Path, extra: str = "") -> None:
    (folder / f"{name}.toml").write_text(
        f'name = "{name}"\nabide_site_ids = ["{"UM_1" if name == "UM" else name}"]\n'
        f'data_dir = "{cohort}"\n{extra}')


@pytest.fixture(scope="module")
def hostile_world(small_cohort, tmp_path_factory):
    """Run the honest federation, then the operator's two probing runs, once."""
    root = tmp_path_factory.mktemp("hostile")
    sites_dir = root / "sites"
    sites_dir.mkdir()
    _site_file(sites_dir, "NYU", small_cohort, "[training]\nlr = [1e-4, 1e-1]\n")
    spec = RunSpec(strategy="fedbn", rounds=1, sites=SITES, device="cpu")
    # UM pins the one run spec it approved, by the hash the approval command prints
    world: dict = {"root": root, "approved": describe(spec.to_json())[1]}
    _site_file(sites_dir, "UM", small_cohort, "dp_noise = 1.0\ndp_clip = 1e-3\n"
               f'approved_specs = ["{world["approved"]}"]\n')
    mp = pytest.MonkeyPatch()
    mp.setenv("FEDBN_MED_SITES", str(sites_dir))
    try:
        with keyed_federation(root, SITES) as c:
            start_honest(c, SITES, None)
            c.fed.wait_sites_ready(list(SITES), timeout=240)
            world["a"] = run_federation(c, "fed-a", spec, timeout=300, round_timeout=120.0)[0]
            state = root / "fed" / "sites" / "fed-a"
            world["before"] = {s: (state / f"{s}.safetensors").read_bytes() for s in SITES}
            world["probes"] = _probes(c, root, spec, "probes")
            world["after"] = {s: load_tensors(state / f"{s}.safetensors") for s in SITES}
            world["slow"] = _probes(c, root, spec.replace(lr=1e-12), "slow")
            # NYU now pins the app of the honest runs, by the hash its audit log holds
            world["app"] = _honest_app(root / "fed" / "sites" / "NYU.audit.jsonl")
            nyu = sites_dir / "NYU.toml"  # a top-level key: before its [training] table
            nyu.write_text(f'approved_apps = ["{world["app"]}"]\n' + nyu.read_text())
            world["pinned"] = _probes(c, root, spec, "pinned")
            yield world
    finally:
        mp.undo()


def _honest_app(log: Path) -> str:
    """Return the app hash of the honest federation's messages in a site's audit log."""
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    (app,) = {e["app"] for e in entries if e.get("federation") == "fed-a"
              and e.get("kind") == "received" and e.get("round") == 1}
    return app


def _probes(c, root: Path, spec: RunSpec, name: str) -> dict:
    """Run the operator's ServerApp with ``flwr run`` under the id ``fed-a``."""
    app = root / f"{name}_app"
    app.mkdir()
    (app / "pyproject.toml").write_text(APP_TOML)
    shutil.copy(PROBES, app / "operator_probes.py")
    cfg = run_config(spec, ServerSettings(workdir=root / name, federation_id="fed-a"))
    out = root / f"{name}.json"
    cfg["probes"] = json.dumps({"out": str(out), "sites": len(SITES), "round": 1,
                                "global": str(root / "fed-a" / "server" /
                                              "global.safetensors")})
    overrides = write_run_config(root / f"{name}.toml", cfg)
    subprocess.run([flwr_tool("flwr"), "run", str(app), CONNECTION, "--stream",
                    "--run-config", str(overrides)], env=c.fed.env, cwd=c.fed.workdir,
                   capture_output=True, timeout=300, check=False)
    return json.loads(out.read_text())


def test_a_nan_or_out_of_bound_model_is_refused_before_training(hostile_world):
    assert "error" not in hostile_world["a"], hostile_world["a"]
    probes = hostile_world["probes"]
    for site in SITES:
        assert probes[site]["nan"]["error"], probes[site]
        assert "refuses the model of a train message" in probes[site]["nan"]["reason"]
        assert "'net.2.weight' holds NaN or Inf" in probes[site]["nan"]["reason"]
        assert "above this site's bound max_weight_abs = 1000" in probes[site]["big"]["reason"]


def test_no_non_finite_value_lands_in_a_site_state(hostile_world):
    world = hostile_world
    for site in SITES:
        tensors, meta = world["after"][site]
        assert all(bool(t.isfinite().all()) for t in tensors.values()
                   if t.dtype.is_floating_point), site
        # the refused messages changed nothing; the one honest probe round trained
        assert meta["round"] == 2, (site, meta["round"])


def test_the_single_reply_leak_gets_no_reply(hostile_world):
    for site in SITES:
        single = hostile_world["probes"][site]["single"]
        assert single["error"] and "is all zero" in single["reason"], single


def test_the_paced_score_oracle_gets_no_score(hostile_world):
    probes = hostile_world["probes"]
    nyu, um = probes["NYU"], probes["UM"]
    # the honest round the operator pays with is trained by both
    assert not nyu["paced-train"]["error"] and not um["paced-train"]["error"], probes
    # the zeroed probe: refused by both before any computation
    for fates in (nyu, um):
        assert fates["paced-zero"]["error"], fates
        assert "is all zero" in fates["paced-zero"]["reason"]
    # the probe in noise passes the all-zero rule; NYU (no DP) finds it is no aggregate
    # of its own update, UM (DP) sends no score at all
    assert nyu["paced-noise"]["error"], nyu
    assert "from what this site sent last" in nyu["paced-noise"]["reason"]
    assert um["paced-noise"] == {"error": False, "metrics": [], "eval": None}, um


def test_a_dp_site_sends_no_training_loss(hostile_world):
    probes = hostile_world["probes"]
    assert "train_loss" in probes["NYU"]["paced-train"]["metrics"]
    um = probes["UM"]["paced-train"]["metrics"]
    assert "train_loss" not in um and "dp_epsilon" in um, um
    rows = [r for r in hostile_world["a"]["rows"] if r["site"] == "UM"]
    assert rows and all(not math.isfinite(r.get("train_loss", math.nan)) for r in rows), rows


def test_a_site_trains_only_within_its_own_bounds(hostile_world):
    slow = hostile_world["slow"]
    reasons = slow.get("query-errors", {}).get("reasons", [])
    assert len(reasons) == len(SITES), slow
    assert any("Site NYU refuses this run: The site trains with lr from 0.0001 to 0.1 "
               f"([training] in {hostile_world['root'] / 'sites' / 'NYU.toml'}); the run "
               "asks for lr = 1e-12" in r for r in reasons), reasons
    # UM approved one spec: the slow one is refused by its hash, named with UM's own
    _, slow = describe(RunSpec(strategy="fedbn", rounds=1, sites=SITES, device="cpu",
                               lr=1e-12).to_json())
    assert any(f"Site UM refuses this run: its run spec's hash is {slow}, and the site "
               f"approved only {hostile_world['approved']} (approved_specs in" in r
               for r in reasons), reasons


def test_a_site_runs_only_the_app_it_approved(hostile_world):
    world = hostile_world
    assert len(world["app"]) == 64
    reasons = world["pinned"].get("query-errors", {}).get("reasons", [])
    # NYU refuses the operator's app, naming both hashes; UM (no pin) answers
    assert len(reasons) == 1 and "Site NYU refuses this run: its app (FAB)'s hash is " \
        in reasons[0], world["pinned"]
    assert f"and the site approved only {world['app']} (approved_apps in" in reasons[0]
    assert "UM" in world["pinned"]


def test_each_site_keeps_an_audit_trail_its_officer_can_verify(hostile_world, tmp_path,
                                                                capsys):
    from fedbn_med.federation.audit import main, verify

    for site in SITES:
        log = hostile_world["root"] / "fed" / "sites" / f"{site}.audit.jsonl"
        summary = verify(log)
        assert summary.intact, (site, summary.reason)
        assert {"fed-a"} == summary.federations
        assert summary.kinds["received"] >= 10 and summary.kinds["sent"] >= 3, summary.kinds
        refused = list(summary.refused)
        assert any("holds NaN or Inf" in r for r in refused), refused
        assert any("is all zero" in r for r in refused), refused
        slow = "the run asks for lr = 1e-12" if site == "NYU" else "and the site approved only"
        assert any(slow in r for r in refused), refused
        # names, shapes and norms of what left; never a BN tensor, never a value
        assert summary.tensor_releases >= 2
        assert summary.tensor_names and not any(".N." in n for n in summary.tensor_names)
        assert main([str(log)]) == 0
        out = capsys.readouterr().out
        assert "chain intact" in out and "No batch-norm statistics ever left the site" in out
        # one changed line breaks the chain there
        lines = log.read_text().splitlines()
        lines[1] = lines[1].replace('"kind": "', '"kind": "x', 1)
        forged = tmp_path / f"{site}.audit.jsonl"
        forged.write_text("\n".join(lines) + "\n")
        assert verify(forged).broken_at == 2
        assert main([str(forged)]) == 1
        assert "CHAIN BROKEN at line 2: its contents were changed" in capsys.readouterr().out
    # the DP site's epsilon is in its log
    assert verify(hostile_world["root"] / "fed" / "sites" / "UM.audit.jsonl").epsilon
