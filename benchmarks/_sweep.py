"""The benchmarks' grid: one swept setting x strategies x (fold, seed) cells, paired by cell.

A benchmark varies one setting (its *axis*: a share of the data, a site effect, local
epochs; or none) and runs every strategy on every (fold, seed) cell of the invocation at
each value. :func:`run_grid` runs that grid and yields each run with its key;
:func:`sweep` scores each run as the comparison protocol does
(:meth:`fedbn_med.evaluation.comparison.Cell.from_rows`: best-validation and last round)
and returns one :class:`~fedbn_med.evaluation.comparison.Comparison` per axis value, so
that scores are keyed by (fold, seed) and two strategies pair by cell, never by the
position of a run in a list (:func:`fedbn_med.evaluation.pairing.paired_differences`).

The figures of a table are ``mean [corrected 95 % CI]`` over the cells (:func:`summary`,
:func:`gap`, or :func:`corrected` for values a benchmark collects itself; formatted by
:func:`fedbn_med.evaluation.tables.format_stats`), and its caption says so in the words
of :func:`interval_caption`: the corrected resampled t of Nadeau and Bengio, since the
cells share subjects. ``ci="naive"`` (the t-interval that treats the cells as
independent) is kept for ``interval_design.py``'s comparison of the two.
"""

from __future__ import annotations

import gzip
import math
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypeVar

import numpy as np
from _common import N_FOLDS, Benchmark, scratch_dir
from _plots import bar_plot

from fedbn_med.evaluation.comparison import Cell, Comparison, interval
from fedbn_med.evaluation.intervals import corrected_t_interval

if TYPE_CHECKING:
    from fedbn_med.api.result import FederationResult
    from fedbn_med.evaluation.references import ScoredOn
    from fedbn_med.spec import RunSpec
    from fedbn_med.tasks.abide.sites import SiteConfig
    from fedbn_med.tasks.abide.splits import Split
    from fedbn_med.training.trainer import SiteData

__all__ = ["Interval", "corrected", "gap", "half_width", "inner_datas", "inner_references",
           "interval_caption", "one_class_sites", "publish_site_comparison",
           "reference_caption", "references", "run_grid", "summary", "sweep"]

V = TypeVar("V", bound=Hashable)
#: Which interval a table gives: the corrected resampled t, or the naive t over cells.
Interval = Literal["corrected", "naive"]
#: The headline score of the sweeps.
METRIC = "balanced_accuracy"


def run_grid(bench: Benchmark, axis: Sequence[V], strategies: Sequence[str],
             spec: Callable[[V, str, int, int], RunSpec], *,
             data: Callable[[V, RunSpec], Mapping[str, SiteData]] | None = None,
             sites: Mapping[str, SiteConfig] | None = None, desc: str | None = None
             ) -> Iterator[tuple[V, str, int, int, FederationResult]]:
    """Run every (axis value, strategy, fold, seed) and yield it with its result.

    Parameters
    ----------
    bench : Benchmark
        The invocation: its cells (:attr:`Benchmark.cells`) and progress bar.
    axis : sequence
        The values of the swept setting (``(None,)`` for a benchmark without one).
    strategies : sequence of str
        Strategy names, in the order they run at each value.
    spec : callable
        ``spec(value, strategy, fold, seed)``: the run's settings.
    data : callable, optional
        ``data(value, spec)``: the sites' data to train on (e.g. a share of it); each
        run prepares its own when omitted.
    sites : mapping of site name to SiteConfig, optional
        Loaded from ``sites/`` when omitted.
    desc : str, optional
        The progress bar's label (default: the benchmark's name).
    """
    from fedbn_med import run

    grid = [(value, strategy, fold, seed) for value in axis for strategy in strategies
            for fold, seed in bench.cells]
    for value, strategy, fold, seed in bench.progress(grid, desc):
        config = spec(value, strategy, fold, seed)
        datas = data(value, config) if data is not None else None
        if sites is not None and tuple(sites) != config.sites:
            config = config.replace(sites=tuple(sites))
        yield value, strategy, fold, seed, run(config, data=datas, workdir=scratch_dir())


def sweep(bench: Benchmark, axis: Sequence[V], strategies: Sequence[str],
          spec: Callable[[V, str, int, int], RunSpec], *,
          data: Callable[[V, RunSpec], Mapping[str, SiteData]] | None = None,
          sites: Mapping[str, SiteConfig] | None = None) -> dict[V, Comparison]:
    """Run the grid (:func:`run_grid`) and return ``{axis value: Comparison}``.

    Each run becomes the :class:`Cell` of its strategy and (fold, seed) in its value's
    comparison, scored by its task's metrics at its best-validation round (the task's
    ``selection``) and its last round.
    """
    from fedbn_med.evaluation.runner import task_metrics
    from fedbn_med.tasks import get_task

    base = bench.config()
    names, metrics = tuple(base.sites), task_metrics(base.task)
    selection = get_task(base.task).selection
    comparisons = {value: Comparison(sites=names, metric_names=metrics) for value in axis}
    for value, strategy, fold, seed, history in run_grid(bench, axis, strategies, spec,
                                                         data=data, sites=sites):
        comparisons[value].add(Cell.from_rows(strategy, fold, seed, history.rows,
                                              metrics=metrics, selection=selection))
    return comparisons


