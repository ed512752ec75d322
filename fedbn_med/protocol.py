"""The comparison protocol: folds x seeds, a round chosen on validation, paired intervals.

A comparison trains every strategy on every (fold, seed) cell. For each run it scores
each site's test split at two rounds:

- ``best``: the round whose mean validation accuracy over the sites is highest (the
  earliest such round), chosen without looking at any test split;
- ``last``: the final round.

Methods are then compared cell by cell: the difference FedBN - FedAvg (or any pair) of
the site-mean test accuracy is computed within each (fold, seed), and its mean gets a
95 % Student-t interval over the cells. Pairing removes what the cells share (the test
subjects of a fold, the initial weights of a seed), which is most of the variance.

The cells are not fully independent (the folds of one seed share subjects across their
training sets, and the seeds of a fold share its test set), so the interval is a guide,
not an exact test.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "AT", "Cell", "Comparison", "best_round", "format_interval", "format_stats", "interval",
    "scores_at",
]

#: The two rounds a run is scored at.
AT = ("best", "last")
_METRICS = ("accuracy", "auc")


def _site_rows(rows: Iterable[Mapping[str, object]], rnd: int) -> dict[str, Mapping]:
    return {str(r["site"]): r for r in rows if int(r["round"]) == rnd}  # type: ignore[arg-type]


def _mean_over_sites(rows: Iterable[Mapping[str, object]], rnd: int, key: str) -> float:
    values = [float(r[key]) for r in _site_rows(rows, rnd).values()  # type: ignore[arg-type]
              if key in r and math.isfinite(float(r[key]))]  # type: ignore[arg-type]
    return float(np.mean(values)) if values else math.nan


def best_round(rows: Sequence[Mapping[str, object]], metric: str = "accuracy") -> int:
    """Return the round with the best mean validation ``metric`` over the sites.

    Ties go to the earliest round. A run without validation scores (no site has a
    validation split) falls back to its last round.
    """
    rounds = sorted({int(r["round"]) for r in rows})  # type: ignore[call-overload]
    if not rounds:
        raise ValueError("A run with no rounds has no best round.")
    best, best_value = rounds[-1], -math.inf
    for rnd in rounds:
        value = _mean_over_sites(rows, rnd, f"val_{metric}")
        if math.isfinite(value) and value > best_value:
            best, best_value = rnd, value
    return best


def scores_at(rows: Sequence[Mapping[str, object]], rnd: int, metric: str
              ) -> dict[str, float]:
    """Return each site's test ``metric`` at round ``rnd``, and their ``"mean"``."""
    per_site = {site: float(r[f"test_{metric}"])  # type: ignore[arg-type]
                for site, r in _site_rows(rows, rnd).items() if f"test_{metric}" in r}
    finite = [v for v in per_site.values() if math.isfinite(v)]
    return {**per_site, "mean": float(np.mean(finite)) if finite else math.nan}


def interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """Return (mean, low, high): the mean and its Student-t interval.

    With fewer than two finite values the bounds are NaN.
    """
    from scipy import stats

    arr = np.array([v for v in values if math.isfinite(v)], dtype=float)
    if arr.size == 0:
        return math.nan, math.nan, math.nan
    mean = float(arr.mean())
    if arr.size < 2:
        return mean, math.nan, math.nan
    half = float(stats.t.ppf(0.5 + level / 2, arr.size - 1) * arr.std(ddof=1)
                 / math.sqrt(arr.size))
    return mean, mean - half, mean + half


@dataclass(frozen=True)
class Cell:
    """One run of a comparison: a strategy on one (fold, seed), scored at both rounds."""

    strategy: str
    fold: int
    seed: int
    best_round: int
    last_round: int
    #: scores[at][metric][site or "mean"]
    scores: dict[str, dict[str, dict[str, float]]]

    @classmethod
    def from_rows(cls, strategy: str, fold: int, seed: int,
                  rows: Sequence[Mapping[str, object]]) -> Cell:
        """Score a run's per-round rows at its best and its last round."""
        best = best_round(rows)
        last = max(int(r["round"]) for r in rows)  # type: ignore[call-overload]
        scores = {at: {m: scores_at(rows, rnd, m) for m in _METRICS}
                  for at, rnd in (("best", best), ("last", last))}
        return cls(strategy, fold, seed, best, last, scores)


