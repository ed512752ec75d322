"""What the server and a site say to each other, typed: one class per message and direction.

A message is one :func:`~fedbn_med.federation.records.pack` record of tensors and
sections; this module names the sections and their keys once, for both sides:
:class:`TrainInstruction` and :class:`EvaluateInstruction` (server to site, ``config``),
:class:`SiteFacts` (the query reply, ``info``), :class:`TrainResult` (a train reply's
``metrics``, ``eval`` and ``state``; its tensors are the update) and
:class:`EvaluateResult` (the evaluate reply's scores, ``metrics``).

Each has ``sections()`` (what :func:`pack` takes; ``content()`` packs them) and
``from_payload`` (what :func:`~fedbn_med.federation.records.unpack` gave, parsed).
Parsing is the first check of what came from the network: a missing key, a value of
the wrong type (a bool where a number belongs), NaN or a value out of range raises a
``ValueError`` naming the key and what was expected, so the receiver refuses that one
message. Which metric names a reply may carry, and their ranges, depend on the task:
the server checks those (:mod:`.server.checks`). This module imports nothing of the
server nor of the ClientApp: both import it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fedbn_med.federation.names import NAME_RULE, is_plain_name
from fedbn_med.federation.records import Payload, Scalar, pack

if TYPE_CHECKING:
    import torch
    from flwr.app import RecordDict

__all__ = [
    "CONFIG", "DEVICE", "EVAL", "EVALUATE_FIRST", "INFO", "INPUT_SHAPE", "LOCAL_EPOCHS",
    "MAX_NORM", "METRICS", "NUM_EXAMPLES", "NUM_TRAIN", "PRIVATE_HASH", "RESUMED_ROUND",
    "ROUND", "SCALE", "SELECTED_ROUND", "SETUPS", "SITE", "STATE",
    "EvaluateInstruction", "EvaluateResult", "SiteFacts", "SiteState", "TrainInstruction",
    "TrainResult", "config_round",
]

Sections = Mapping[str, Mapping[str, object]]

#: Sections: the server's instruction, a site's facts, a train reply's training metrics
#: (an evaluate reply's scores), its scores of the previous round's model, its state.
CONFIG, INFO, METRICS, EVAL, STATE = "config", "info", "metrics", "eval", "state"
#: Keys
ROUND, LOCAL_EPOCHS, EVALUATE_FIRST = "round", "local-epochs", "evaluate-first"
SELECTED_ROUND = "selected-round"
#: Config keys of a train message under SecAgg: the round's largest count, the norm bound
SCALE = "secagg-scale"
MAX_NORM = "secagg-max-norm"
SITE, INPUT_SHAPE, NUM_TRAIN = "site", "input-shape", "num-train"
RESUMED_ROUND, PRIVATE_HASH, DEVICE = "resumed-round", "private-hash", "device"
#: The metric that weighs a site's update; the count of the site's set-ups.
NUM_EXAMPLES = "num-examples"
SETUPS = "setups"

# A site's state hash is a SHA-256 in hex (fedbn_med.checkpoint.state_hash).
_HASH = re.compile(r"[0-9a-f]{64}")
_MAX_DIMS = 8
_MAX_DEVICE = 64


def _whole(value: object, low: int | None = None) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and (
        low is None or value >= low)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _refuse(key: str, value: object, expected: str) -> ValueError:
    if value is None:
        return ValueError(f"its {key} is missing (expected {expected})")
    return ValueError(f"its {key} {repr(value)[:40]} is not {expected}")


def _hash(value: object) -> str:
    if not isinstance(value, str) or not (value == "" or _HASH.fullmatch(value)):
        raise ValueError(f"its {PRIVATE_HASH} {str(value)[:70]!r} is not a SHA-256 in hex")
    return value


def _only(sections: Sections, allowed: tuple[str, ...], what: str) -> None:
    unknown = sorted(set(sections) - set(allowed))
    if unknown:
        names = " and ".join(filter(None, (", ".join(allowed[:-1]), allowed[-1])))
        raise ValueError(f"its reply holds sections {[s[:40] for s in unknown[:3]]} ({what} "
                         f"holds only {names})")


def _numbers(section: str, values: Mapping[str, object]) -> dict[str, float]:
    for name, value in values.items():
        if not _number(value):
            raise ValueError(f"its metric {str(name)[:60]!r} ({section}) is "
                             f"{type(value).__name__}, not a number")
    return dict(values)  # type: ignore[arg-type]


def config_round(payload: Payload) -> int | None:
    """Return the round a server's message names, or None (for logs; never raises)."""
    rnd = payload.sections.get(CONFIG, {}).get(ROUND)
    return rnd if _whole(rnd) else None  # type: ignore[return-value]


