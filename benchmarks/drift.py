"""Client drift: FedAvg, FedProx, SCAFFOLD and their FedBN versions, on ABIDE and on MRI.

Local epochs E = 1 and E = 8 on ABIDE (more local work, more drift towards each site's
own optimum), and the built-in MRI sites (segmentation, Dice). For each strategy: the
final test score, mean (std) over runs (test folds; MRI: one run), and the rounds the
mean-over-sites curve, smoothed by a trailing mean over 3 rounds, takes to reach a target.

    python benchmarks/drift.py [--quick] [--target-acc 0.6] [--target-dice 0.5] [--no-mri]
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from _common import (
    FEDPROX_MU,
    Benchmark,
    Budget,
    curve,
    format_mean_std,
    make_parser,
    markdown_table,
    mean_std,
    run,
)
from _plots import Panel, line_panels
from rounds_to_target import rounds_to, smoothed

NAME = "drift"
# label: (strategy, mu)
METHODS = {"FedAvg": ("fedavg", None), "FedProx": ("fedprox", FEDPROX_MU),
           "SCAFFOLD": ("scaffold", None), "FedBN": ("fedbn", None),
           "FedBN+FedProx": ("fedbn", FEDPROX_MU), "FedBN+SCAFFOLD": ("fedbn-scaffold", None)}
EPOCHS = (1, 8)
WINDOW = 3
MRI = {"image_size": 32, "subjects": 8, "slices": 4}  # small built-in MRI sites (CPU)


def _fraction(text: str) -> float:
    import argparse

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


def main(argv: Sequence[str] | None = None) -> int:
    """Run every method at E = 1 and 8 on ABIDE and on MRI; publish scores and rounds."""
    parser = make_parser(NAME, __doc__.splitlines()[0], full=Budget(rounds=30, folds=2),
                         quick=Budget(rounds=3, folds=1))
    parser.add_argument("--target-acc", type=_fraction, default=0.6,
                        help="ABIDE target mean test accuracy (default 0.6)")
    parser.add_argument("--target-dice", type=_fraction, default=0.5,
                        help="MRI target mean test Dice (default 0.5)")
    parser.add_argument("--mri-rounds", type=int, default=None,
                        help="MRI rounds (default: --rounds, at most 20)")
    parser.add_argument("--no-mri", action="store_true", help="ABIDE only")
    bench = Benchmark(parser, argv)
    from fedbn_med.spec import RunSpec
    from fedbn_med.training.inprocess import run_spec

    # curves[(setting, label)] = one mean-over-sites curve per run
    curves: dict[tuple[str, str], list[np.ndarray]] = {}
    finals: dict[tuple[str, str], list[float]] = {}
    grid: list[tuple[str, str, int]] = [(f"ABIDE E={e}", lb, f) for e in EPOCHS
                                        for lb in METHODS for f in bench.folds]
    if not bench.args.no_mri:
        grid += [("MRI", lb, 0) for lb in METHODS]
    mri_rounds = bench.args.mri_rounds or min(bench.args.rounds, 20)
    for setting, label, fold in bench.progress(grid):
        strategy, mu = METHODS[label]
        if setting == "MRI":
            spec = RunSpec.for_task("mri", strategy=strategy, mu=mu, rounds=mri_rounds,
                                    seed=bench.args.seed, device=bench.args.device, **MRI)
            history, _ = run_spec(spec)
            metric = "test_dice"
        else:
            epochs = int(setting.split("=")[1])
            history = run(bench.config(strategy=strategy, mu=mu, fold=fold,
                                       local_epochs=epochs))
            metric = "test_accuracy"
        values = curve(history, metric)
        curves.setdefault((setting, label), []).append(values)
        finals.setdefault((setting, label), []).append(float(values[-1]))

    settings = list(dict.fromkeys(s for s, _, _ in grid))
    header = ["method"]
    for setting in settings:
        score = "Dice" if setting == "MRI" else "acc"
        target = bench.args.target_dice if setting == "MRI" else bench.args.target_acc
        header += [f"{setting} {score} (%)", f"{setting} rounds to {100 * target:g}"]
    body, rows = [], []
    for label in METHODS:
        cells = [label]
        for setting in settings:
            target = bench.args.target_dice if setting == "MRI" else bench.args.target_acc
            reach = _reach(curves[setting, label], target)
            cells += [format_mean_std(finals[setting, label]), reach]
            mean, std = mean_std(finals[setting, label])
            rows.append({"method": label, "setting": setting, "final_mean": mean,
                         "final_std": std, "runs": len(finals[setting, label]),
                         "target": target, "rounds_to_target": reach})
        body.append(cells)
    table = (f"Client drift: final test score, mean (std) over runs, and rounds to a target "
             f"(mean over sites, trailing mean over {WINDOW} rounds); ABIDE "
             f"{bench.args.rounds} rounds x {bench.args.folds} fold(s)"
             + ("" if bench.args.no_mri else f", MRI {mri_rounds} rounds, 1 run")
             + "\n\n" + markdown_table(header, body))

    def plot(path: Path) -> Path:
        panels = []
        for setting in settings:
            series = {lb: (list(range(1, len(c[0]) + 1)),
                           list(100 * np.mean(c, axis=0)), None)
                      for (s, lb), c in curves.items() if s == setting}
            target = bench.args.target_dice if setting == "MRI" else bench.args.target_acc
            score = "Dice" if setting == "MRI" else "accuracy"
            panels.append(Panel(series, "round", f"{setting}: test {score} (%)",
                                hline=100 * target))
        return line_panels(path, panels, title="Client drift (dashed: target)")

    notes = (f"FedProx mu = {FEDPROX_MU:g}. SCAFFOLD's control variates cover the exchanged "
             "parameters (under FedBN+SCAFFOLD not the BN layers). The MRI trainer uses Adam: "
             "SCAFFOLD's correction is added to the gradient Adam receives, a common variant "
             "(the paper assumes SGD).")
    bench.publish(table, rows, plot, notes=notes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