def references(bench: Benchmark, *, scored_on: ScoredOn = "test", **changes: Any
               ) -> Comparison:
    """Return the majority-class and motion-only rows of the invocation's cells (ABIDE).

    Fitted per site on the training split of each (fold, seed) cell, as the comparison
    protocol fits them (:func:`fedbn_med.evaluation.references.add_reference_rows`), so
    a sweep's table can show them beside its methods on the same cells. ``changes``: to
    the invocation's spec (another federation's ``sites``, a cohort's ``site_effect``);
    ``scored_on="val"``: scored on the validation subjects, for tables that read no test
    split.
    """
    from fedbn_med.evaluation.references import add_reference_rows
    from fedbn_med.evaluation.runner import task_metrics

    base = bench.config(**changes)
    comparison = Comparison(sites=tuple(base.sites), metric_names=task_metrics(base.task))
    add_reference_rows(comparison, base, bench.cells, scored_on=scored_on)
    return comparison


def one_class_sites(cells: Iterable[Cell]) -> list[float]:
    """Return, per (cell, site), 1.0 where a reference row predicted one class only (at 0.5)."""
    return [float(np.all(p.prob >= 0.5) or np.all(p.prob < 0.5))
            for c in cells for p in c.predictions.values()]


def reference_caption(bench: Benchmark, metric: str = METRIC, *,
                      scored_on: ScoredOn = "test") -> str:
    """Return a caption line: the reference rows' ``metric`` on the same cells."""
    from fedbn_med.evaluation.comparison import REFERENCES
    from fedbn_med.evaluation.tables import format_stats

    rows = references(bench, scored_on=scored_on)
    parts = [f"{name} {format_stats(*corrected(rows.values(name, 'best', metric).values()))} %"
             for name in REFERENCES]
    where = "test" if scored_on == "test" else "validation"
    return (f"Reference rows on the same cells ({where} {metric.replace('_', ' ')}, site "
            "mean): " + "; ".join(parts))


def summary(comparison: Comparison, strategy: str, *, metric: str = METRIC,
            at: str = "best", ci: Interval = "corrected"
            ) -> tuple[float, float, float]:
    """Return (mean, low, high) of a strategy's site-mean score over the cells."""
    values = comparison.values(strategy, at, metric)
    if ci == "corrected":
        return comparison.corrected(values)
    return interval(list(values.values()))


def gap(comparison: Comparison, a: str, b: str, *, metric: str = METRIC, at: str = "best",
        ci: Interval = "corrected") -> tuple[float, float, float]:
    """Return (mean, low, high) of the difference a - b, paired by (fold, seed) cell."""
    mean, low, high, _ = comparison.difference(a, b, at, metric,
                                               corrected=ci == "corrected")
    return mean, low, high


def corrected(values: Iterable[float], *, n_folds: int = N_FOLDS, level: float = 0.95
              ) -> tuple[float, float, float]:
    """Return (mean, low, high) of per-cell values with the corrected resampled t.

    Each value is one (fold, seed) cell of ``n_folds``-fold cross-validation whose splits
    each repetition re-draws, so ``n_test / n_train = 1 / (n_folds - 1)`` (the ratio
    :attr:`Comparison.test_train_ratio` uses when cells carry no subject counts). NaN
    values are left out; with fewer than two the bounds are NaN (no interval).
    """
    if n_folds < 2:
        raise ValueError(f"n_folds must be at least 2 for a cross-validation interval, "
                         f"got {n_folds!r}.")
    return corrected_t_interval(list(values), 1.0 / (n_folds - 1), level)


def half_width(stats: tuple[float, float, float], scale: float = 100.0) -> float:
    """Return ``scale`` times the half-width of (mean, low, high): a plot's error bar.

    0 when there is no interval (one cell).
    """
    mean, _, high = stats
    return scale * (high - mean) if math.isfinite(high) and math.isfinite(mean) else 0.0


def interval_caption(cells: int, unit: str = "(fold, seed) cells", *,
                     n_folds: int = N_FOLDS) -> str:
    """Return how a table's figures are summarised, for its caption.

    ``mean [corrected 95 % CI] over N <unit>`` with the correction named, or, for a
    single cell, that the figure is one run's with no interval.
    """
    if cells < 2:
        return "1 run, no interval"
    return (f"mean [corrected 95 % CI] over {cells} {unit} (Nadeau-Bengio resampled t, "
            f"n_test/n_train = {1 / (n_folds - 1):.2f}: the cells share subjects)")