# -- server to site ------------------------------------------------------------------------
@dataclass(frozen=True)
class TrainInstruction:
    """A train message's ``config``: what the server asks of a site this round.

    Attributes
    ----------
    round : int or None
        The round (None: the site trains its next round).
    local_epochs : int or None
        The epochs the run asks for (the site's policy bounds them).
    evaluate_first : bool
        Whether the site first scores the weights it receives (the previous round's).
    selected_round : int
        The best round scored so far (0: none), whose private layers a site keeps.
    secagg_scale, secagg_max_norm : float or None
        Under SecAgg: the round's largest count and the update norm bound.
    """

    round: int | None = None
    local_epochs: int | None = None
    evaluate_first: bool = False
    selected_round: int = 0
    secagg_scale: float | None = None
    secagg_max_norm: float | None = None

    def sections(self) -> dict[str, dict[str, Scalar]]:
        """Return the message's sections, for :func:`pack`."""
        config: dict[str, Scalar] = {}
        if self.round is not None:
            config[ROUND] = self.round
        if self.local_epochs is not None:
            config[LOCAL_EPOCHS] = self.local_epochs
        config[EVALUATE_FIRST] = self.evaluate_first
        config[SELECTED_ROUND] = self.selected_round
        for key, value in ((SCALE, self.secagg_scale), (MAX_NORM, self.secagg_max_norm)):
            if value is not None:
                config[key] = value
        return {CONFIG: config}

    def content(self, tensors: Mapping[str, torch.Tensor] | None = None) -> RecordDict:
        """Return the message content: ``tensors`` with this instruction."""
        return pack(tensors, **self.sections())

    @classmethod
    def from_payload(cls, payload: Payload) -> TrainInstruction:
        """Return the instruction a train message carries, checked.

        Raises
        ------
        ValueError
            Naming the key whose value is not what an honest server sends.
        """
        config = payload.sections.get(CONFIG, {})
        rnd = config.get(ROUND)
        if rnd is not None and not _whole(rnd):
            raise _refuse(ROUND, rnd, "a whole number (the round it trains)")
        epochs = config.get(LOCAL_EPOCHS)
        if epochs is not None and not _whole(epochs):
            raise _refuse(LOCAL_EPOCHS, epochs, "a whole number of epochs")
        first = config.get(EVALUATE_FIRST, False)
        if not isinstance(first, bool):
            raise _refuse(EVALUATE_FIRST, first, "true or false")
        selected = config.get(SELECTED_ROUND, 0)
        if not _whole(selected, 0):
            raise _refuse(SELECTED_ROUND, selected, "a whole number from 0 (0: none)")
        secagg: list[float | None] = []
        for key in (SCALE, MAX_NORM):
            value = config.get(key)
            if value is not None and not (_number(value) and math.isfinite(value)  # type: ignore[arg-type]
                                          and value > 0):  # type: ignore[operator]
                raise _refuse(key, value, "a positive finite number")
            secagg.append(value)  # type: ignore[arg-type]
        return cls(rnd, epochs, first, selected, *secagg)  # type: ignore[arg-type]


