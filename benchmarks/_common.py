"""Shared plumbing of the benchmark scripts: arguments, runs, summaries, outputs, MLflow.

Every script in ``benchmarks/`` parses the same options (:func:`make_parser`), runs its
grid of federations with :func:`fedbn_med.run` under a progress bar (:meth:`Benchmark.progress`;
the grid "axis x strategies x cells" is :func:`_sweep.sweep`'s) and hands one markdown
table (:func:`markdown_table`), its rows and a plot (:mod:`_plots`) to
:meth:`Benchmark.publish`, which writes ``table.md``, ``table.csv`` and ``plot.png`` into
the output folder, logs them to MLflow as one parent run and prints the table and the
wall time.

The library (torch, MLflow) is imported only when a benchmark runs, so that ``--help``
and option errors answer at once.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import json
import math
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm import tqdm

from fedbn_med.cli.argtypes import positive_int
from fedbn_med.evaluation.tables import markdown_table

if TYPE_CHECKING:
    from fedbn_med.api.result import FederationResult
    from fedbn_med.spec import RunSpec
    from fedbn_med.tasks import Task
    from fedbn_med.tasks.abide.sites import SiteConfig
    from fedbn_med.training.trainer import SiteData

__all__ = [
    "EXPERIMENT", "FEDPROX_MU", "LABELS", "N_FOLDS", "RESULTS_DIR", "Benchmark", "Budget",
    "curve", "float_list", "format_mean_std", "make_parser", "markdown_table", "mean_std",
    "prepare_all", "scratch_dir", "selected", "site_mean", "strategy_config",
]

BENCHMARK_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCHMARK_DIR / "results"
EXPERIMENT = "abide-benchmarks"
#: The task of the benchmarks' ``--sites``, ``--data-dir`` and default run spec.
TASK = "abide"
N_FOLDS = 5
FEDPROX_MU = 1e-2  # the paper's FedProx setting
LABELS = {"singleset": "SingleSet", "fedavg": "FedAvg", "fedprox": "FedProx",
          "fedbn": "FedBN", "centralized": "Centralized"}


@dataclass(frozen=True)
class Budget:
    """Size of one benchmark mode: communication rounds, folds and seeds per fold."""

    rounds: int
    folds: int
    seeds: int = 1


def float_list(text: str) -> tuple[float, ...]:
    """Parse a comma-separated list of numbers (an argparse ``type``)."""
    try:
        values = tuple(float(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers such as 0,0.5,1, got {text!r}") from None
    if not values or not all(math.isfinite(v) for v in values):
        raise argparse.ArgumentTypeError(f"expected finite numbers, got {text!r}")
    return values


def site_names(text: str) -> tuple[str, ...]:
    """Parse a comma-separated list of site names (an argparse ``type``)."""
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text!r}")
    return names


def make_parser(name: str, description: str, *, full: Budget, quick: Budget
                ) -> argparse.ArgumentParser:
    """Return the argument parser every benchmark shares; scripts add their own options."""
    parser = argparse.ArgumentParser(prog=f"benchmarks/{name}.py", description=description)
    parser.add_argument("--quick", action="store_true",
                        help=f"CI-sized run: {quick.rounds} rounds, {quick.folds} fold(s) and "
                             "a subset of the grid")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="folder holding ABIDE_pcp/ (real ABIDE); default: the built-in "
                             "cohort ($FEDBN_MED_DATA or ~/fedbn_med_data)")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"output folder (default: benchmarks/results/{name}/)")
    parser.add_argument("--tracking-uri", default=None,
                        help="MLflow store (default: $MLFLOW_TRACKING_URI, else the "
                             "repository's mlflow/mlflow.db)")
    parser.add_argument("--seed", type=int, default=0, help="model and shuffling seed")
    parser.add_argument("--rounds", type=positive_int, default=None,
                        help=f"communication rounds (default {full.rounds}; "
                             f"{quick.rounds} with --quick)")
    parser.add_argument("--folds", type=positive_int, default=None,
                        help=f"runs = test folds 0..N-1 of {N_FOLDS} (default {full.folds}; "
                             f"{quick.folds} with --quick)")
    parser.add_argument("--seeds", type=positive_int, default=None,
                        help=f"seeds per fold, from --seed on (default {full.seeds}; "
                             f"{quick.seeds} with --quick)")
    parser.add_argument("--device", default="auto", help="'auto', 'cpu' or 'cuda[:N]'")
    parser.add_argument("--sites", type=site_names, default=None,
                        help="comma-separated sites, files in sites/ (default: the script's "
                             "own, usually the run spec's NYU,UM,USM,UCLA); with --data-dir "
                             "any real sites, e.g. PITT,YALE,KKI,TRINITY")
    parser.add_argument("--publish", action="store_true",
                        help="also copy the results into benchmarks/published/ and rewrite "
                             "the README's block for them (see benchmarks/_published.py)")
    parser.set_defaults(benchmark=name, budget_full=full, budget_quick=quick)
    return parser


class Benchmark:
    """One invocation of a benchmark script: its settings, timer, outputs and MLflow run.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        Built by :func:`make_parser` (plus the script's own options).
    argv : sequence of str, optional
        Command-line arguments; None reads ``sys.argv``.
    """

    def __init__(self, parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> None:
        self.started = time.perf_counter()
        args = parser.parse_args(argv)
        self.argv = list(argv) if argv is not None else None
        budget: Budget = args.budget_quick if args.quick else args.budget_full
        args.rounds = args.rounds or budget.rounds
        args.folds = args.folds or budget.folds
        args.seeds = args.seeds or budget.seeds
        if args.folds > N_FOLDS:
            parser.error(f"--folds must be at most {N_FOLDS} (the folds of the split), "
                         f"got {args.folds}")
        if args.data_dir is not None:
            args.data_dir = args.data_dir.expanduser().resolve()
            if not (args.data_dir / "ABIDE_pcp").is_dir():
                parser.error(f"--data-dir must hold ABIDE_pcp/ (the ABIDE Preprocessed "
                             f"layout); {args.data_dir} does not")
        if args.sites is not None:
            if len(args.sites) < 2:
                parser.error(f"--sites must name at least two sites for a federation, got "
                             f"{','.join(args.sites)}")
            from fedbn_med.tasks import get_task

            try:
                get_task(TASK).check_sites(list(args.sites))
            except ValueError as err:
                parser.error(f"--sites: {err}")
        self.parser = parser
        self.args = args
        self.name: str = args.benchmark
        self.out: Path = (args.out or RESULTS_DIR / self.name).expanduser().resolve()
        self.runs = 0
        #: Several real federations in one table (``{"A": sites, ...}``): published as
        #: ``<name>-real``, its data described group by group.
        self.real_groups: Mapping[str, Sequence[str]] | None = None
        #: A run with other features than the default's (e.g. ``"tangent"``): its results
        #: and its published table get their own folder and key.
        self.variant: str | None = None
        #: What the data description leaves out (e.g. a built-in cohort made larger).
        self.data_note: str | None = None

    def set_variant(self, variant: str | None) -> None:
        """Publish and write this run apart from the default's (see :attr:`variant`)."""
        self.variant = variant
        if variant and self.args.out is None:
            self.out = (RESULTS_DIR / f"{self.name}-{variant}").resolve()

    @property
    def folds(self) -> range:
        """Return the test folds this invocation runs (one run each)."""
        return range(self.args.folds)

    @property
    def seeds(self) -> range:
        """Return the seeds each fold runs with (``--seed`` and the next ones)."""
        return range(self.args.seed, self.args.seed + self.args.seeds)

    @property
    def cells(self) -> list[tuple[int, int]]:
        """Return every (fold, seed) this invocation runs."""
        return [(fold, seed) for fold in self.folds for seed in self.seeds]

    def config(self, **changes: Any) -> RunSpec:
        """Return the run spec from the options, with ``changes`` applied."""
        from fedbn_med.spec import RunSpec

        base = RunSpec(rounds=self.args.rounds, seed=self.args.seed, n_folds=N_FOLDS,
                       data_dir=self.args.data_dir, device=self.args.device)
        if self.args.sites is not None:
            base = base.replace(sites=self.args.sites)
        return base.replace(**changes)

    def progress(self, grid: Sequence[Any], desc: str | None = None) -> Iterable[Any]:
        """Iterate over the grid under a tqdm progress bar (on stderr)."""
        self.runs += len(grid)
        return tqdm(grid, desc=desc or self.name, unit="run", dynamic_ncols=True)

    @property
    def wall_time(self) -> float:
        """Return the seconds since the benchmark started."""
        return time.perf_counter() - self.started

    def params(self) -> dict[str, object]:
        """Return the loggable settings of this invocation."""
        skip = {"budget_full", "budget_quick", "out", "tracking_uri"}
        return {k: (",".join(map(str, v)) if isinstance(v, tuple) else v)
                for k, v in vars(self.args).items() if k not in skip}

    def publish(self, table: str, rows: Sequence[Mapping[str, object]],
                plot: Callable[[Path], Path], notes: str = "",
                metrics: Mapping[str, float] | None = None, *, protocol: str = "",
                check: str = "none", files: Mapping[str, bytes] | None = None) -> Path:
        """Write, log and print the results; return the output folder.

        Parameters
        ----------
        table : str
            Markdown table (printed and written to ``table.md``).
        rows : sequence of mapping
            Machine-readable results, one dict per row (``table.csv``).
        plot : callable
            Draws the figure into the path it is given (``plot.png``).
        notes : str
            Text appended under the table in ``table.md`` (the settings that matter).
        metrics : mapping of str to float, optional
            Summary figures for the benchmark's MLflow run.
        protocol : str
            With ``--publish``: how the figures were selected and their interval, after
            the rounds, folds and repetitions (which are added here).
        check : str
            With ``--publish``: what the README test recomputes from the CSV
            (:func:`_published.publish`).
        files : mapping of str to bytes, optional
            Further files, by name, written beside ``table.csv`` (and published with it).
        """
        from _published import check_file_names

        check_file_names(files or {})  # before anything is written
        self.out.mkdir(parents=True, exist_ok=True)
        for file, content in (files or {}).items():
            (self.out / file).write_bytes(content)
        wall = self.wall_time
        mode = "quick" if self.args.quick else "full"
        footer = (f"\n\n{notes}\n" if notes else "\n") + (
            f"\n_{self.name} ({mode}): {self.runs} runs, --rounds {self.args.rounds}, "
            f"{self.args.folds} fold(s) x {self.args.seeds} seed(s) from seed "
            f"{self.args.seed}, wall time {wall:.1f} s._\n")
        (self.out / "table.md").write_text(table + footer, encoding="utf-8")
        from fedbn_med.evaluation.report import csv_text

        (self.out / "table.csv").write_text(csv_text(rows), encoding="utf-8")
        png = plot(self.out / "plot.png")
        summary = {"benchmark": self.name, "mode": mode, "runs": self.runs,
                   "wall_time_s": round(wall, 2), "params": self.params()}
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str),
                                               encoding="utf-8")
        self._log(table + footer, png, summary, metrics or {})
        if self.args.publish:
            self._publish(table + (f"\n\n{notes}" if notes else ""), csv_text(rows),
                          protocol, check, files or {})
        print(table)
        if notes:
            print(f"\n{notes}")
        print(f"\n{self.name}: {self.runs} runs in {wall:.1f} s wall time; "
              f"results in {self.out}")
        return self.out

    def data_description(self) -> tuple[str, tuple[str, ...]]:
        """Return which data this run used (in words) and its sites."""
        from _published import describe_data

        from fedbn_med.spec import RunSpec

        real = self.args.data_dir is not None
        if real and self.real_groups is not None:
            return ("real ABIDE Preprocessed (C-PAC, filt_noglobal, rois_ho), shared sites: "
                    + " and ".join(f"group {g} {', '.join(s)}"
                                   for g, s in self.real_groups.items())), ()
        sites = tuple(getattr(self.args, "sites", None) or RunSpec.for_task(TASK).sites)
        note = f"; {self.data_note}" if self.data_note else ""
        return describe_data(sites, real) + note, sites

    def _publish(self, report: str, csv: str, protocol: str, check: str,
                 files: Mapping[str, bytes]) -> None:
        from _published import publish, publish_key

        data, sites = self.data_description()
        real = self.args.data_dir is not None
        if real:  # the local folder means nothing elsewhere: the command says DATA_DIR
            report = report.replace(str(self.args.data_dir), "DATA_DIR")
        design = (f"{self.args.rounds} rounds, {self.args.folds} fold(s) x "
                  f"{self.args.seeds} repetition(s)")
        key = publish_key(self.name, sites if real else None, real, self.variant)
        folder = publish(key, name=self.name, argv=self.argv, report=report, csv_text=csv,
                         data=data, protocol=f"{design}{'; ' + protocol if protocol else ''}",
                         wall_time_s=self.wall_time, check=check, files=files)
        print(f"published to {folder}")

    def _log(self, table: str, png: Path, summary: Mapping[str, object],
             metrics: Mapping[str, float]) -> None:
        # Imported here so that --help and argument errors do not pay for MLflow.
        from fedbn_med.tracking import tracked

        with tracked(EXPERIMENT, self.name, self.params(), (),
                     tracking_uri=self.args.tracking_uri,
                     tags={"kind": "benchmark", "benchmark": self.name,
                           "mode": "quick" if self.args.quick else "full"}) as tracker:
            tracker.log_text(table, "table.md")
            tracker.log_file(self.out / "table.csv")
            tracker.log_file(png)
            tracker.log_text(json.dumps(summary, indent=2, default=str), "summary.json")
            tracker.log_metrics(metrics)


