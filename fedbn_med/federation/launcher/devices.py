"""Which device each local site trains on, when several sites share one workstation.

With ``--device auto`` and ``n`` visible GPUs, site ``i`` (in the order the sites are
given) trains on ``cuda:(i mod n)``: four sites on two GPUs take ``cuda:0, cuda:1,
cuda:0, cuda:1``. With no GPU, ``auto`` stays ``auto`` and each site falls back to the
CPU. An explicit device (``cpu``, ``cuda:1``) is used by every site as given.
``CUDA_VISIBLE_DEVICES`` decides which GPUs count as visible.

The site host forks the site processes, and a process that has initialised CUDA cannot
use it in a forked child. So neither the host nor this module initialises CUDA: the
count comes from ``torch.cuda.device_count()``, which asks NVML (or the driver) without
creating a CUDA context, and each site process initialises CUDA itself, after the fork,
on the device it was given. ``tests/test_devices.py`` checks both on CPU.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["site_device", "site_devices", "visible_gpu_count"]


def site_device(index: int, device: str, gpu_count: int) -> str:
    """Return the device of the ``index``-th local site.

    Parameters
    ----------
    index : int
        Position of the site among the sites of this workstation (0-based).
    device : str
        What was asked for: ``"auto"`` spreads the sites over the GPUs, anything else is
        used as given.
    gpu_count : int
        Number of visible GPUs.
    """
    if index < 0:
        raise ValueError(f"A site index is 0 or more, got {index}.")
    if gpu_count < 0:
        raise ValueError(f"A GPU count is 0 or more, got {gpu_count}.")
    if device != "auto" or gpu_count == 0:
        return device
    return f"cuda:{index % gpu_count}"


def site_devices(sites: Sequence[str], device: str, gpu_count: int | None = None
                 ) -> dict[str, str]:
    """Return the device of each local site, in order (see :func:`site_device`).

    ``gpu_count`` defaults to :func:`visible_gpu_count` when ``device`` is ``"auto"``.
    """
    if device == "auto" and gpu_count is None:
        gpu_count = visible_gpu_count()
    return {site: site_device(i, device, gpu_count or 0) for i, site in enumerate(sites)}


def visible_gpu_count() -> int:
    """Return how many CUDA GPUs this process sees, without initialising CUDA."""
    import torch

    # device_count() asks NVML where it can; is_available() would call cuInit, which a
    # process that later forks sites must not do.
    return int(torch.cuda.device_count())