@dataclass(frozen=True)
class EvaluateInstruction:
    """The final evaluate message's ``config``.

    Its round is the round of the model it carries; its selected round, the best round
    scored so far (0: none), whose private layers a site keeps.
    """

    round: int
    selected_round: int = 0

    def sections(self) -> dict[str, dict[str, Scalar]]:
        """Return the message's sections, for :func:`pack`."""
        return {CONFIG: {ROUND: self.round, SELECTED_ROUND: self.selected_round}}

    def content(self, tensors: Mapping[str, torch.Tensor] | None = None) -> RecordDict:
        """Return the message content: ``tensors`` with this instruction."""
        return pack(tensors, **self.sections())

    @classmethod
    def from_payload(cls, payload: Payload) -> EvaluateInstruction:
        """Return the instruction an evaluate message carries, checked.

        Raises
        ------
        ValueError
            When its round is not a whole number, or its selected round not one from 0.
        """
        config = payload.sections.get(CONFIG, {})
        rnd = config.get(ROUND)
        if not _whole(rnd):
            raise _refuse(ROUND, rnd, "a whole number (the round of the model it carries)")
        selected = config.get(SELECTED_ROUND, 0)
        if not _whole(selected, 0):
            raise _refuse(SELECTED_ROUND, selected, "a whole number from 0 (0: none)")
        return cls(rnd, selected)  # type: ignore[arg-type]


# -- site to server ------------------------------------------------------------------------
@dataclass(frozen=True)
class SiteFacts:
    """What a node says about itself in its query reply (``info``)."""

    site: str
    input_shape: tuple[int, ...]
    #: what the site says it trains on (SecAgg's scale without a registry)
    num_train: int = 0
    resumed_round: int = 0
    private_hash: str = ""
    device: str = ""

    def sections(self) -> dict[str, dict[str, Scalar]]:
        """Return the reply's sections, for :func:`pack`."""
        return {INFO: {SITE: self.site, INPUT_SHAPE: [int(d) for d in self.input_shape],
                       NUM_TRAIN: self.num_train, RESUMED_ROUND: self.resumed_round,
                       PRIVATE_HASH: self.private_hash, DEVICE: self.device}}

    def content(self) -> RecordDict:
        """Return the reply's content."""
        return pack(None, **self.sections())

    @classmethod
    def from_payload(cls, payload: Payload) -> SiteFacts:
        """Return what a query reply says: the site, its data's shape, what it resumed.

        Raises
        ------
        ValueError
            When the reply is malformed: a site name that is not letters, digits, '-' or
            '_' (at most 64), a shape that is not a few whole numbers from 1, a resumed
            round or a count that is not a whole number from 0, a private hash that is not
            a SHA-256, or a device that is not a short string.
        """
        info = payload.sections.get(INFO, {})
        site = info.get(SITE)
        if not is_plain_name(site):
            raise ValueError(f"its site name {repr(site)[:70]} is not {NAME_RULE}")
        shape = info.get(INPUT_SHAPE)
        if not isinstance(shape, list) or not 0 < len(shape) <= _MAX_DIMS \
                or not all(_whole(d, 1) for d in shape):
            raise ValueError(f"its {INPUT_SHAPE} {str(shape)[:70]} is not 1 to {_MAX_DIMS} "
                             "whole numbers from 1")
        resumed = info.get(RESUMED_ROUND)
        if not _whole(resumed, 0):
            raise _refuse(RESUMED_ROUND, resumed, "a whole number from 0")
        digest = _hash(info.get(PRIVATE_HASH, ""))
        count = info.get(NUM_TRAIN, 0)
        if not _whole(count, 0):
            raise _refuse(NUM_TRAIN, count, "a whole number from 0")
        device = info.get(DEVICE, "")
        if not isinstance(device, str) or len(device) > _MAX_DEVICE:
            raise _refuse(DEVICE, device, f"a string of at most {_MAX_DEVICE} characters")
        return cls(site, tuple(shape), count, resumed, digest, device)  # type: ignore[arg-type]


@dataclass(frozen=True)
class SiteState:
    """A train reply's ``state``: the hash of the site's private layers, and the round."""

    private_hash: str = ""
    round: int = 0