def strategy_config(bench: Benchmark, strategy: str, **changes: Any) -> RunSpec:
    """Return the run configuration of a strategy (FedProx gets the paper's mu)."""
    mu = FEDPROX_MU if strategy == "fedprox" else None
    return bench.config(strategy=strategy, mu=mu, **changes)


@functools.cache
def scratch_dir() -> Path:
    """Return this process's folder for each run's selected weights, removed at exit.

    :func:`fedbn_med.run` writes a run's selected weights where it is told (else into a
    new temporary folder each time); a benchmark reads its runs' scores, so every run
    writes over the previous one's files here.
    """
    folder = Path(tempfile.mkdtemp(prefix="fedbn-med-bench-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def prepare_all(config: RunSpec, sites: Mapping[str, SiteConfig] | None = None
                ) -> dict[str, SiteData]:
    """Return every site's splits for the configuration's fold (the task's ``site_data``)."""
    task = _task(config)
    if task.site_data is None:
        raise ValueError(f"Task '{config.task}' builds its sites' data inside build_site "
                         "only (its site_data is None); a benchmark cannot subsample them.")
    return {name: task.site_data(name, config) for name in (sites or config.sites)}


def _task(config: RunSpec) -> Task:
    from fedbn_med.tasks import get_task

    return get_task(config.task)


# -- summaries ------------------------------------------------------------------------------
def site_mean(history: FederationResult, metric: str = "test_accuracy",
              rnd: int | None = None) -> float:
    """Return the mean over sites of a metric at a round (default: the last)."""
    rnd = history.last_round if rnd is None else rnd
    vals = [float(r[metric]) for r in history.rows
            if int(r["round"]) == rnd and metric in r and not math.isnan(float(r[metric]))]
    return float(np.mean(vals)) if vals else math.nan


def selected(history: FederationResult, metric: str = "test_balanced_accuracy") -> float:
    """Return the mean over sites of a metric at the run's selected round.

    The selected round is the one with the lowest mean validation loss
    (:func:`fedbn_med.evaluation.comparison.best_round`): the run's result is that round's
    model, and no test split takes part in choosing it.
    """
    from fedbn_med.evaluation.comparison import best_round

    return site_mean(history, metric, best_round(history.rows))


def curve(history: FederationResult, metric: str = "test_accuracy") -> np.ndarray:
    """Return the mean over sites of a metric at each round 1..R."""
    return np.array([site_mean(history, metric, rnd)
                     for rnd in range(1, history.last_round + 1)])


def mean_std(values: Iterable[float]) -> tuple[float, float]:
    """Return the mean and (population) standard deviation of the finite values."""
    arr = np.array([v for v in values if not math.isnan(v)], dtype=float)
    if arr.size == 0:
        return math.nan, math.nan
    return float(arr.mean()), float(arr.std())


def format_mean_std(values: Iterable[float], *, pct: bool = True, signed: bool = False) -> str:
    """Format values as ``mean (std)``, in % by default, as the paper's table does."""
    mean, std = mean_std(values)
    if math.isnan(mean):
        return "n/a"
    sign = "+" if signed else ""
    if pct:
        return f"{100 * mean:{sign}.1f} ({100 * std:.1f})"
    return f"{mean:{sign}.3f} ({std:.3f})"
