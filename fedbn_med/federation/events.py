"""Typed events between the processes of a federation, one JSON object per line.

The launcher learns what its processes do from these events, never from their log text:

- over the site host's stdin and stdout: :class:`ForkRequest` in, :class:`HostReady`,
  :class:`SiteForked`, :class:`HostRefused` and :class:`SiteExited` out;
- over each site's event pipe (for a forked site, a copy of the host's stdout):
  :class:`NodeReady`, :class:`NodeLost` and :class:`NodeFailed`;
- in the run's ``progress.jsonl`` file, written by the ServerApp: the progress events
  (:class:`Ready`, :class:`Joined`, :class:`Trained`, :class:`Round`, :class:`Done`, ...).

Every event is a frozen dataclass with a ``kind``; :func:`encode` writes one line and
:func:`decode` reads it back into the right class. A line of an unknown kind decodes to
:class:`Unknown`, so a newer writer does not break an older reader.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

__all__ = [
    "Done", "Event", "ForkRequest", "HostReady", "HostRefused", "Joined", "NodeFailed",
    "EvaluationRefused", "NodeLost", "NodeReady", "Ready", "Rejoined", "Round", "RunFailed",
    "ServerStarted", "SiteError", "SiteExited", "SiteForked", "SiteRefused", "Trained",
    "TrackingReady", "TrackingWarm", "Unknown", "UpdateRefused", "append_event", "decode",
    "emit", "encode", "kinds", "read_events",
]

# A pipe write of at most this many bytes is atomic (POSIX PIPE_BUF): several site
# processes can share one pipe without their lines interleaving.
PIPE_ATOMIC = 4096
_REASON_MAX = 1500

_KINDS: dict[str, type[Event]] = {}
E = TypeVar("E", bound="Event")


def _register(cls: type[E]) -> type[E]:
    _KINDS[cls.kind] = cls
    return cls


def kinds() -> dict[str, type[Event]]:
    """Return every event class :func:`decode` knows, by the name it is written under."""
    return dict(_KINDS)


@dataclass(frozen=True)
class Event:
    """Base of every event; ``t`` is the wall-clock time it was made."""

    kind: ClassVar[str] = ""
    t: float = field(default_factory=time.time, kw_only=True)

    def as_dict(self) -> dict[str, Any]:
        """Return the event as a plain dict, its kind under ``"event"``."""
        return {"event": self.kind, **{f.name: getattr(self, f.name)
                                      for f in dataclasses.fields(self)}}


# -- site host and site nodes ------------------------------------------------------------
@_register
@dataclass(frozen=True)
class ForkRequest(Event):
    """Launcher to site host: fork a site process running the node with ``argv``."""

    kind: ClassVar[str] = "fork"
    argv: list[str]
    log: str
    env: dict[str, str] = field(default_factory=dict)


@_register
@dataclass(frozen=True)
class HostReady(Event):
    """The site host has loaded the training stack and takes fork requests."""

    kind: ClassVar[str] = "host-ready"
    pid: int
    cuda_initialized: bool


@_register
@dataclass(frozen=True)
class SiteForked(Event):
    """The site host forked a site process (answer to a :class:`ForkRequest`)."""

    kind: ClassVar[str] = "site-forked"
    pid: int
    cuda_initialized: bool


@_register
@dataclass(frozen=True)
class HostRefused(Event):
    """The site host could not serve a request."""

    kind: ClassVar[str] = "host-refused"
    reason: str


@_register
@dataclass(frozen=True)
class SiteExited(Event):
    """A forked site process ended with ``code`` (negative: killed by that signal)."""

    kind: ClassVar[str] = "site-exited"
    pid: int
    code: int


@_register
@dataclass(frozen=True)
class NodeReady(Event):
    """A site node registered with the SuperLink and waits for messages."""

    kind: ClassVar[str] = "node-ready"
    site: str
    node_id: int
    pid: int


@_register
@dataclass(frozen=True)
class NodeLost(Event):
    """A site node lost the SuperLink and is connecting again."""

    kind: ClassVar[str] = "node-lost"
    site: str
    reason: str
    pid: int


@_register
@dataclass(frozen=True)
class NodeFailed(Event):
    """A site node cannot serve (no server, bad settings) and is about to exit."""

    kind: ClassVar[str] = "node-failed"
    site: str
    reason: str
    pid: int


# -- progress of a run (the ServerApp's progress.jsonl) ------------------------------------
@_register
@dataclass(frozen=True)
class ServerStarted(Event):
    """The ServerApp started."""

    kind: ClassVar[str] = "server-started"


@_register
@dataclass(frozen=True)
class TrackingWarm(Event):
    """The tracking store is open."""

    kind: ClassVar[str] = "tracking-warm"


@_register
@dataclass(frozen=True)
class TrackingReady(Event):
    """The run's tracking runs exist."""

    kind: ClassVar[str] = "tracking-ready"


@_register
@dataclass(frozen=True)
class Ready(Event):
    """The expected sites (or enough of them) are connected."""

    kind: ClassVar[str] = "ready"
    sites: list[str]


@_register
@dataclass(frozen=True)
class Joined(Event):
    """A site's node answered the query and takes part.

    ``resumed_round`` is the round whose private state the site resumed (0: none), or -1
    when a waiting node took over its site without a fresh query (:class:`Rejoined`).
    """

    kind: ClassVar[str] = "joined"
    site: str
    node: int
    resumed_round: int
    private_hash: str = ""


@_register
@dataclass(frozen=True)
class Rejoined(Joined):
    """A site known before came back on a new node."""

    kind: ClassVar[str] = "rejoined"


@_register
@dataclass(frozen=True)
class SiteError(Event):
    """A node failed to start its site."""

    kind: ClassVar[str] = "site-error"
    node: int
    reason: str


