"""The MRI task over a real Flower federation on 127.0.0.1, with the wire recorded.

MONAI's UNet names its BN layers ``adn.N``. Site SiteA dials the SuperLink through a relay
that records both directions. The global weights the server sent are found in what SiteA
received (so the recording does show tensors), and none of SiteA's BN parameters or
statistics (its saved private state) is in what it sent.
"""

from __future__ import annotations

import pytest
import torch

from fedbn_med.checkpoint import load_tensors
from fedbn_med.federation.config import ServerSettings, run_config
from fedbn_med.federation.launcher import LocalFederation
from fedbn_med.spec import RunSpec

from .stores import sqlite_store
from .wiretap import Wiretap

pytestmark = pytest.mark.integration


def _bytes(tensor: torch.Tensor) -> bytes:
    return tensor.detach().contiguous().to(torch.float32).numpy().tobytes()


def test_unet_federation_keeps_adn_layers_at_the_site(tmp_path):
    sites = ("SiteA", "SiteB")
    # two rounds: the second trains from an aggregate, and its saved state is the last one
    config = RunSpec.for_task("mri", strategy="fedbn", rounds=2, sites=sites, batch_size=4,
                              image_size=32, subjects=8, slices=4)
    data = tmp_path / "data"
    with LocalFederation(tmp_path / "fed") as fed:
        # both sites forked from one process that loaded MONAI once, as the main job does
        fed.start_site_host(threads=1, preload=["mri"])
        fed.start_superlink()
        tap = Wiretap(fed.port)
        try:
            fed.start_site("SiteA", data_dir=data, device="cpu", threads=1,
                           superlink=f"127.0.0.1:{tap.port}")
            fed.start_site("SiteB", data_dir=data, device="cpu", threads=1)
            fed.wait_sites_ready(list(sites), timeout=300)
            rc = run_config(config, ServerSettings(
                workdir=tmp_path / "run", federation_id="mri",
                tracking_uri=sqlite_store(tmp_path / "mlflow.db")))
            # until_done: the federation is stopped next, once its results are written
            results = fed.watch(fed.submit(rc, results_dir=tmp_path / "run"), timeout=600,
                                results_dir=tmp_path / "run", until_done=True)
        finally:
            tap.close()
    assert set(results["final"]) == set(sites)
    assert "test_dice" in results["final"]["SiteA"]

    private, meta = load_tensors(next((tmp_path / "fed" / "sites").rglob("SiteA.safetensors")))
    assert meta["round"] == config.rounds and private and all(".adn." in k for k in private)
    global_weights, _ = load_tensors(tmp_path / "run" / "server" / "global.safetensors")
    assert not set(global_weights) & set(private)
    conv = [k for k, v in global_weights.items() if v.dim() >= 4]  # 2D or 3D kernels
    for key in conv[:3]:
        assert _bytes(global_weights[key]) in bytes(tap.received), key
    floats = {k: v for k, v in private.items() if v.dtype.is_floating_point}
    assert floats
    for key, tensor in floats.items():
        assert _bytes(tensor) not in bytes(tap.sent), f"private {key} was sent"
