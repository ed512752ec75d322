"""Privacy boundary: no normalisation-layer tensor of a site ever crosses the wire.

``tests/test_federation.py`` runs a real FedBN federation in which site NYU dials the
SuperLink through a relay that records every byte NYU sends (``tests/wiretap.py``). The
check below recomputes, bit for bit, what NYU's first round produces and looks for those
tensors' bytes in the recording: the shared weights are there, the private BN parameters
and statistics are not. The MLflow store and the server checkpoint hold no private
tensor either.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from fedbn_med.checkpoint import load_tensors
from fedbn_med.spec import RunSpec
from fedbn_med.tasks.abide.build import build_trainer
from fedbn_med.tasks.abide.sites import load_sites


def _bytes(tensor: torch.Tensor) -> bytes:
    return tensor.detach().contiguous().to(torch.float32).numpy().tobytes()


def check_no_private_tensor_left_the_site(wire: bytes, config: RunSpec, site: str,
                                          run_dir: Path, store_dir: Path) -> None:
    """Assert the recording holds the site's shared tensors and none of its BN tensors."""
    torch.set_num_threads(1)
    trainer = build_trainer(load_sites([site])[site], config, device="cpu")
    sent, _, _ = trainer.fit(trainer.shared_weights(), {"round": 1})
    private = trainer.private_state()
    assert private, "the network has BN layers"

    for key in ("net.0.weight", "net.2.weight", "net.4.bias"):
        assert _bytes(sent[key].reshape(-1)[:16]) in wire, f"shared {key} not seen on the wire"
    floats = {k: v for k, v in private.items() if v.dtype.is_floating_point}
    assert len(floats) == 8  # weight, bias, running mean and variance of two BN layers
    for key, tensor in floats.items():
        assert _bytes(tensor) not in wire, f"private {key} was sent"

    shared_keys = trainer.partition.shared
    ckpt, _ = load_tensors(run_dir / "server" / "global.safetensors")
    assert set(ckpt) == set(shared_keys)
    artifacts = list(store_dir.rglob("*.safetensors"))
    assert artifacts, "the final shared weights are an MLflow artifact"
    for path in artifacts:
        tensors, _ = load_tensors(path)
        assert set(tensors) <= set(shared_keys)
    store = b"".join(p.read_bytes() for p in store_dir.parent.rglob("*") if p.is_file()
                     and p.suffix in (".db", ".safetensors", ".md", ".png"))
    for key, tensor in floats.items():
        assert _bytes(tensor) not in store, f"private {key} is in the MLflow store"


# -- client-level differential privacy (fedbn_med.fl.privacy) --------------------------------
def _dp_trainers(privacy, strategy=None):
    from fedbn_med.fl.strategies import FedBN
    from fedbn_med.tasks.abide.model import AbideMLP
    from fedbn_med.training.trainer import SiteTrainer

    from .test_driver import _site_data

    out = {}
    for i, (site, shift) in enumerate((("A", 0.0), ("B", 3.0))):
        torch.manual_seed(0)
        out[site] = SiteTrainer(site, AbideMLP(12), _site_data(shift, 1.0, i),
                                strategy or FedBN(), batch_size=16, seed=0, device="cpu",
                                privacy=privacy)
    return out


def test_dp_with_no_noise_and_a_huge_clip_equals_no_dp():
    from fedbn_med.fl.privacy import UpdatePrivacy
    from fedbn_med.fl.strategies import FedBN
    from fedbn_med.training.inprocess import run_in_process

    plain = run_in_process(_dp_trainers(None), FedBN(), rounds=3)
    dp = run_in_process(_dp_trainers(UpdatePrivacy(clip=1e9, noise=0.0)), FedBN(), rounds=3)
    dropped = ("dp_epsilon", "dp_delta", "dp_noise", "dp_clip", "dp_epsilon_replace_one",
               "dp_seeded")
    assert [{k: v for k, v in r.items() if k not in dropped} for r in dp.rows] == plain.rows
    for key, value in plain.global_weights.items():
        assert torch.equal(dp.global_weights[key], value), key


