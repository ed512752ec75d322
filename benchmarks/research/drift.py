"""Client drift: FedAvg, FedProx, SCAFFOLD and their FedBN versions, on ABIDE and on MRI.

Local epochs E = 1 and E = 8 on ABIDE (more local work, more drift towards each site's
own optimum), and the built-in MRI sites (segmentation, Dice). For each strategy: the
final test score, mean [corrected 95 % CI] over runs (test folds; MRI: one run, no
interval), and the rounds the mean-over-sites curve, smoothed by a trailing mean over 3
rounds, takes to reach a target on the validation splits (no test score picks a round).

    python benchmarks/research/drift.py [--quick] [--target-acc 0.6] [--target-dice 0.5] [--no-mri]
"""

from __future__ import annotations

import fedbn_med.numerics.pinned  # noqa: F401  (first: it fixes the numeric code path before numpy loads)

# isort: split
import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import _on_path  # noqa: F401  (benchmarks/ on the path: the shared _common, _sweep, _plots)
import numpy as np
from _common import (
    FEDPROX_MU,
    Benchmark,
    Budget,
    curve,
    make_parser,
    markdown_table,
    scratch_dir,
)
from _plots import Panel, line_panels
from _sweep import corrected, interval_caption
from rounds_to_target import rounds_to, smoothed

from fedbn_med import run
from fedbn_med.evaluation.tables import format_stats

if TYPE_CHECKING:
    from fedbn_med.spec import RunSpec

NAME = "drift"
# label: (strategy, mu)
METHODS = {"FedAvg": ("fedavg", None), "FedProx": ("fedprox", FEDPROX_MU),
           "SCAFFOLD": ("scaffold", None), "FedBN": ("fedbn", None),
           "FedBN+FedProx": ("fedbn", FEDPROX_MU), "FedBN+SCAFFOLD": ("fedbn-scaffold", None)}
EPOCHS = (1, 8)
WINDOW = 3
MRI = {"image_size": 32, "subjects": 8, "slices": 4}  # small built-in MRI sites (CPU)
#: --quick: 16-voxel volumes (a 3D U-Net's work falls eightfold; the CI checks the table's
#: shape) and the fewest subjects a site takes (6, as imaging_compare.py's --quick sites)
MRI_QUICK = {**MRI, "image_size": 16, "subjects": 6}
#: How a task's headline score (``Task.headline``) is named in the table and the plot.
SCORE_LABELS = {"accuracy": ("acc", "accuracy"), "dice": ("Dice", "Dice")}


@dataclass(frozen=True)
class Setting:
    """One column group of the table: a task, its runs and the target its curve must reach.

    ``spec(strategy, mu, fold)`` gives a run's settings; the score is the task's headline
    (``test_<Task.headline>``).
    """

    name: str
    spec: Callable[[str, float | None, int], RunSpec]
    folds: Sequence[int]
    target: float

    @property
    def metric(self) -> str:
        """Return the task's headline score (``Task.headline``)."""
        from fedbn_med.tasks import get_task

        return get_task(self.spec("fedavg", None, 0).task).headline

    def labels(self) -> tuple[str, str]:
        """Return the score's short name (table) and long name (plot)."""
        return SCORE_LABELS.get(self.metric, (self.metric, self.metric))


def settings_of(bench: Benchmark) -> list[Setting]:
    """Return ABIDE at each local-epoch count, then the built-in MRI sites unless --no-mri."""
    from fedbn_med.spec import RunSpec

    def abide(epochs: int) -> Setting:
        return Setting(f"ABIDE E={epochs}", lambda strategy, mu, fold: bench.config(
            strategy=strategy, mu=mu, fold=fold, local_epochs=epochs),
            bench.folds, bench.args.target_acc)

    settings = [abide(e) for e in EPOCHS]
    if not bench.args.no_mri:
        rounds = bench.args.mri_rounds or min(bench.args.rounds, 20)
        settings.append(Setting("MRI", lambda strategy, mu, fold: RunSpec.for_task(
            "mri", strategy=strategy, mu=mu, rounds=rounds, seed=bench.args.seed,
            device=bench.args.device, **(MRI_QUICK if bench.args.quick else MRI)), (0,),
            bench.args.target_dice))
    return settings


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a score in (0, 1], got {text!r}")
    return value


