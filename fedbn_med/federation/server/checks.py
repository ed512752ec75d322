"""What a site's message holds, decoded and checked before the server keeps any of it.

Every reply the server reads passes through here: :func:`read_query` (who a node says it
is), :func:`read_train` (a round's update, metrics and scores) and :func:`read_evaluate`
(the final scores). Each returns plain checked values or raises ``ValueError`` saying
why, so the server refuses that one reply and goes on.

A reply's weights and example count are checked by :mod:`fedbn_med.fl.rounds`, for every
engine; this module checks what only the server takes from the network: the sections of
a reply (parsed by their types of :mod:`fedbn_med.federation.wire`, the schema the sites
share) and the metric names and values that go to the checkpoint, ``progress.jsonl``
and MLflow. A site may send only the metrics its task defines
(:attr:`fedbn_med.tasks.Task.score_metrics` on each split, and the training metrics of
:data:`TRAIN_METRICS`), each a number inside its range; anything else is refused, with
the reason, and never stored.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedbn_med.federation.records import unpack
from fedbn_med.federation.wire import (
    EVAL,
    METRICS,
    NUM_EXAMPLES,
    SETUPS,
    EvaluateResult,
    SiteFacts,
    TrainResult,
)
from fedbn_med.fl.rounds import Reply
from fedbn_med.fl.scaffold import split_controls

if TYPE_CHECKING:
    from flwr.app import Message, RecordDict

__all__ = ["MAX_ENTRIES", "MAX_LOSS", "SCORE_RANGES", "SPLITS", "TRAIN_METRICS",
           "WHOLE_SCORES", "SiteFacts", "TrainReply", "claimed_site", "error_reason",
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
    NUM_EXAMPLES: None,
    "train_loss": (0.0, MAX_LOSS, False),
    SETUPS: (1, 1e9, True),
    "dp_epsilon": (0.0, 1e6, False), "dp_delta": (0.0, 1.0, False),
    "dp_noise": (0.0, 1e6, False), "dp_clip": (0.0, 1e6, False),
    "dp_epsilon_replace_one": (0.0, 1e6, False), "dp_seeded": (0, 1, True),
}
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
        allowed = TRAIN_METRICS if section == METRICS else allowed_scores
        for name, value in metrics.items():
            if not isinstance(name, str) or name not in allowed:
                return (f"its {section} section names a metric {str(name)[:60]!r}, which the "
                        f"task does not define (valid: {', '.join(sorted(allowed))})")
            if section == METRICS:
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
    try:
        _train_result(sections, scores)
    except ValueError as err:
        return str(err)
    return None


def _train_result(sections: Mapping[str, Mapping[str, object]],
                  scores: Collection[str] | None) -> TrainResult:
    # the sections, their keys and the values' types (a DP site sends no train_loss), then
    # the task's metric names and ranges
    result = TrainResult.from_sections(sections)
    reason = metrics_reason({s: sections[s] for s in (METRICS, EVAL) if s in sections},
                            scores)
    if reason is not None:
        raise ValueError(reason)
    return result


def evaluate_reason(sections: Mapping[str, Mapping[str, object]],
                    scores: Collection[str] | None = None) -> str | None:
    """Return why an evaluate reply is refused, or None: it holds only scores (``metrics``)."""
    try:
        _evaluate_result(sections, scores)
    except ValueError as err:
        return str(err)
    return None


def _evaluate_result(sections: Mapping[str, Mapping[str, object]],
                     scores: Collection[str] | None) -> EvaluateResult:
    result = EvaluateResult.from_sections(sections)
    reason = metrics_reason({EVAL: sections.get(METRICS, {})}, scores)
    if reason is not None:
        raise ValueError(reason)
    return result


# -- decoding a reply ----------------------------------------------------------------------
#: The longest reason or error text a site's reply may put in a log line or an event.
MAX_REASON = 500


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


def read_query(content: RecordDict) -> SiteFacts:
    """Return what a query reply says: the site, its data's shape, what it resumed.

    Raises
    ------
    ValueError
        When the reply is malformed (:meth:`~fedbn_med.federation.wire.SiteFacts.from_payload`).
    """
    return SiteFacts.from_payload(unpack(content))


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
    result = _train_result(payload.sections, scores)
    metrics = {k: float(v) for k, v in result.metrics.items()}
    fits = {"num_examples": float(result.num_examples),
            **({"train_loss": metrics["train_loss"]} if "train_loss" in metrics else {}),
            "setups": metrics.get(SETUPS, 0.0),
            # the (epsilon, delta) a DP site has spent, for its MLflow run
            **{k: v for k, v in metrics.items() if k.startswith("dp_")}}
    weights, controls = split_controls(payload.tensors)
    evals = ({k: float(v) for k, v in result.evals.items()} if result.evals is not None
             else None)
    digest = result.state.private_hash if result.state is not None else None
    # the count is checked by close_round (fedbn_med.fl.rounds.num_examples_reason)
    update = Reply(site, weights, float(result.num_examples), controls=controls)
    return TrainReply(update, fits, evals, digest)


def read_evaluate(content: RecordDict, scores: Collection[str]) -> dict[str, float]:
    """Return an evaluate reply's scores, checked.

    Raises
    ------
    ValueError
        Naming what is wrong (:func:`evaluate_reason`, or the message cannot be decoded).
    """
    result = _evaluate_result(unpack(content).sections, scores)
    return {k: float(v) for k, v in result.scores.items()}
