"""What a hospital's site prints while it serves a federation (``--site``).

An operator at a hospital sees, for every message the site answered, what came in and
what left the site: the tensors' names, their count and their bytes, and the names of
the numbers sent with them. Never a value: this is what a data-protection officer reads
to check that no normalisation layer left.
"""

from __future__ import annotations

from collections.abc import Callable

from flwr.app import Message
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key

from fedbn_med.federation.records import unpack
from fedbn_med.federation.wire import EVAL, INFO, METRICS, config_round

__all__ = ["SiteConsole"]

_WIRE_BYTES = {True: 4, False: 8}  # float32 and int64 on the wire (records.pack)


def _size(n_bytes: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n_bytes < 1024 or unit == "MiB":
            return f"{n_bytes:.0f} {unit}" if unit == "B" else f"{n_bytes:.1f} {unit}"
        n_bytes /= 1024  # type: ignore[assignment]
    return f"{n_bytes} B"  # pragma: no cover - the loop always returns


def _secagg_stage(reply: Message) -> str:
    """Say what a SecAgg+ stage's reply holds, from its keys (never their values)."""
    record = reply.content.config_records.get(RECORD_KEY_CONFIGS)
    keys = set(record) if record is not None else set()
    if Key.PUBLIC_KEY_1 in keys:
        return "setup: sent its public keys"
    if Key.CIPHERTEXT_LIST in keys:
        return "key sharing: sent its secrets' shares, encrypted for each other site"
    if Key.SHARE_LIST in keys:
        return "unmasking: sent the shares that remove the masks of the round's sum"
    return "stage: sent keys or key shares"


def _numbers(sections: dict[str, dict]) -> str:
    """Name the numbers a reply carries: scores by metric, the rest by name."""
    scores = {**sections.get(EVAL, {}), **sections.get(METRICS, {})}
    stems = sorted({k.split("_", 1)[1] for k in scores if k.startswith(("val_", "test_"))})
    others = sorted(k for k in scores if not k.startswith(("val_", "test_")))
    parts = []
    if stems:
        n = sum(k.startswith(("val_", "test_")) for k in scores)
        parts.append(f"{n} validation and test scores ({', '.join(stems)})")
    if others:
        parts.append(", ".join(others))
    return "; ".join(parts)


class SiteConsole:
    """Describe each reply of one site on one line (plus its tensor names when they change).

    Parameters
    ----------
    site : str
        The site's name, at the head of every line.
    write : callable
        Where a line goes (``print`` in the command line).
    """

    def __init__(self, site: str, write: Callable[[str], object]) -> None:
        self.site = site
        self.write = write
        self._last_names: tuple[str, ...] | None = None

    def joined(self, superlink: str, node_id: int) -> None:
        """Say that the site reached the server."""
        self.write(f"[{self.site}] joined the federation at {superlink} (node {node_id}); "
                   "waiting for the server's first round")

    def lost(self, reason: str) -> None:
        """Say that the server went away and the site tries again."""
        self.write(f"[{self.site}] lost the federation server ({reason}); reconnecting")

    def answered(self, message: Message, reply: Message) -> None:
        """Describe one answered message: its round, and what left the site."""
        kind = message.metadata.message_type.split(".")[0]
        try:
            number = config_round(unpack(message.content))
        except ValueError:
            number = None
        rnd = "?" if number is None else str(number)
        if reply.has_error():
            self.write(f"[{self.site}] round {rnd}: {kind} refused: {reply.error.reason}")
            return
        try:
            sent = unpack(reply.content)
        except ValueError:  # a SecAgg+ stage: keys or key shares, nothing of the site's data
            group = message.metadata.group_id  # the server's: printed only as a number
            rnd = group if group.isdecimal() and len(group) <= 9 else "?"
            self.write(f"[{self.site}] round {rnd}: SecAgg+ {_secagg_stage(reply)}")
            return
        if kind == "query":
            facts = ", ".join(sent.section(INFO))
            self.write(f"[{self.site}] told the server its site facts ({facts})")
            return
        names = tuple(sent.tensors)
        n_bytes = sum(t.numel() * _WIRE_BYTES[t.dtype.is_floating_point]
                      for t in sent.tensors.values())
        what = {"train": "trained", "evaluate": "scored the final model"}.get(kind, kind)
        line = f"[{self.site}] round {rnd}: {what}; sent {len(names)} tensors ({_size(n_bytes)})"
        if RECORD_KEY_CONFIGS in reply.content.config_records:
            line += " and its update masked (SecAgg+: the server sees only the sum)"
        numbers = _numbers(sent.sections)
        if numbers:
            line += f", {numbers}"
        self.write(line)
        if names and names != self._last_names:
            self.write(f"[{self.site}]   tensors sent: {', '.join(names)}")
            self._last_names = names

    def finished(self) -> None:
        """Say that the federation ended and the site stops."""
        self.write(f"[{self.site}] the federation has ended; this site stops "
                   "(--keep-serving waits for the next one)")
