"""A site's audit trail: an append-only, hash-chained log of what came in and what left.

Every message a site receives (its type, round, federation, the hash of the run spec it
ran under, and whether it was refused and why) and every tensor that left it (names,
shapes, norms; the DP clip, noise multiplier and epsilon spent), one JSON line each, in
``<state-dir>/<site>.audit.jsonl``. Never a value of a tensor, never a score's value.

Each line holds the SHA-256 of the line before it and its own, so a line changed, removed
or inserted breaks the chain from there on (:func:`verify`). A site's data-protection
officer reads the summary::

    python -m fedbn_med.federation.audit /srv/fedbn/state/UCLA.audit.jsonl
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["AuditLog", "AuditSummary", "main", "run_spec_hash", "spec_hash", "tensor_facts",
           "verify"]

#: The ``prev`` of a log's first line.
GENESIS = "0" * 64


def _digest(prev: str, entry: Mapping[str, Any]) -> str:
    body = json.dumps(entry, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256((prev + body).encode()).hexdigest()


def spec_hash(spec_json: str) -> str:
    """Return the SHA-256 of a run spec's JSON (what a site approves and logs)."""
    return hashlib.sha256(spec_json.encode()).hexdigest()


def run_spec_hash(run: object) -> str:
    """Return the hash of the run spec a site received (its ``run`` values, keys sorted).

    The same for the site's audit log, its approval (``approved_specs`` in its site file)
    and ``python -m fedbn_med.federation.approve``.
    """
    return spec_hash(json.dumps(run, sort_keys=True))


def tensor_facts(tensors: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Return each tensor's name, shape and L2 norm (never its values)."""
    facts = []
    for name, tensor in sorted(tensors.items()):
        norm = float(tensor.detach().double().norm()) if tensor.dtype.is_floating_point \
            else None
        facts.append({"name": name, "shape": list(tensor.shape), "norm": norm})
    return facts


class AuditLog:
    """Append entries to a site's hash-chained audit log.

    Parameters
    ----------
    path : path
        The log file (created on the first entry; its folder must exist or be creatable).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._prev: str | None = None

    def _last_hash(self) -> str:
        if self._prev is not None:
            return self._prev
        if not self.path.exists():
            return GENESIS
        last = GENESIS
        with self.path.open("rb") as handle:
            for line in handle:
                if line.strip():
                    last = json.loads(line)["hash"]
        return last

    def append(self, kind: str, **facts: Any) -> str:
        """Append one entry of ``kind`` with ``facts``; return its hash."""
        prev = self._last_hash()
        entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "kind": kind,
                 **facts, "prev": prev}
        digest = _digest(prev, entry)
        line = json.dumps({**entry, "hash": digest}, sort_keys=True) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        self._prev = digest
        return digest


@dataclass
class AuditSummary:
    """What a verified log says: its entries by kind, what left, and where it broke."""

    entries: int = 0
    kinds: Counter = field(default_factory=Counter)
    refused: Counter = field(default_factory=Counter)
    federations: set[str] = field(default_factory=set)
    tensor_releases: int = 0
    tensor_names: set[str] = field(default_factory=set)
    epsilon: dict[str, float] = field(default_factory=dict)
    broken_at: int | None = None
    reason: str = ""

    @property
    def intact(self) -> bool:
        """Return whether every line chains to the one before it."""
        return self.broken_at is None

    def text(self, path: Path) -> str:
        """Return the summary as a data-protection officer reads it."""
        lines = [f"Audit log {path}: {self.entries} entries, "
                 + ("chain intact." if self.intact
                    else f"CHAIN BROKEN at line {self.broken_at}: {self.reason}.")]
        lines.append(f"Federations: {', '.join(sorted(self.federations)) or 'none'}.")
        for kind, count in sorted(self.kinds.items()):
            lines.append(f"  {kind}: {count}")
        for reason, count in self.refused.most_common(5):
            lines.append(f"  refused x{count}: {reason[:160]}")
        lines.append(f"Tensors sent: {self.tensor_releases} updates of "
                     f"{len(self.tensor_names)} shared tensors (names, shapes and norms "
                     "logged; no values).")
        if not any(".running_" in n or n.endswith("num_batches_tracked")
                   for n in self.tensor_names):
            lines.append("No batch-norm statistics ever left the site.")
        else:
            lines.append("WARNING: batch-norm statistics left the site.")
        for fid, eps in sorted(self.epsilon.items()):
            lines.append(f"DP epsilon spent in {fid}: {eps:.3f}")
        return "\n".join(lines)


def verify(path: str | Path) -> AuditSummary:
    """Check every line's hash and link; return the summary (``broken_at`` on a break)."""
    path = Path(path)
    summary = AuditSummary()
    prev = GENESIS
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                entry = json.loads(raw)
                digest = entry.pop("hash")
            except (ValueError, KeyError, AttributeError):
                summary.broken_at, summary.reason = number, "not an entry of this log"
                return summary
            if entry.get("prev") != prev:
                summary.broken_at, summary.reason = number, "it does not follow the line before"
                return summary
            if _digest(prev, entry) != digest:
                summary.broken_at, summary.reason = number, "its contents were changed"
                return summary
            prev = digest
            summary.entries += 1
            kind = str(entry.get("kind"))
            summary.kinds[kind] += 1
            if entry.get("federation"):
                summary.federations.add(str(entry["federation"]))
            if entry.get("refused"):
                summary.refused[str(entry["refused"])] += 1
            if kind == "sent" and entry.get("tensors"):
                summary.tensor_releases += 1
                summary.tensor_names.update(t["name"] for t in entry["tensors"])
            if isinstance(entry.get("dp_epsilon"), (int, float)) and entry.get("federation"):
                summary.epsilon[str(entry["federation"])] = float(entry["dp_epsilon"])
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    """Verify a site's audit log and print its summary; exit 1 when the chain is broken."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path, help="a site's <site>.audit.jsonl")
    args = parser.parse_args(argv)
    if not args.log.is_file():
        print(f"error: no audit log {args.log}", file=sys.stderr)
        return 2
    summary = verify(args.log)
    print(summary.text(args.log))
    return 0 if summary.intact else 1


if __name__ == "__main__":
    sys.exit(main())
