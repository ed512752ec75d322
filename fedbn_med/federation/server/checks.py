"""What a site's message holds, decoded and checked before the server keeps any of it.

Every reply the server reads passes through here: :func:`read_query` (who a node says it
is), :func:`read_train` (a round's update, metrics and scores) and :func:`read_evaluate`
(the final scores). Each returns plain checked values or raises ``ValueError`` saying
why, so the server refuses that one reply and goes on.

A reply's weights and example count are checked by :mod:`fedbn_med.fl.rounds`, for every
engine; this module checks what only the server takes from the network: the sections of
a reply and the metric names and values that go to the checkpoint, ``progress.jsonl``
and MLflow. A site may send only the metrics its task defines
(:attr:`fedbn_med.tasks.Task.score_metrics` on each split, and the training metrics of
:data:`TRAIN_METRICS`), each a number inside its range; anything else is refused, with
the reason, and never stored.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from fedbn_med.federation.names import NAME_RULE, is_plain_name
from fedbn_med.federation.records import unpack
from fedbn_med.fl.rounds import Reply
from fedbn_med.fl.scaffold import split_controls

if TYPE_CHECKING:
    from flwr.app import Message, RecordDict

__all__ = ["MAX_ENTRIES", "MAX_LOSS", "SCORE_RANGES", "SPLITS", "TRAIN_METRICS",
           "WHOLE_SCORES", "SiteInfo", "TrainReply", "claimed_site", "error_reason",
           "evaluate_reason", "metrics_reason", "read_evaluate", "read_query", "read_train",
           "refusal", "score_names", "train_reason"]

#: The largest loss the server takes (sites cap theirs far lower before sending them).
MAX_LOSS = 1e4

#: A section holding more entries than this is refused before any name is read.
MAX_ENTRIES = 64

#: The splits a site scores; a score is named ``<split>_<metric>``.
SPLITS = ("val", "test")

#: Range of each score, by metric (``dice_<class>`` takes ``dice``'s), and whether NaN
#: is allowed: it means "undefined" (AUC on one class, Dice of an absent class), which
#: MLflow's means skip.
SCORE_RANGES: dict[str, tuple[float, float, bool]] = {
    "accuracy": (0.0, 1.0, False), "balanced_accuracy": (0.0, 1.0, False),
    "auc": (0.0, 1.0, True), "f1": (0.0, 1.0, False), "dice": (0.0, 1.0, True),
    "aji": (0.0, 1.0, False),  # aggregated Jaccard index (task histo)
    "loss": (0.0, MAX_LOSS, False),
    # subjects scored (as fedbn_med.fl.rounds.MAX_EXAMPLES bounds the training count), the
    # share predicted positive, and what predicting the training majority scores
    "n": (1.0, 1e9, False), "positive_rate": (0.0, 1.0, False),
    "majority_rate": (0.0, 1.0, False),
}

#: The scores that are counts: a whole number, or the reply is refused.
WHOLE_SCORES = frozenset({"n"})

#: What a train reply's ``metrics`` section may hold: name -> (low, high, whole number).
#: ``num-examples`` is checked by :func:`fedbn_med.fl.rounds.num_examples_reason`.
TRAIN_METRICS: dict[str, tuple[float, float, bool] | None] = {
    "num-examples": None,
    "train_loss": (0.0, MAX_LOSS, False),
    "setups": (1, 1e9, True),
    "dp_epsilon": (0.0, 1e6, False), "dp_delta": (0.0, 1.0, False),
    "dp_noise": (0.0, 1e6, False), "dp_clip": (0.0, 1e6, False),
    "dp_epsilon_replace_one": (0.0, 1e6, False), "dp_seeded": (0, 1, True),
}
#: A DP site sends no ``train_loss`` (un-noised, it would read its BN layers back).
_REQUIRED = ("num-examples",)

# A site's state hash is a SHA-256 in hex (fedbn_med.checkpoint.state_hash).
_HASH = re.compile(r"[0-9a-f]{64}")
# fedbn_med.evaluation.metrics.METRIC_NAMES, written out so that the server's checks import no
# evaluation code
_DEFAULT_SCORES = ("accuracy", "balanced_accuracy", "auc", "f1", "loss", "n", "positive_rate",
                   "majority_rate")


def score_names(metrics: Collection[str] = _DEFAULT_SCORES) -> frozenset[str]:
    """Return the score names a site may send for a task's ``metrics`` (on every split)."""
    return frozenset(f"{split}_{m}" for split in SPLITS for m in metrics)