def test_noise_never_releases_a_negative_bn_variance():
    from fedbn_med.fl.privacy import UpdatePrivacy

    privacy = UpdatePrivacy(clip=1.0, noise=50.0)
    start = {"net.1.N.running_var": torch.ones(64), "net.1.N.running_mean": torch.zeros(64),
             "net.1.N.num_batches_tracked": torch.tensor(3)}
    sent = {k: v + 1 for k, v in start.items()}
    out = privacy.privatize(sent, start, torch.Generator().manual_seed(0),
                            nonnegative={"net.1.N.running_var"})
    assert (out["net.1.N.running_var"] >= 0).all()
    assert (out["net.1.N.running_var"] == 0).any()  # the noise did push some below 0
    assert (out["net.1.N.running_mean"] < 0).any()  # a mean may be negative: untouched
    assert int(out["net.1.N.num_batches_tracked"]) == 3


def test_fedavg_under_heavy_dp_noise_stays_finite():
    """FedAvg shares BN running statistics: noised, they must not make the model NaN."""
    from fedbn_med.fl.privacy import UpdatePrivacy
    from fedbn_med.fl.strategies import FedAvg
    from fedbn_med.training.inprocess import run_in_process

    trainers = _dp_trainers(UpdatePrivacy(clip=0.1, noise=20.0), FedAvg())
    history = run_in_process(trainers, FedAvg(), rounds=3)
    for row in history.rows:
        assert math.isfinite(row["val_loss"]), row
    assert all(torch.isfinite(v.double()).all() for v in history.global_weights.values())
    variances = [v for k, v in history.global_weights.items() if k.endswith("running_var")]
    assert variances and all((v >= 0).all() for v in variances)


@pytest.mark.parametrize(("noise", "rounds", "delta"),
                         [(1.0, 30, 1e-5), (0.7, 5, 1e-6), (4.0, 100, 1e-5), (20.0, 300, 1e-5)])
def test_epsilon_is_opacus_rdp_accountant(noise, rounds, delta):
    from opacus.accountants import RDPAccountant

    from fedbn_med.fl.privacy import UpdatePrivacy

    accountant = RDPAccountant()
    for _ in range(rounds):  # every site releases once per round: sampling rate 1
        accountant.step(noise_multiplier=noise, sample_rate=1.0)
    got = UpdatePrivacy(clip=1.0, noise=noise, delta=delta).epsilon(rounds)
    assert got == pytest.approx(accountant.get_epsilon(delta=delta), rel=1e-12)
    # without sampling, RDP of order a is rounds * a / (2 sigma^2): the classic conversion
    # (Mironov 2017) bounds Opacus's tighter one from above
    classic = min(rounds * a / (2 * noise**2) + math.log(1 / delta) / (a - 1)
                  for a in RDPAccountant.DEFAULT_ALPHAS)
    assert 0 < got <= classic


def test_clip_and_noise_clips_to_c_and_adds_sigma_c():
    from fedbn_med.fl.privacy import clip_and_noise

    update = {"a": torch.full((3,), 4.0), "b": torch.full((1,), 4.0)}  # norm 8
    clipped, norm = clip_and_noise(update, clip=2.0, noise=0.0)
    assert norm == pytest.approx(8.0)
    assert float(torch.cat([v.reshape(-1) for v in clipped.values()]).norm()) == pytest.approx(2.0)
    gen = torch.Generator().manual_seed(0)
    noisy, _ = clip_and_noise({"z": torch.zeros(200_000)}, clip=0.5, noise=3.0, generator=gen)
    assert float(noisy["z"].std()) == pytest.approx(1.5, rel=0.01)


def test_dp_noise_is_not_derived_from_the_run_seed():
    from fedbn_med.fl.privacy import UpdatePrivacy

    privacy = UpdatePrivacy(clip=1.0, noise=1.0)
    start = {"w": torch.zeros(64)}
    sent = {"w": torch.ones(64)}
    assert not torch.equal(privacy.privatize(sent, start)["w"],
                           privacy.privatize(sent, start)["w"])


