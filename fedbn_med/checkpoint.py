"""Crash-safe files: tensors in safetensors, written to a temporary file, fsynced, renamed.

A site's private state (its normalisation layers and the round it finished) and the
server's global checkpoint both go through :func:`save_tensors`, so a process killed in
the middle of a save leaves the previous complete file in place, never a torn one.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save

__all__ = ["load_tensors", "save_tensors", "state_hash", "write_text_atomic"]


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes_atomic(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temporary file, fsync, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return path


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write text to ``path`` atomically."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def save_tensors(path: str | Path, tensors: Mapping[str, torch.Tensor],
                 metadata: Mapping[str, object] | None = None) -> Path:
    """Save tensors as safetensors, atomically, with JSON-able metadata."""
    meta = {k: json.dumps(v) for k, v in (metadata or {}).items()}
    data = save({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, metadata=meta)
    return write_bytes_atomic(path, data)


def load_tensors(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, object]]:
    """Load tensors and metadata saved by :func:`save_tensors`.

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    ValueError
        If the file is not a complete safetensors file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No checkpoint at {path}.")
    try:
        tensors = load_file(str(path))
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as handle:
            raw = handle.metadata() or {}
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(f"Checkpoint {path} is damaged or not a safetensors file: {err}") from err
    return tensors, {k: json.loads(v) for k, v in raw.items()}


def state_hash(tensors: Mapping[str, torch.Tensor]) -> str:
    """Return a SHA-256 over the keys, dtypes, shapes and bytes of a set of tensors."""
    digest = hashlib.sha256()
    for key in sorted(tensors):
        tensor = tensors[key].detach().contiguous().cpu()
        digest.update(key.encode())
        digest.update(str(tensor.dtype).encode())
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()
