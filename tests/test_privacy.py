"""Privacy boundary: no normalisation-layer tensor of a site ever crosses the wire.

``tests/test_federation.py`` runs a real FedBN federation in which site NYU dials the
SuperLink through a relay that records every byte NYU sends (``tests/wiretap.py``). The
check below recomputes, bit for bit, what NYU's first round produces and looks for those
tensors' bytes in the recording: the shared weights are there, the private BN parameters
and statistics are not. The MLflow store and the server checkpoint hold no private
tensor either.
"""

from __future__ import annotations

from pathlib import Path

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