@pytest.mark.parametrize(("changes", "message"), [
    ({"dp_clip": 1.0, "dp_noise": 0.0}, "epsilon is infinite"),
    ({"dp_clip": 1.0, "dp_noise": 1.0, "dp_delta": 0.0},
     r"epsilon is undefined for dp_delta = 0\.0: delta must be in \(0, 1\)"),
    ({"dp_clip": 1.0, "dp_noise": 1.0, "dp_delta": 1.0}, "epsilon is undefined"),
    ({"dp_clip": 1.0}, "needs both dp_clip and dp_noise; dp_clip was given without dp_noise"),
    ({"dp_clip": 0.0, "dp_noise": 1.0}, "dp_clip must be a positive norm"),
    ({"dp_clip": 1.0, "dp_noise": float("inf")}, "dp_noise must be a finite number"),
    ({"dp_clip": 1.0, "dp_noise": 1.0, "strategy": "singleset"}, "sends no update"),
])
def test_run_with_undefined_or_infinite_epsilon_does_not_start(changes, message):
    with pytest.raises(ValueError, match=message):
        RunSpec(**changes)


def test_cli_refuses_infinite_epsilon(capsys):
    from fedbn_med.cli import main

    assert main(["--dp-clip", "1", "--dp-noise", "0", "--engine", "inprocess"]) == 2
    assert "epsilon is infinite" in capsys.readouterr().err


def _site_file(tmp_path, monkeypatch, extra: str) -> None:
    from fedbn_med.tasks.site_toml import sites_dir

    text = (sites_dir() / "NYU.toml").read_text(encoding="utf-8")
    folder = tmp_path / "sites"
    folder.mkdir()
    (folder / "NYU.toml").write_text(text + "\n" + extra + "\n", encoding="utf-8")
    monkeypatch.setenv("FEDBN_MED_SITES", str(folder))


def test_site_file_noise_floor_the_server_cannot_lower(tmp_path, monkeypatch):
    from fedbn_med.tasks.abide.build import build_trainer
    from fedbn_med.tasks.abide.sites import load_site

    from .test_driver import _site_data

    _site_file(tmp_path, monkeypatch, "dp_noise = 3.0\ndp_clip = 0.5\ndp_delta = 1e-6")
    site = load_site("NYU")
    data = _site_data(0.0, 1.0, 0)
    for run_noise, want in ((0.5, 3.0), (4.0, 4.0)):
        spec = RunSpec(rounds=5, dp_clip=2.0, dp_noise=run_noise, dp_delta=1e-5)
        privacy = build_trainer(site, spec, data, device="cpu").privacy
        assert (privacy.noise, privacy.clip, privacy.delta) == (want, 0.5, 1e-6)
    # a run without DP: the site still clips and noises what it sends
    trainer = build_trainer(site, RunSpec(rounds=5), data, device="cpu")
    _, _, metrics = trainer.fit(trainer.shared_weights(), {"round": 1})
    assert metrics["dp_noise"] == 3.0 and metrics["dp_epsilon"] > 0


@pytest.mark.parametrize(("extra", "message"), [
    ("dp_noise = 0.0\ndp_clip = 1.0", "Site NYU .* epsilon is infinite"),
    ("dp_noise = 2.0", "sets dp_noise but no dp_clip"),
    ("dp_noise = 'high'", "'dp_noise' must be a number"),
    # refused when the file is read, before any epsilon is computed (issue 44's range check)
    ("dp_delta = 2.0\ndp_clip = 1.0", r"'dp_delta' must be above 0 and at most 0.001 .* got 2.0"),
])
def test_site_file_privacy_errors(tmp_path, monkeypatch, extra, message):
    from fedbn_med.tasks.abide.build import build_trainer
    from fedbn_med.tasks.abide.sites import load_site

    from .test_driver import _site_data

    _site_file(tmp_path, monkeypatch, extra)
    with pytest.raises(ValueError, match=message):
        build_trainer(load_site("NYU"), RunSpec(rounds=5), _site_data(0.0, 1.0, 0),
                      device="cpu")


def check_no_clean_update_left_the_site(wire: bytes, config: RunSpec, site: str) -> None:
    """Assert the recording of a DP run holds none of the site's clean round-1 tensors."""
    clean = replace(config, dp_clip=None, dp_noise=None)
    torch.set_num_threads(1)
    trainer = build_trainer(load_sites([site])[site], clean, device="cpu")
    sent, _, _ = trainer.fit(trainer.shared_weights(), {"round": 1})
    assert len(wire) > 4 * sum(t.numel() for t in sent.values()), "the site sent its update"
    for key, tensor in sent.items():
        if tensor.dtype.is_floating_point:
            assert _bytes(tensor.reshape(-1)[:16]) not in wire, f"clean {key} was sent"