@_register
@dataclass(frozen=True)
class SiteRefused(Event):
    """A node's claim to be a site was refused (wrong key, data that do not fit, or served).

    ``node`` is None only in files written before the field existed.
    """

    kind: ClassVar[str] = "site-refused"
    site: str
    reason: str
    node: int | None = None


@_register
@dataclass(frozen=True)
class UpdateRefused(Event):
    """A site's update was left out of a round's average."""

    kind: ClassVar[str] = "update-refused"
    round: int
    site: str
    reason: str


@_register
@dataclass(frozen=True)
class Trained(Event):
    """A round's training is aggregated and checkpointed."""

    kind: ClassVar[str] = "trained"
    round: int
    seconds: float
    empty_polls: int
    sites: list[str]
    missing: list[str]
    private_hashes: dict[str, str] = field(default_factory=dict)
    #: each accepted site's share of the average, and every checked update's norm
    shares: dict[str, float] = field(default_factory=dict)
    norms: dict[str, float] = field(default_factory=dict)
    exchanges: int = 1  #: messages sent to the sites and awaited, together (SecAgg+: stages)


@_register
@dataclass(frozen=True)
class Round(Event):
    """A round is complete: training and evaluation metrics of every site."""

    kind: ClassVar[str] = "round"
    round: int
    sites: dict[str, dict[str, float]]


@_register
@dataclass(frozen=True)
class EvaluationRefused(Event):
    """A site's final scores were refused; the run's results go on without them."""

    kind: ClassVar[str] = "evaluation-refused"
    site: str
    reason: str


@_register
@dataclass(frozen=True)
class Done(Event):
    """The run finished; its results are written."""

    kind: ClassVar[str] = "done"
    table: str


@_register
@dataclass(frozen=True)
class RunFailed(Event):
    """The ServerApp stopped on an error."""

    kind: ClassVar[str] = "failed"
    reason: str


@dataclass(frozen=True)
class Unknown(Event):
    """An event of a kind this reader does not know, kept as it came."""

    kind: ClassVar[str] = "unknown"
    name: str = ""
    fields: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """Return the event as it was written."""
        return {"event": self.name, **self.fields, "t": self.t}


# -- wire format ---------------------------------------------------------------------------
def encode(event: Event) -> str:
    """Return the event as one JSON line (with its newline)."""
    return json.dumps(event.as_dict(), default=float, separators=(",", ":")) + "\n"


def decode(line: str | bytes | Mapping[str, Any], strict: bool = True) -> Event:
    """Return the event a line (or an already parsed dict) holds.

    With ``strict`` off, an event whose fields do not fit its class (a writer newer than
    this reader) comes back as :class:`Unknown` instead of raising.

    Raises
    ------
    ValueError
        When the line is not a JSON object with an ``"event"`` name, or (``strict``) its
        fields do not fit the class of that name.
    """
    data = json.loads(line) if isinstance(line, (str, bytes)) else dict(line)
    if not isinstance(data, dict) or not isinstance(data.get("event"), str):
        raise ValueError(f"Expected a JSON object with an 'event' name, got {str(line)[:200]!r}.")
    name = data.pop("event")
    cls = _KINDS.get(name)
    try:
        if cls is None:
            raise ValueError(f"Unknown event '{name}'. Known events: {', '.join(sorted(_KINDS))}.")
        names = {f.name for f in dataclasses.fields(cls)}
        unexpected = sorted(set(data) - names)
        if unexpected:
            raise ValueError(f"Event '{name}' has unexpected fields {unexpected}; "
                             f"expected {sorted(names)}.")
        try:
            return cls(**data)
        except TypeError as err:
            raise ValueError(f"Event '{name}' does not fit {cls.__name__}: {err}") from err
    except ValueError:
        if strict and cls is not None:
            raise
        t = data.pop("t", time.time())
        return Unknown(name=name, fields=data, t=float(t))


def emit(fd: int, event: Event) -> bool:
    """Write one event to a pipe in a single atomic write; return False if it is closed.

    Long reasons are shortened so the line stays within an atomic pipe write.
    """
    line = encode(event).encode()
    if len(line) > PIPE_ATOMIC and hasattr(event, "reason"):
        short = str(event.reason)[:_REASON_MAX] + " [...]"
        line = encode(dataclasses.replace(event, reason=short)).encode()  # type: ignore[call-arg]
    try:
        os.write(fd, line)
    except OSError:  # the reader is gone (the launcher stopped)
        return False
    return True


def shorten(reason: str) -> str:
    """Return ``reason`` cut to a length that fits an event on a pipe."""
    return reason if len(reason) <= _REASON_MAX else reason[:_REASON_MAX] + " [...]"


def read_events(source: Path | Iterable[str | bytes], strict: bool = True) -> list[Event]:
    """Return the events of a JSON-lines file (a run's ``progress.jsonl``) or of lines.

    Blank lines are skipped. Pass ``strict=False`` to read as the launcher follows a run:
    an event whose fields do not fit its class (a newer writer) comes back as :class:`Unknown`.
    """
    lines = Path(source).read_text().splitlines() if isinstance(source, Path) else source
    return [decode(line, strict=strict) for line in lines if line.strip()]


def append_event(path: Path, event: Event) -> None:
    """Append one event to a JSON-lines file (the run's ``progress.jsonl``).

    The line goes out in one ``write`` on a file opened for appending, so events written
    by two threads (the server's rounds and its tracking thread) never interleave.
    """
    line = encode(event).encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        written = os.write(fd, line)
        while written < len(line):  # a short write (a full disk, a signal): finish the line
            written += os.write(fd, line[written:])
    finally:
        os.close(fd)
