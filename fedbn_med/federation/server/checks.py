"""Checks on what a site's message says besides its weights, before the server keeps any of it.

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

__all__ = ["MAX_ENTRIES", "MAX_LOSS", "SCORE_RANGES", "SPLITS", "TRAIN_METRICS",
           "WHOLE_SCORES", "evaluate_reason", "metrics_reason", "score_names", "train_reason"]

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
_REQUIRED = ("num-examples", "train_loss")

# A site's state hash is a SHA-256 in hex (fedbn_med.checkpoint.state_hash).
_HASH = re.compile(r"[0-9a-f]{64}")
# fedbn_med.evaluation.metrics.METRIC_NAMES, written out so that the server's checks import no numpy
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
