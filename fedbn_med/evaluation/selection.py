"""Which round a run reports, and its scores there: the protocol's selection rule.

:func:`best_round` is the rule every engine and benchmark applies: the round with the
lowest mean validation loss over the sites, the earliest on ties, never a round in
which some site's model broke; :class:`RunningBest` applies it one round at a time
while a run goes on (to keep that round's weights); :func:`scores_at` gives each
site's score at a round and their mean. Means are exactly rounded sums, so they do not
depend on the order the sites' rows came in.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

__all__ = ["Rule", "RunningBest", "best_round", "scores_at", "select_round"]

logger = logging.getLogger("fedbn_med.evaluation.comparison")


def _site_rows(rows: Iterable[Mapping[str, object]], rnd: int) -> dict[str, Mapping]:
    return {str(r["site"]): r for r in rows if int(r["round"]) == rnd}  # type: ignore[call-overload]


def _mean_over_sites(rows: Iterable[Mapping[str, object]], rnd: int, key: str) -> float:
    values = [float(r[key]) for r in _site_rows(rows, rnd).values()
              if key in r and math.isfinite(float(r[key]))]
    # fsum is exactly rounded, so the mean is the same whatever order the sites' rows came
    # in (over Flower, the order their replies arrived): ties between rounds stay ties
    return math.fsum(values) / len(values) if values else math.nan


def best_round(rows: Sequence[Mapping[str, object]], metric: str = "loss", *,
               lower: bool | None = None) -> int:
    """Return the round with the best mean validation ``metric`` over the sites.

    Parameters
    ----------
    rows : sequence of mapping
        The run's per-round, per-site rows (``round``, ``site``, ``val_<metric>``).
    metric : str
        The validation metric; a task's is its ``Task.selection.metric``.
    lower : bool, optional
        Whether lower is better; by default ``loss`` is best when lowest and any other
        metric when highest.

    Returns
    -------
    int
        The best round, the earliest on ties. A round in which some site's validation
        score is NaN or infinite (its model broke there) is never selected, and a warning
        names the sites. Rows without a validation loss fall back to the validation
        accuracy; a run without validation scores (no site has a validation split) to
        its last round.
    """
    rounds = sorted({int(r["round"]) for r in rows})  # type: ignore[call-overload]
    if not rounds:
        raise ValueError("A run with no rounds has no best round.")
    lower = metric == "loss" if lower is None else lower
    sign = -1.0 if lower else 1.0
    key = f"val_{metric}"
    best, best_value = rounds[-1], -math.inf
    broken: dict[int, list[str]] = {}
    for rnd in rounds:
        bad = sorted(site for site, r in _site_rows(rows, rnd).items()
                     if key in r and not math.isfinite(float(r[key])))
        if bad:
            broken[rnd] = bad
            continue
        value = sign * _mean_over_sites(rows, rnd, key)
        if math.isfinite(value) and value > best_value:
            best, best_value = rnd, value
    if broken:
        first = min(broken)
        logger.warning("%s of NaN or infinity in %d of %d rounds (first: round %d, sites "
                       "%s): those rounds cannot be selected.", key, len(broken), len(rounds),
                       first, ", ".join(broken[first]))
    if metric == "loss" and best_value == -math.inf:
        if broken:
            logger.warning("No round has a finite %s at every site: selecting by validation "
                           "accuracy instead.", key)
        return best_round(rows, "accuracy")
    return best


class Rule(Protocol):
    """A task's selection rule (:class:`fedbn_med.tasks.Selection` is one)."""

    @property
    def metric(self) -> str: ...  # noqa: D102

    @property
    def lower(self) -> bool: ...  # noqa: D102


def select_round(rows: Sequence[Mapping[str, object]], rule: Rule | None = None) -> int:
    """Return :func:`best_round` by the task's ``rule`` (None: the lowest validation loss)."""
    return best_round(rows) if rule is None else best_round(rows, rule.metric, lower=rule.lower)


class RunningBest:
    """The best round so far by :func:`best_round`'s rule, taken one round at a time.

    For keeping the selected round's weights while a run goes on: :meth:`take` says
    whether the round just scored is the best so far (the best mean of the validation
    ``metric`` over the sites, lowest when ``lower``, the earliest on ties, a round with
    a non-finite site score never). It covers :func:`best_round`'s ordinary case only:
    where that falls back (no round with a finite score) this keeps none, and ``best``
    stays 0.
    """

    def __init__(self, metric: str = "loss", lower: bool = True) -> None:
        self.key, self.sign = f"val_{metric}", 1.0 if lower else -1.0
        self.best = 0
        self._value = math.inf  # sign * mean: lower is better

    @classmethod
    def by(cls, rule: Rule | None) -> RunningBest:
        """Return one for the task's ``rule`` (None: the lowest validation loss)."""
        return cls() if rule is None else cls(rule.metric, rule.lower)

    def take(self, rnd: int, sites: Iterable[Mapping[str, object]]) -> bool:
        """Take round ``rnd``'s per-site metrics; return whether it is the best so far."""
        values = []
        for metrics in sites:
            if self.key in metrics:
                value = float(metrics[self.key])  # type: ignore[arg-type]
                if not math.isfinite(value):
                    return False  # its model broke at some site: never selected
                values.append(value)
        if not values:
            return False
        mean = self.sign * math.fsum(values) / len(values)  # as _mean_over_sites
        if mean < self._value:
            self.best, self._value = rnd, mean
            return True
        return False


def scores_at(rows: Sequence[Mapping[str, object]], rnd: int, metric: str
              ) -> dict[str, float]:
    """Return each site's test ``metric`` at round ``rnd``, and their ``"mean"``."""
    per_site = {site: float(r[f"test_{metric}"])
                for site, r in _site_rows(rows, rnd).items() if f"test_{metric}" in r}
    finite = [v for v in per_site.values() if math.isfinite(v)]
    return {**per_site, "mean": math.fsum(finite) / len(finite) if finite else math.nan}