@dataclass(frozen=True)
class TrainResult:
    """A train reply's sections (its tensors are the update).

    Attributes
    ----------
    num_examples : float
        The count that weighs the update (checked by
        :func:`fedbn_med.fl.reply_checks.num_examples_reason`).
    metrics : dict of str to float
        The training metrics besides it (``train_loss``, ``setups``, the ``dp_*``).
    evals : dict of str to float or None
        The scores of the previous round's model, when the site sends them.
    state : SiteState or None
        The site's state after the round, when the reply holds it.
    """

    num_examples: float
    metrics: dict[str, float] = field(default_factory=dict)
    evals: dict[str, float] | None = None
    state: SiteState | None = None

    def sections(self) -> dict[str, dict[str, Scalar]]:
        """Return the reply's sections, for :func:`pack`."""
        out: dict[str, dict[str, Scalar]] = {} if self.evals is None else {
            EVAL: dict(self.evals)}
        out[METRICS] = {NUM_EXAMPLES: self.num_examples, **self.metrics}
        if self.state is not None:
            out[STATE] = {PRIVATE_HASH: self.state.private_hash, ROUND: self.state.round}
        return out

    def content(self, tensors: Mapping[str, torch.Tensor] | None = None) -> RecordDict:
        """Return the reply's content: the update ``tensors`` with these sections."""
        return pack(tensors, **self.sections())

    @classmethod
    def from_payload(cls, payload: Payload) -> TrainResult:
        """Return a train reply's sections, checked (see :meth:`from_sections`)."""
        return cls.from_sections(payload.sections)

    @classmethod
    def from_sections(cls, sections: Sections) -> TrainResult:
        """Return a train reply's sections, checked.

        Raises
        ------
        ValueError
            When the reply holds another section, lacks ``num-examples``, holds a state
            key other than ``private-hash`` and ``round``, a hash that is not a SHA-256,
            a state round that is not a whole number, or a metric that is not a number.
        """
        _only(sections, (METRICS, EVAL, STATE), "a train reply")
        metrics = sections.get(METRICS, {})
        if NUM_EXAMPLES not in metrics:
            raise ValueError(f"its {METRICS} section lacks {NUM_EXAMPLES}")
        raw = sections.get(STATE)
        state = None
        if raw is not None:
            extra = sorted(set(raw) - {PRIVATE_HASH, ROUND})
            if extra:
                raise ValueError(f"its {STATE} section holds {[s[:40] for s in extra[:3]]} "
                                 f"(expected only {PRIVATE_HASH} and {ROUND})")
            digest = _hash(raw.get(PRIVATE_HASH, ""))
            rnd = raw.get(ROUND, 0)
            if not _whole(rnd):
                raise ValueError(f"its {STATE} {ROUND} is {type(rnd).__name__}, not a whole "
                                 "number")
            state = SiteState(digest, rnd)  # type: ignore[arg-type]
        numbers = _numbers(METRICS, metrics)
        evals = _numbers(EVAL, sections[EVAL]) if EVAL in sections else None
        count = numbers.pop(NUM_EXAMPLES)
        return cls(count, numbers, evals, state)


@dataclass(frozen=True)
class EvaluateResult:
    """An evaluate reply: the scores of the final model (none under DP)."""

    scores: dict[str, float] = field(default_factory=dict)

    def sections(self) -> dict[str, dict[str, Scalar]]:
        """Return the reply's sections, for :func:`pack`."""
        return {METRICS: dict(self.scores)}

    def content(self) -> RecordDict:
        """Return the reply's content."""
        return pack(None, **self.sections())

    @classmethod
    def from_payload(cls, payload: Payload) -> EvaluateResult:
        """Return an evaluate reply's scores, checked (see :meth:`from_sections`)."""
        return cls.from_sections(payload.sections)

    @classmethod
    def from_sections(cls, sections: Sections) -> EvaluateResult:
        """Return an evaluate reply's scores, checked.

        Raises
        ------
        ValueError
            When the reply holds a section other than ``metrics``, or a score that is
            not a number.
        """
        _only(sections, (METRICS,), "an evaluate reply")
        return cls(_numbers(EVAL, sections.get(METRICS, {})))
