"""The imaging tasks' strategy comparison (the pipelines' ``--compare``), as a benchmark.

Runs what ``python pipelines/<task>_fedbn.py --compare A,B,C --folds F --seeds N --rounds R
[--image-size S] [--subjects N] [--set KEY=VALUE ...]`` runs, and reports it the same way:

- the run specs come from the pipeline's own parser
  (:func:`fedbn_med.cli.parser.build_parser`, :func:`~fedbn_med.cli.parser.spec_from_args`),
  one per strategy, test fold and seed;
- each runs in this process (the imaging tasks' default engine) through
  :func:`fedbn_med.evaluation.runner.run_cell`, scored by the task's metrics (MRI: Dice,
  mean and per tissue; X-ray: balanced accuracy, AUC, accuracy) at the round the task's
  selection picks (lowest mean validation loss);
- the cells form one :class:`~fedbn_med.evaluation.comparison.Comparison`, whose report
  (corrected 95 % intervals over the cells) is printed, with one CSV row per cell.

``--publish`` writes ``benchmarks/published/imaging_compare-<task>/`` and its README block.

    python benchmarks/imaging_compare.py --task mri --strategies fedbn,fedavg,fedavg_localbn \\
        --folds 2 --seeds 1 --rounds 3 --image-size 24 --subjects 8 --set patch_size=16 \\
        --set patches=2 [--publish]

``--quick``: two strategies, one round on two folds of tiny built-in sites (seconds).
The runs use the task's built-in sites under ``$FEDBN_MED_DATA`` (the shared ``--sites``
and ``--data-dir`` options of the benchmarks are ABIDE's).
"""

from __future__ import annotations

import fedbn_med.numerics.pinned  # noqa: F401  (first: it fixes the numeric code path before numpy loads)

# isort: split
import argparse
import math
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from _common import Benchmark, Budget, make_parser
from _sweep import half_width

from fedbn_med.cli.argtypes import positive_int

if TYPE_CHECKING:
    from fedbn_med.evaluation.comparison import Comparison
    from fedbn_med.spec import RunSpec

NAME = "imaging_compare"
TASKS = ("mri", "xray")
#: The strategies of the README's example, in its order.
STRATEGIES = ("fedbn", "fedavg", "fedavg_localbn")
#: --quick: the strategies and the built-in sites' sizes (the rest: the task's defaults).
QUICK_STRATEGIES = ("fedbn", "fedavg")
QUICK_SIZES: dict[str, dict[str, object]] = {
    "mri": {"image_size": 16, "subjects": 6, "patch_size": 16, "patches": 1},
    "xray": {"image_size": 32, "subjects": 12},
}


def _names(text: str) -> tuple[str, ...]:
    names = tuple(t.strip().lower() for t in text.split(",") if t.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated strategies such as "
                                         f"fedbn,fedavg, got {text!r}")
    return names


def parser() -> argparse.ArgumentParser:
    """Return the benchmark's options: the shared ones, the task and the pipeline's sizes."""
    p = make_parser(NAME, __doc__.splitlines()[0], full=Budget(rounds=3, folds=2, seeds=1),
                    quick=Budget(rounds=1, folds=2, seeds=1))
    p.add_argument("--task", choices=TASKS, default="mri", help="the imaging task")
    p.add_argument("--strategies", type=_names, default=None,
                   help=f"comma-separated strategies (default {','.join(STRATEGIES)}; "
                        f"--quick {','.join(QUICK_STRATEGIES)})")
    p.add_argument("--image-size", type=positive_int, default=None,
                   help="image edge of the built-in sites (default: the task's; --quick small)")
    p.add_argument("--subjects", type=positive_int, default=None,
                   help="subjects per built-in site (default: the task's; --quick few)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a task setting, as the pipeline's --set (e.g. patch_size=16)")
    return p


