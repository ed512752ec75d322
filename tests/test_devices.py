"""Local GPUs: site i on cuda:(i mod n), and a site host that never initialises CUDA."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fedbn_med.federation.launcher import site_device, site_devices


@pytest.mark.parametrize(("gpus", "expected"), [
    (0, ["auto", "auto", "auto", "auto"]),
    (1, ["cuda:0", "cuda:0", "cuda:0", "cuda:0"]),
    (2, ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]),
    (3, ["cuda:0", "cuda:1", "cuda:2", "cuda:0"]),
    (8, ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]),
])
def test_auto_spreads_the_sites_over_the_visible_gpus(gpus, expected):
    sites = ["NYU", "UM", "USM", "UCLA"]
    assert list(site_devices(sites, "auto", gpu_count=gpus).values()) == expected
    assert [site_device(i, "auto", gpus) for i in range(4)] == expected


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:1"])
def test_an_explicit_device_is_used_by_every_site(device):
    assert set(site_devices(["NYU", "UM", "USM"], device, gpu_count=4).values()) == {device}


def test_bad_counts_are_refused():
    with pytest.raises(ValueError, match="A site index is 0 or more, got -1"):
        site_device(-1, "auto", 2)
    with pytest.raises(ValueError, match="A GPU count is 0 or more, got -2"):
        site_device(0, "auto", -2)


def test_counting_gpus_does_not_initialise_cuda():
    code = ("import torch; from fedbn_med.federation.launcher.devices import visible_gpu_count; "
            "visible_gpu_count(); print(torch.cuda.is_initialized())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=True)
    assert out.stdout.strip() == "False"


def test_the_site_host_preload_leaves_cuda_uninitialised():
    # What the host imports before it forks: CUDA must still be untouched afterwards.
    code = ("from fedbn_med.federation.launcher import sitehost; sitehost._preload(['abide']); "
            "print(sitehost._cuda_initialized())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False"