def _reach(curves: list[np.ndarray], target: float) -> str:
    hit = rounds_to(smoothed(np.mean(curves, axis=0), WINDOW), target)
    return "not reached" if hit is None else str(hit)


def parser() -> argparse.ArgumentParser:
    """Return the benchmark's options: the shared ones, the targets and the MRI runs."""
    parser = make_parser(NAME, __doc__.splitlines()[0], full=Budget(rounds=30, folds=2),
                         quick=Budget(rounds=3, folds=1))
    parser.add_argument("--target-acc", type=_fraction, default=0.6,
                        help="ABIDE target mean validation accuracy (default 0.6)")
    parser.add_argument("--target-dice", type=_fraction, default=0.5,
                        help="MRI target mean validation Dice (default 0.5)")
    parser.add_argument("--mri-rounds", type=int, default=None,
                        help="MRI rounds (default: --rounds, at most 20)")
    parser.add_argument("--no-mri", action="store_true", help="ABIDE only")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run every method at E = 1 and 8 on ABIDE and on MRI; publish scores and rounds."""
    bench = Benchmark(parser(), argv)
    settings = settings_of(bench)

    # curves[(setting, label)] = one mean-over-sites curve per run
    curves: dict[tuple[str, str], list[np.ndarray]] = {}
    finals: dict[tuple[str, str], list[float]] = {}
    grid = [(setting, label, fold) for setting in settings for label in METHODS
            for fold in setting.folds]
    for setting, label, fold in bench.progress(grid):
        strategy, mu = METHODS[label]
        history = run(setting.spec(strategy, mu, fold), workdir=scratch_dir())
        # the target is read off the validation curve: no test score picks a round
        curves.setdefault((setting.name, label), []).append(
            curve(history, f"val_{setting.metric}"))
        final = curve(history, f"test_{setting.metric}")
        finals.setdefault((setting.name, label), []).append(float(final[-1]))

    header = ["method"]
    for setting in settings:
        header += [f"{setting.name} {setting.labels()[0]} (%)",
                   f"{setting.name} rounds to {100 * setting.target:g} (val)"]
    body, rows = [], []
    for label in METHODS:
        cells = [label]
        for setting in settings:
            key = (setting.name, label)
            reach = _reach(curves[key], setting.target)
            mean, low, high = corrected(finals[key])
            cells += [format_stats(mean, low, high), reach]
            rows.append({"method": label, "setting": setting.name, "final_mean": mean,
                         "final_low": low, "final_high": high, "runs": len(finals[key]),
                         "target": setting.target, "rounds_to_target": reach})
        body.append(cells)
    mri_rounds = bench.args.mri_rounds or min(bench.args.rounds, 20)
    abide_runs = len(bench.folds)
    table = (f"Client drift: final test score, and rounds for the validation curve to reach "
             f"a target (mean over sites, trailing mean over {WINDOW} rounds); ABIDE "
             f"{bench.args.rounds} rounds, "
             f"{interval_caption(abide_runs, 'runs (test folds)')}"
             + ("" if bench.args.no_mri else f"; MRI {mri_rounds} rounds, "
                f"{interval_caption(1)}")
             + "\n\n" + markdown_table(header, body))

    def plot(path: Path) -> Path:
        panels = []
        for setting in settings:
            series = {lb: (list(range(1, len(c[0]) + 1)),
                           list(100 * np.mean(c, axis=0)), None)
                      for (s, lb), c in curves.items() if s == setting.name}
            panels.append(Panel(series, "round",
                                f"{setting.name}: validation {setting.labels()[1]} (%)",
                                hline=100 * setting.target))
        return line_panels(path, panels, title="Client drift (dashed: target)")

    notes = (f"FedProx mu = {FEDPROX_MU:g}. SCAFFOLD's control variates cover the exchanged "
             "parameters (under FedBN+SCAFFOLD not the BN layers). The MRI trainer uses Adam: "
             "SCAFFOLD's correction is added to the gradient Adam receives, a common variant "
             "(the paper assumes SGD).")
    bench.publish(table, rows, plot, notes=notes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
