"""Every message of a federation as one Flower record: named tensors plus small sections.

Flower stores each record, array and array chunk of a message as its own object, and
moves each object with its own HTTP request, each way, through the SuperLink. A round's
cost on a small model is those requests, not the bytes. So a message here is a single
``ConfigRecord``: the tensors as two raw little-endian vectors (``float32`` and
``int64``) with their names and shapes, and the rest (round, metrics, site facts) as
``section/key`` entries. A message is then three objects (message, record dict, record)
instead of nine or more.

The bytes of a tensor on the wire are its plain ``float32`` bytes, so a test that looks
for a tensor's bytes in the traffic finds it if, and only if, it was sent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
from flwr.app import ConfigRecord, RecordDict

__all__ = ["Payload", "pack", "unpack"]

RECORD = "payload"
_TENSORS = "tensors"
_FLOAT = np.dtype("<f4")
_INT = np.dtype("<i8")

Scalar = int | float | str | bool | bytes | list


@dataclass
class Payload:
    """What a message carries: named tensors and named sections of plain values."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    sections: dict[str, dict[str, Scalar]] = field(default_factory=dict)

    def section(self, name: str) -> dict[str, Scalar]:
        """Return one section (empty when the message has none of that name)."""
        return dict(self.sections.get(name, {}))

    def floats(self, name: str) -> dict[str, float]:
        """Return a section of numbers (metrics) as floats."""
        return {k: float(v) for k, v in self.sections.get(name, {}).items()}  # type: ignore[arg-type]


def pack(tensors: Mapping[str, torch.Tensor] | None = None,
         **sections: Mapping[str, Scalar]) -> RecordDict:
    """Return message content holding ``tensors`` and ``sections`` in one record."""
    entries: dict[str, Scalar] = {}
    for name, values in sections.items():
        if name == _TENSORS or "/" in name:
            raise ValueError(f"'{name}' cannot name a section of a message.")
        for key, value in values.items():
            if isinstance(value, (np.floating, np.integer)):
                value = value.item()
            entries[f"{name}/{key}"] = value
    tensors = dict(tensors or {})
    floats = [k for k in tensors if tensors[k].dtype.is_floating_point]
    ints = [k for k in tensors if not tensors[k].dtype.is_floating_point]
    shapes = [tuple(int(d) for d in tensors[k].shape) for k in floats + ints]
    entries[f"{_TENSORS}/float-keys"] = floats
    entries[f"{_TENSORS}/int-keys"] = ints
    entries[f"{_TENSORS}/ndims"] = [len(s) for s in shapes]
    entries[f"{_TENSORS}/dims"] = [d for s in shapes for d in s]
    entries[f"{_TENSORS}/float"] = _to_bytes([tensors[k] for k in floats], torch.float32, _FLOAT)
    entries[f"{_TENSORS}/int"] = _to_bytes([tensors[k] for k in ints], torch.int64, _INT)
    return RecordDict({RECORD: ConfigRecord(entries)})


def _to_bytes(parts: list[torch.Tensor], dtype: torch.dtype, wire: np.dtype) -> bytes:
    if not parts:
        return b""
    flat = torch.cat([p.detach().reshape(-1).to("cpu", dtype) for p in parts])
    return flat.numpy().astype(wire, copy=False).tobytes()


def unpack(content: RecordDict) -> Payload:
    """Return the tensors and sections stored by :func:`pack`.

    Raises
    ------
    ValueError
        When the content is not a fedbn-med message, or its tensors do not fit their
        layout (a truncated or tampered message). Nothing else escapes: whatever a
        message holds, decoding it fails with a ``ValueError`` that says why, so a
        server can refuse that one message and go on.
    """
    try:
        record = content.config_records.get(RECORD)
    except Exception as err:  # a content object that is not a RecordDict at all
        raise ValueError(f"The message content is unreadable ({type(err).__name__}: "
                         f"{err}).") from err
    if record is None:
        raise ValueError(f"The message has no '{RECORD}' record; it was not sent by "
                         f"fedbn-med (records: {sorted(content.keys())}).")
    payload = Payload()
    layout: dict[str, Scalar] = {}
    for full_key, value in record.items():
        name, _, key = str(full_key).partition("/")
        if name == _TENSORS:
            layout[key] = value
        else:
            payload.sections.setdefault(name, {})[key] = value
    try:
        payload.tensors = _tensors(layout)
    except ValueError:
        raise
    except Exception as err:  # any other failure is still a malformed message
        raise ValueError(f"The message's tensors cannot be decoded ({type(err).__name__}: "
                         f"{err}).") from err
    return payload


def _names(layout: Mapping[str, Scalar], key: str) -> list[str]:
    value = layout.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"The message's tensor layout '{key}' must be a list of names, "
                         f"got {type(value).__name__}.")
    if len(set(value)) != len(value):
        raise ValueError(f"The message's tensor layout '{key}' names a tensor twice.")
    return list(value)


def _counts(layout: Mapping[str, Scalar], key: str) -> list[int]:
    value = layout.get(key, [])
    if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        raise ValueError(f"The message's tensor layout '{key}' must be a list of whole "
                         "numbers >= 0 (ranks and dimensions), got "
                         f"{str(value)[:60]}.")
    return list(value)


def _tensors(layout: Mapping[str, Scalar]) -> dict[str, torch.Tensor]:
    floats = _names(layout, "float-keys")
    ints = _names(layout, "int-keys")
    if set(floats) & set(ints):
        raise ValueError("The message's tensor layout names a tensor both float and int: "
                         f"{sorted(set(floats) & set(ints))[:3]}.")
    ndims = _counts(layout, "ndims")
    dims = _counts(layout, "dims")
    if len(ndims) != len(floats) + len(ints) or sum(ndims) != len(dims):
        raise ValueError("The message's tensor layout is inconsistent: "
                         f"{len(floats) + len(ints)} names, {len(ndims)} ranks, "
                         f"{len(dims)} dimensions for ranks summing to {sum(ndims)}.")
    shapes: list[tuple[int, ...]] = []
    pos = 0
    for nd in ndims:
        shapes.append(tuple(dims[pos:pos + nd]))
        pos += nd
    out: dict[str, torch.Tensor] = {}
    for keys, blob, wire, own_shapes, kind in (
            (floats, layout.get("float", b""), _FLOAT, shapes[:len(floats)], "float"),
            (ints, layout.get("int", b""), _INT, shapes[len(floats):], "int")):
        if not isinstance(blob, bytes) or len(blob) % wire.itemsize:
            raise ValueError(f"The message's {kind} tensor bytes are malformed.")
        # Python integers: a product of huge dimensions cannot wrap around to a small one
        sizes = [math.prod(s) for s in own_shapes]
        if sum(sizes) != len(blob) // wire.itemsize:
            raise ValueError(f"The message carries {len(blob) // wire.itemsize} {kind} values "
                             f"but its layout describes {sum(sizes)} (truncated or tampered).")
        flat = torch.from_numpy(np.frombuffer(blob, dtype=wire).astype(wire.newbyteorder("="),
                                                                        copy=True))
        start = 0
        for key, shape, size in zip(keys, own_shapes, sizes):
            out[key] = flat[start:start + size].reshape(shape).clone()
            start += size
    return out