def publish_site_comparison(bench: Benchmark, specs: Mapping[str, RunSpec],
                            sites: Sequence[str], *, title: str, notes: str,
                            extra: Callable[[Comparison], str] | None = None,
                            workers: int = 1) -> int:
    """Run the comparison protocol on ``specs``; publish its table, predictions and plot.

    The plot shows each method's test balanced accuracy per site and on average at the
    best-validation round, with the corrected 95 % interval. ``extra`` adds a section
    to the report from the comparison (e.g. ``paper_table``'s verdict against the
    paper). ``workers``: processes that run the cells at once (the same numbers).
    Returns the exit status 0.
    """
    from fedbn_med.evaluation.report import csv_text
    from fedbn_med.evaluation.runner import run_comparison

    bench.runs += len(specs) * len(bench.cells)
    comparison = run_comparison(specs, bench.folds, bench.seeds, progress=True,
                                workers=workers)
    table = comparison.report()
    section = extra(comparison) if extra is not None else ""
    if section:
        table += "\n\n" + section
    bench.out.mkdir(parents=True, exist_ok=True)
    (bench.out / "predictions.csv").write_text(csv_text(comparison.prediction_rows()),
                                               encoding="utf-8")
    # Every run's own predictions, gzip without a time stamp in its header (the bytes
    # still depend on zlib's version; meta.json's hash is what is checked).
    rows = comparison.cell_prediction_rows()
    files = ({"cell_predictions.csv.gz": gzip.compress(csv_text(rows).encode("utf-8"),
                                                       mtime=0)} if rows else {})
    groups = [*sites, "mean"]

    def plot(path: Path) -> Path:
        series = {}
        for method in comparison.strategies:
            means, errs = [], []
            for site in groups:
                mean, _, high = comparison.corrected(
                    comparison.values(method, "best", METRIC, site))
                means.append(100 * mean)
                errs.append(100 * (high - mean) if not math.isnan(high) else 0.0)
            series[method] = (means, errs)
        return bar_plot(path, groups, series,
                        ylabel="test balanced accuracy (%), best-validation round, "
                               "corrected 95 % CI", title=title)

    bench.publish(table, comparison.rows(), plot, notes=notes, metrics=comparison.metrics(),
                  protocol="each run's result at its round with the lowest mean validation "
                           "loss; mean [95 % CI] over the cells, corrected for shared "
                           "subjects (Nadeau-Bengio)", check="comparison",
                  files=files)
    return 0


class _InnerSite(NamedTuple):
    """One site's inner split, with the labels, mean FD and features the references read."""

    split: Split
    labels: np.ndarray
    mean_fd: np.ndarray
    features: np.ndarray


def inner_references(sites: Sequence[str], spec: RunSpec, inner_folds: int, inner_fold: int,
                     *, scored_on: ScoredOn = "test") -> list[Cell]:
    """Return the majority-class and motion-only cells of one inner split (nested designs).

    Fitted on each site's inner training subjects and scored on its inner test subjects
    (or inner validation subjects), the split :func:`inner_datas` gives a run: no outer
    test subject is read.
    """
    from fedbn_med.evaluation.references import reference_cells

    return reference_cells(spec.fold, spec.seed,
                           _inner_splits(sites, spec, inner_folds, inner_fold),
                           scored_on=scored_on)


def _inner_splits(sites: Sequence[str], spec: RunSpec, inner_folds: int, inner_fold: int
                  ) -> dict[str, _InnerSite]:
    """Return each site's inner split of the outer fold ``spec.fold``, labels and mean FD."""
    from fedbn_med.tasks.abide.build import resolve_site_data_dir
    from fedbn_med.tasks.abide.data import load_site_features
    from fedbn_med.tasks.abide.sites import load_sites
    from fedbn_med.tasks.abide.splits import nested_split, repetition_split_seed

    out = {}
    for name, site in load_sites(list(sites)).items():
        feats = load_site_features(resolve_site_data_dir(site, spec), site.abide_site_ids,
                                   name=name)
        split = nested_split(feats.labels, n_folds=spec.n_folds, fold=spec.fold,
                             inner_folds=inner_folds, inner_fold=inner_fold,
                             seed=repetition_split_seed(site.split_seed, spec.seed))
        out[name] = _InnerSite(split, np.asarray(feats.labels),
                               np.asarray(feats.mean_fd, dtype=np.float64),
                               np.asarray(feats.features))
    return out


def inner_datas(sites: Sequence[str], spec: RunSpec, inner_folds: int, inner_fold: int
                ) -> dict[str, SiteData]:
    """Return each site's inner split of the outer fold ``spec.fold`` as SiteData.

    The run's feature options (tangent space, per-site z, windows, FD regression) are
    fitted on the inner training subjects (``prepare_site_data`` with the split).
    """
    from fedbn_med.tasks.abide.build import prepare_site_data
    from fedbn_med.tasks.abide.sites import load_sites

    configs = load_sites(list(sites))
    return {name: prepare_site_data(configs[name], spec, inner.split)
            for name, inner in _inner_splits(sites, spec, inner_folds, inner_fold).items()}