@dataclass
class Comparison:
    """Every cell of a comparison, with its tables and its MLflow figures."""

    sites: tuple[str, ...]
    cells: list[Cell] = field(default_factory=list)

    def add(self, cell: Cell) -> None:
        """Add one run's cell."""
        self.cells.append(cell)

    @property
    def strategies(self) -> list[str]:
        """Return the strategies in the order they were first added."""
        return list(dict.fromkeys(c.strategy for c in self.cells))

    def values(self, strategy: str, at: str, metric: str, site: str = "mean"
               ) -> dict[tuple[int, int], float]:
        """Return ``{(fold, seed): score}`` of one strategy."""
        return {(c.fold, c.seed): c.scores[at][metric].get(site, math.nan)
                for c in self.cells if c.strategy == strategy}

    def difference(self, a: str, b: str, at: str, metric: str = "accuracy"
                   ) -> tuple[float, float, float, int]:
        """Return (mean, low, high, cells) of the paired difference a - b."""
        va, vb = self.values(a, at, metric), self.values(b, at, metric)
        diffs = [va[k] - vb[k] for k in va if k in vb]
        return (*interval(diffs), len(diffs))

    def pairs(self) -> list[tuple[str, str]]:
        """Return the differences reported: FedBN against FedAvg and SingleSet, if run."""
        names = {s.lower(): s for s in self.strategies}
        fedbn = names.get("fedbn")
        if fedbn is None:
            return []
        return [(fedbn, names[other]) for other in ("fedavg", "singleset") if other in names]

    # -- tables --------------------------------------------------------------------------
    def table(self, at: str, metric: str = "accuracy") -> str:
        """Return a markdown table: per site and mean, mean [95 % CI] over the cells, in %."""
        header = ["method", *self.sites, "mean"]
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for strategy in self.strategies:
            row = [strategy]
            for site in (*self.sites, "mean"):
                row.append(format_interval(list(self.values(strategy, at, metric, site)
                                                 .values())))
            lines.append("| " + " | ".join(row) + " |")
        return "\n".join(lines)

    def difference_table(self) -> str:
        """Return a markdown table of the paired differences (accuracy, AUC), in pp."""
        lines = ["| difference | metric | at | mean (pp) | 95 % CI (pp) | cells |",
                 "|---|---|---|---|---|---|"]
        for a, b in self.pairs():
            for metric in _METRICS:
                for at in AT:
                    mean, low, high, n = self.difference(a, b, at, metric)
                    lines.append(f"| {a} - {b} | {metric} | {at} | {100 * mean:+.1f} | "
                                 f"{_interval_text(low, high)} | {n} |")
        return "\n".join(lines)

    def report(self) -> str:
        """Return every table of the comparison, with how it was made."""
        folds = sorted({c.fold for c in self.cells})
        seeds = sorted({c.seed for c in self.cells})
        parts = [(f"{len(folds)} fold(s) x {len(seeds)} seed(s) = {len(folds) * len(seeds)} "
                  "cells per method; each cell in %: mean [95 % CI] over the cells.")]
        for metric in _METRICS:
            for at in AT:
                where = ("at the round with the best mean validation accuracy"
                         if at == "best" else "at the last round")
                parts.append(f"Test {metric} {where}:\n\n{self.table(at, metric)}")
        if self.pairs():
            parts.append("Paired differences of the site-mean test scores, cell by cell:"
                         "\n\n" + self.difference_table())
        rounds = [c.best_round for c in self.cells]
        parts.append(f"Best-validation rounds: median {int(np.median(rounds))}, range "
                     f"{min(rounds)} to {max(rounds)} (last round {self.cells[0].last_round}).")
        return "\n\n".join(parts)

    def metrics(self) -> dict[str, float]:
        """Return the comparison's figures as flat MLflow metrics."""
        out: dict[str, float] = {}
        for strategy in self.strategies:
            key = _metric_name(strategy)
            for metric in _METRICS:
                for at in AT:
                    mean, low, high = interval(list(self.values(strategy, at, metric)
                                                    .values()))
                    out.update({f"{key}.{metric}.{at}": mean, f"{key}.{metric}.{at}.ci_low": low,
                                f"{key}.{metric}.{at}.ci_high": high})
        for a, b in self.pairs():
            key = f"{_metric_name(a)}_minus_{_metric_name(b)}"
            for metric in _METRICS:
                for at in AT:
                    mean, low, high, _ = self.difference(a, b, at, metric)
                    out.update({f"{key}.{metric}.{at}": mean,
                                f"{key}.{metric}.{at}.ci_low": low,
                                f"{key}.{metric}.{at}.ci_high": high})
        return {k: v for k, v in out.items() if math.isfinite(v)}

    def rows(self) -> list[dict[str, object]]:
        """Return one flat row per cell (for a CSV)."""
        return [{"strategy": c.strategy, "fold": c.fold, "seed": c.seed,
                 "best_round": c.best_round, "last_round": c.last_round,
                 **{f"{metric}_{at}_{site}": round(value, 6)
                    for at in AT for metric in _METRICS
                    for site, value in c.scores[at][metric].items()}}
                for c in self.cells]


def _metric_name(label: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in label)


def _interval_text(low: float, high: float) -> str:
    if not (math.isfinite(low) and math.isfinite(high)):
        return "n/a (one cell)"
    return f"[{100 * low:+.1f}, {100 * high:+.1f}]"


def format_stats(mean: float, low: float, high: float, *, scale: float = 100.0,
                 digits: int = 1, signed: bool = False) -> str:
    """Format ``mean [low, high]`` (times ``scale``: percent by default).

    Without bounds (one value) only the mean is written; without a mean, ``n/a``.
    """
    if not math.isfinite(mean):
        return "n/a"
    spec = f"{'+' if signed else ''}.{digits}f"
    if not (math.isfinite(low) and math.isfinite(high)):
        return f"{scale * mean:{spec}}"
    return f"{scale * mean:{spec}} [{scale * low:{spec}}, {scale * high:{spec}}]"


def format_interval(values: Sequence[float], **options: object) -> str:
    """Format the mean of ``values`` and its 95 % interval (:func:`format_stats` options)."""
    return format_stats(*interval(values), **options)  # type: ignore[arg-type]