def _score_range(name: str) -> tuple[float, float, bool] | None:
    metric = name.partition("_")[2]
    return SCORE_RANGES.get(metric) or SCORE_RANGES.get(metric.partition("_")[0])


def _value_reason(where: str, name: str, value: object,
                  bounds: tuple[float, float, bool] | None, *, nan_ok: bool = False,
                  whole: bool = False) -> str | None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return f"its metric '{name}' ({where}) is {type(value).__name__}, not a number"
    if bounds is None:
        return None
    low, high = bounds[0], bounds[1]
    if math.isnan(value) and nan_ok:
        return None
    if not math.isfinite(value) or not low <= value <= high or (whole and value != int(value)):
        kind = "a whole number" if whole else "a finite number"
        return (f"its metric '{name}' ({where}) is {value!r} (expected {kind} from {low:g} "
                f"to {high:g}{', or NaN for undefined' if nan_ok else ''})")
    return None


def metrics_reason(sections: Mapping[str, Mapping[str, object]],
                   scores: Collection[str] | None = None) -> str | None:
    """Return why a reply's metric names or values are refused, or None.

    Parameters
    ----------
    sections : mapping
        A section (``metrics``: training metrics; ``eval``: scores) to its raw metrics.
        Outside a train reply, ``metrics`` holds scores: pass it as ``eval``.
    scores : collection of str, optional
        The score names the task defines (:func:`score_names`); default: the
        classification tasks' names.
    """
    allowed_scores = frozenset(score_names() if scores is None else scores)
    for section, metrics in sections.items():
        if len(metrics) > MAX_ENTRIES:
            return (f"its {section} section holds {len(metrics)} metrics (at most "
                    f"{MAX_ENTRIES}; the task defines {len(allowed_scores)} scores)")
        allowed = TRAIN_METRICS if section == "metrics" else allowed_scores
        for name, value in metrics.items():
            if not isinstance(name, str) or name not in allowed:
                return (f"its {section} section names a metric {str(name)[:60]!r}, which the "
                        f"task does not define (valid: {', '.join(sorted(allowed))})")
            if section == "metrics":
                bounds = TRAIN_METRICS[name]
                reason = _value_reason(section, name, value, bounds,
                                       whole=bool(bounds and bounds[2]))
            else:
                bounds = _score_range(name)
                reason = _value_reason(section, name, value, bounds,
                                       nan_ok=bool(bounds and bounds[2]),
                                       whole=name.partition("_")[2] in WHOLE_SCORES)
            if reason is not None:
                return reason
    return None


def train_reason(sections: Mapping[str, Mapping[str, object]],
                 scores: Collection[str] | None = None) -> str | None:
    """Return why a train reply's sections are refused, or None.

    A train reply holds ``metrics`` (with ``num-examples`` and ``train_loss``), maybe
    ``eval`` (the scores of the previous round's model) and ``state`` (the hash of the
    site's private state and the round), nothing else.
    """
    unknown = sorted(set(sections) - {"metrics", "eval", "state"})
    if unknown:
        return (f"its reply holds sections {[s[:40] for s in unknown[:3]]} (a train reply "
                "holds only metrics, eval and state)")
    metrics = sections.get("metrics", {})
    missing = [name for name in _REQUIRED if name not in metrics]
    if missing:
        return f"its metrics section lacks {', '.join(missing)}"
    state = sections.get("state", {})
    extra = sorted(set(state) - {"private-hash", "round"})
    if extra:
        return (f"its state section holds {[s[:40] for s in extra[:3]]} (expected only "
                "private-hash and round)")
    digest = state.get("private-hash", "")
    if not isinstance(digest, str) or not (digest == "" or _HASH.fullmatch(digest)):
        return f"its private-hash {str(digest)[:70]!r} is not a SHA-256 in hex"
    rnd = state.get("round", 0)
    if not isinstance(rnd, int) or isinstance(rnd, bool):
        return f"its state round is {type(rnd).__name__}, not a whole number"
    return metrics_reason({s: sections[s] for s in ("metrics", "eval") if s in sections},
                          scores)


def evaluate_reason(sections: Mapping[str, Mapping[str, object]],
                    scores: Collection[str] | None = None) -> str | None:
    """Return why an evaluate reply is refused, or None: it holds only scores (``metrics``)."""
    unknown = sorted(set(sections) - {"metrics"})
    if unknown:
        return (f"its reply holds sections {[s[:40] for s in unknown[:3]]} (an evaluate reply "
                "holds only metrics)")
    return metrics_reason({"eval": sections.get("metrics", {})}, scores)


# -- decoding a reply ----------------------------------------------------------------------
#: The longest reason or error text a site's reply may put in a log line or an event.
MAX_REASON = 500
_MAX_DIMS = 8


