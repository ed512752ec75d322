"""Pack a set of named tensors into as few Flower objects as possible.

Flower moves every array of a message as its own object, one HTTP request each way; a
model's state sent key by key costs a dozen round trips per message. We send the
tensors as one flat float32 vector (and one int64 vector for counters) plus their
names and shapes, and unpack them on the other side.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

__all__ = ["pack", "unpack"]


def pack(tensors: Mapping[str, torch.Tensor], content: RecordDict, name: str = "arrays") -> None:
    """Store ``tensors`` in ``content`` under ``name`` (an ArrayRecord and a ConfigRecord)."""
    keys = list(tensors)
    floats = [k for k in keys if tensors[k].dtype.is_floating_point]
    ints = [k for k in keys if not tensors[k].dtype.is_floating_point]
    arrays: dict[str, torch.Tensor] = {}
    if floats:
        arrays["float"] = torch.cat([tensors[k].detach().reshape(-1).to("cpu", torch.float32)
                                     for k in floats])
    if ints:
        arrays["int"] = torch.cat([tensors[k].detach().reshape(-1).to("cpu", torch.int64)
                                   for k in ints])
    content[name] = ArrayRecord(torch_state_dict=arrays) if arrays else ArrayRecord()
    ndims = [tensors[k].dim() for k in floats + ints]
    dims = [int(d) for k in floats + ints for d in tensors[k].shape]
    content[f"{name}-layout"] = ConfigRecord({
        "float-keys": floats, "int-keys": ints, "ndims": ndims, "dims": dims,
    })


def unpack(content: RecordDict, name: str = "arrays") -> dict[str, torch.Tensor]:
    """Return the tensors stored by :func:`pack` (empty when there are none)."""
    layout = content.config_records.get(f"{name}-layout")
    record = content.array_records.get(name)
    if layout is None or record is None or not len(record):
        return {}
    arrays = record.to_torch_state_dict()
    floats = list(layout.get("float-keys", []))
    ints = list(layout.get("int-keys", []))
    ndims = list(layout.get("ndims", []))
    dims = list(layout.get("dims", []))
    shapes: list[tuple[int, ...]] = []
    pos = 0
    for nd in ndims:
        shapes.append(tuple(int(d) for d in dims[pos:pos + nd]))
        pos += nd
    out: dict[str, torch.Tensor] = {}
    for keys, flat, offset in ((floats, arrays.get("float"), 0),
                               (ints, arrays.get("int"), len(floats))):
        if not keys:
            continue
        if flat is None:
            raise ValueError(f"Packed tensors '{name}' lack their {'float' if offset == 0 else 'int'}"
                             " vector.")
        start = 0
        for i, key in enumerate(keys):
            shape = shapes[offset + i]
            size = 1
            for d in shape:
                size *= d
            if start + size > flat.numel():
                raise ValueError(f"Packed tensors '{name}' are shorter than their layout says.")
            out[key] = flat[start:start + size].reshape(shape).clone()
            start += size
        if start != flat.numel():
            raise ValueError(f"Packed tensors '{name}' are longer than their layout says.")
    return out