class ImagingBenchmark(Benchmark):
    """A benchmark on an imaging task's built-in sites, published under ``NAME-<task>``."""

    def pipeline_argv(self) -> list[str]:
        """Return the pipeline options that give this run's specs (sizes, settings, seed)."""
        args = self.args
        sizes = dict(QUICK_SIZES[args.task]) if args.quick else {}
        for key in ("image_size", "subjects"):
            if getattr(args, key) is not None:
                sizes[key] = getattr(args, key)
        for item in args.set:
            key, _, value = item.partition("=")
            sizes[key.strip().replace("-", "_")] = value
        out = ["--rounds", str(args.rounds), "--seed", str(args.seed)]
        for key, value in sizes.items():
            out += ([f"--{key.replace('_', '-')}", str(value)]
                    if key in ("image_size", "subjects") else ["--set", f"{key}={value}"])
        if args.device != "auto":
            out += ["--device", args.device]
        return out

    def strategies(self) -> tuple[str, ...]:
        """Return the strategies compared, in table order."""
        return self.args.strategies or (QUICK_STRATEGIES if self.args.quick else STRATEGIES)

    def specs(self) -> list[RunSpec]:
        """Return every run, as the pipeline's ``--compare`` builds them (a clear error)."""
        from fedbn_med.cli.parser import build_parser, spec_from_args

        cli = build_parser(self.args.task).parse_args(self.pipeline_argv())
        try:
            return [spec_from_args(cli, strategy, fold).replace(seed=seed)
                    for strategy in self.strategies() for fold, seed in self.cells]
        except ValueError as err:
            self.parser.error(str(err))

    def command(self) -> str:
        """Return the pipeline command that runs (and prints) the same comparison."""
        argv = ["--compare", ",".join(self.strategies()), "--folds", str(self.args.folds),
                "--seeds", str(self.args.seeds), *self.pipeline_argv()]
        return " ".join(["python", f"pipelines/{self.args.task}_fedbn.py",
                         *map(shlex.quote, argv)])

    def data_description(self) -> tuple[str, tuple[str, ...]]:
        """Return which data this run used (in words) and its sites."""
        spec = self.specs()[0]
        s = spec.settings
        size = "x".join([str(s.image_size)] * (3 if spec.task == "mri" else 2))
        extra = (f", {s.mode} mode, {s.patches} patch(es) of {s.patch}^3 per volume"
                 if spec.task == "mri" and s.mode == "3d" else "")
        return (f"built-in {spec.task.upper() if spec.task == 'mri' else 'X-ray'} sites "
                f"{', '.join(spec.sites)} (data_seed {s.data_seed}; {size} images, "
                f"{s.subjects} subjects per site{extra})", tuple(spec.sites))

    def _publish(self, report: str, csv: str, protocol: str, check: str,
                 files: Mapping[str, bytes]) -> None:
        from _published import publish

        data, _ = self.data_description()
        design = (f"{self.args.rounds} rounds, {self.args.folds} fold(s) x "
                  f"{self.args.seeds} repetition(s)")
        folder = publish(f"{NAME}-{self.args.task}", name=self.name, argv=self.argv,
                         report=report, csv_text=csv, data=data,
                         protocol=f"{design}; {protocol}", wall_time_s=self.wall_time,
                         check=check, files=files)
        print(f"published to {folder}")


def compare(bench: ImagingBenchmark) -> Comparison:
    """Run every (strategy, fold, seed) cell and return the comparison."""
    from fedbn_med.evaluation.comparison import Comparison
    from fedbn_med.evaluation.runner import run_cell, task_metrics

    specs = bench.specs()
    first = specs[0]
    comparison = Comparison(sites=tuple(first.sites), n_folds=first.n_folds,
                            metric_names=task_metrics(first.task))
    for spec in bench.progress(specs):
        comparison.add(run_cell(spec))
    return comparison


def main(argv: Sequence[str] | None = None) -> int:
    """Compare the strategies on an imaging task's built-in sites; print and publish."""
    bench = ImagingBenchmark(parser(), argv)
    bench.specs()  # every setting is checked before the first run
    comparison = compare(bench)
    head = comparison.metric_names[0]

    def plot(path: Path) -> Path:
        from _plots import bar_plot

        columns = [*comparison.sites, "mean"]
        series = {}
        for strategy in comparison.strategies:
            stats = [comparison.corrected(comparison.values(strategy, "best", head, c))
                     for c in columns]
            series[strategy] = ([100 * m for m, _, _ in stats],
                                [half_width(s) for s in stats])
        return bar_plot(path, columns, series, ylabel=f"test {head} (%)",
                        title=f"{bench.args.task}: test {head} at the best-validation round")

    means = {s: comparison.corrected(comparison.values(s, "best", head))[0]
             for s in comparison.strategies}
    metrics = {f"{s}.{head}": m for s, m in means.items() if math.isfinite(m)}
    notes = f"The same runs as `{bench.command()}` (its in-process engine)."
    bench.publish(comparison.report(), comparison.rows(), plot, notes, metrics,
                  protocol="each run's result at its round with the lowest mean validation "
                           "loss; mean [95 % CI] over the cells, corrected for shared "
                           "subjects (Nadeau-Bengio)", check="comparison")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