@dataclass(frozen=True)
class SiteInfo:
    """What a node says about itself in its query reply, checked."""

    site: str
    input_shape: tuple[int, ...]
    resumed_round: int
    private_hash: str
    num_train: int = 0  # what the site says it trains on (SecAgg's scale without a registry)


@dataclass(frozen=True)
class TrainReply:
    """A train reply that passed every check here (its weights are checked by the round)."""

    update: Reply
    #: the round's training row: num_examples, train_loss, setups and the dp_* metrics
    fits: dict[str, float]
    #: the scores of the previous round's model, when the reply holds them
    evals: dict[str, float] | None
    #: the hash of the site's private state, when the reply holds its state section
    private_hash: str | None


def refusal(err: BaseException) -> str:
    """Return why a reply was refused, from the error decoding it raised, kept short."""
    why = str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"
    return why[:MAX_REASON]


def error_reason(reply: Message) -> str:
    """Return the error text a site's failed reply carries, kept short."""
    return str(reply.error.reason)[:MAX_REASON]


def _whole(value: object, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def read_query(content: RecordDict) -> SiteInfo:
    """Return what a query reply says: the site, its data's shape, what it resumed.

    Raises
    ------
    ValueError
        When the reply is malformed: a site name that is not letters, digits, '-' or '_'
        (at most 64), a shape that is not a few whole numbers from 1, a resumed round
        that is not a whole number from 0, or a private hash that is not a SHA-256.
    """
    info = unpack(content).section("info")
    site = info.get("site")
    if not is_plain_name(site):
        raise ValueError(f"its site name {repr(site)[:70]} is not {NAME_RULE}")
    shape = info.get("input-shape")
    if not isinstance(shape, list) or not 0 < len(shape) <= _MAX_DIMS \
            or not all(_whole(d, 1) for d in shape):
        raise ValueError(f"its input-shape {str(shape)[:70]} is not 1 to {_MAX_DIMS} whole "
                         "numbers from 1")
    resumed = info.get("resumed-round")
    if not _whole(resumed, 0):
        raise ValueError(f"its resumed-round {repr(resumed)[:40]} is not a whole number from 0")
    digest = info.get("private-hash", "")
    if not isinstance(digest, str) or not (digest == "" or _HASH.fullmatch(digest)):
        raise ValueError(f"its private-hash {str(digest)[:70]!r} is not a SHA-256 in hex")
    count = info.get("num-train", 0)
    if not _whole(count, 0):
        raise ValueError(f"its num-train {repr(count)[:40]} is not a whole number from 0")
    return SiteInfo(site, tuple(cast("list[int]", shape)), cast(int, resumed), digest,
                    cast(int, count))


def claimed_site(reply: Message) -> str | None:
    """Return the site a query reply names (None for an error or a malformed reply)."""
    if reply.has_error():
        return None
    try:
        return read_query(reply.content).site
    except ValueError:
        return None


def read_train(content: RecordDict, site: str, scores: Collection[str]) -> TrainReply:
    """Return a train reply's update, training row, scores and state hash, checked.

    Raises
    ------
    ValueError
        Naming what is wrong (:func:`train_reason`, or the message cannot be decoded).
    """
    payload = unpack(content)
    reason = train_reason(payload.sections, scores)
    if reason is not None:
        raise ValueError(reason)
    metrics = payload.floats("metrics")
    fits = {"num_examples": metrics["num-examples"],
            **({"train_loss": metrics["train_loss"]} if "train_loss" in metrics else {}),
            "setups": metrics.get("setups", 0.0),
            # the (epsilon, delta) a DP site has spent, for its MLflow run
            **{k: v for k, v in metrics.items() if k.startswith("dp_")}}
    weights, controls = split_controls(payload.tensors)
    evals = payload.floats("eval") if "eval" in payload.sections else None
    digest = (str(payload.section("state").get("private-hash", ""))
              if "state" in payload.sections else None)
    # the count is checked by close_round (fedbn_med.fl.rounds.num_examples_reason)
    update = Reply(site, weights, metrics["num-examples"], controls=controls)
    return TrainReply(update, fits, evals, digest)


def read_evaluate(content: RecordDict, scores: Collection[str]) -> dict[str, float]:
    """Return an evaluate reply's scores, checked.

    Raises
    ------
    ValueError
        Naming what is wrong (:func:`evaluate_reason`, or the message cannot be decoded).
    """
    payload = unpack(content)
    reason = evaluate_reason(payload.sections, scores)
    if reason is not None:
        raise ValueError(reason)
    return payload.floats("metrics")
