"""Histopathology across hospitals: FedBN against every baseline, on H&E tiles.

Every method trains MONAI's ``UNet(norm="batch")`` on each site's tiles through the
public face (:func:`fedbn_med.run`, task ``histo``); each run reports the round of
lowest mean validation loss over the sites (validation selection: no test tile takes
part). A cell is one (seed, fold): each seed re-draws every site's split of its tiles,
the fold picks which part is tested. Per cell, a method's score is the mean over the
sites of their test Dice (and AJI); FedBN minus each method, paired by cell, gets the
corrected resampled t-interval (Nadeau and Bengio), since the cells share tiles.

    python benchmarks/histo_compare.py --data-dir /path/to/monuseg --rule hospital \\
        --seeds 2 --folds 0,1 --rounds 6 --patch 64 --eval-crop 256 --out /tmp/histo

``--quick``: FedBN and FedAvg, one round on two seeds of tiny generated tiles (seconds);
the test suite runs it. Rows are written to ``<out>/runs.csv`` as each run ends, and the
table to ``<out>/summary.md``; ``--keep-runs DIR`` keeps each run's folder (the selected
round's weights), from which ``onboard_site.py --task histo --run-dir`` onboards a new
hospital.
"""

from __future__ import annotations

import fedbn_med.numerics.pinned  # noqa: F401  (first: it fixes the numeric code path before numpy loads)

# isort: split
import argparse
import csv
import math
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

import fedbn_med as fb
from fedbn_med.evaluation.intervals import corrected_t_interval

#: ``<strategy>+macenko``: the strategy on Macenko stain-normalised tiles.
METHODS = ("fedbn", "fedavg", "silobn", "fedavg_localbn", "fedprox", "singleset",
           "centralized", "fedavg+macenko")
FIELDS = ("rule", "method", "seed", "fold", "site", "selected_round", "test_dice", "test_aji",
          "val_loss", "seconds")


def add_data_options(p: argparse.ArgumentParser, methods: str) -> None:
    """Add the options saying which tiles, sites and methods (here and histo_figure.py)."""
    p.add_argument("--data-dir", type=Path, default=None,
                   help="MoNuSeg folder or datalist (default: generated tiles)")
    p.add_argument("--rule", default="hospital", choices=("hospital", "organ", "datalist"))
    p.add_argument("--sites", default="", help="comma-separated sites (default: the rule's)")
    p.add_argument("--methods", default=methods)


def add_model_options(p: argparse.ArgumentParser, eval_crop: int) -> None:
    """Add the patch, scoring and network options (here and histo_figure.py)."""
    p.add_argument("--patch", type=int, default=64)
    p.add_argument("--patches", type=int, default=8, help="patches per tile per epoch")
    p.add_argument("--eval-crop", type=int, default=eval_crop)
    p.add_argument("--channels", default="16,32,64")
    p.add_argument("--batch-size", type=int, default=8)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_options(p, ",".join(METHODS))
    p.add_argument("--seeds", type=int, default=2, help="repetitions, each re-drawing splits")
    p.add_argument("--folds", default="0", help="comma-separated test folds")
    p.add_argument("--n-folds", type=int, default=5)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--local-epochs", type=int, default=1)
    add_model_options(p, eval_crop=0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--keep-runs", type=Path, default=None, metavar="DIR",
                   help="keep each run's folder, DIR/<method>-seed<S>-fold<F> (its selected "
                        "round's shared and kept weights: onboard_site.py --run-dir)")
    p.add_argument("--quick", action="store_true", help="tiny generated tiles, 2 methods")
    p.add_argument("--summarise", type=Path, nargs="+", default=None, metavar="CSV",
                   help="run nothing: write the summary of these runs.csv files (one rule)")
    args = p.parse_args(argv)
    if args.quick:
        args.data_dir, args.rule, args.methods, args.seeds = None, "datalist", "fedbn,fedavg", 2
        args.folds, args.n_folds, args.rounds, args.patch, args.patches = "0", 4, 1, 16, 2
        args.eval_crop, args.channels, args.batch_size = 0, "4,8", 4
    return args


def run_cell(args: argparse.Namespace, method: str, seed: int, fold: int
             ) -> list[dict[str, object]]:
    """Run one method on one (seed, fold); return one row per site."""
    strategy, _, stain = method.partition("+")
    settings: dict[str, object] = dict(
        strategy=strategy, stain=stain or "none", seed=seed, fold=fold, n_folds=args.n_folds,
        rounds=args.rounds,
        local_epochs=args.local_epochs, batch_size=args.batch_size, lr=args.lr,
        patch_size=args.patch, patches=args.patches, eval_crop=args.eval_crop,
        channels=args.channels, site_rule=args.rule,
        device="cpu", data_dir=args.data_dir)
    if args.quick:
        settings.update(synthetic_tiles=4, synthetic_size=48)
    if args.sites:
        settings["sites"] = tuple(args.sites.split(","))
    elif args.data_dir is not None:  # every site the rule makes of the tiles
        from fedbn_med.tasks.histo.data import site_tiles

        settings["sites"] = tuple(sorted(site_tiles(fb.RunSpec.for_task("histo", **settings))))
    started = time.perf_counter()
    workdir = (args.keep_runs / f"{method}-seed{seed}-fold{fold}"
               if args.keep_runs is not None else None)
    result = fb.run("histo", workdir=workdir, **settings)
    seconds = time.perf_counter() - started
    return [{"rule": args.rule, "method": method, "seed": seed, "fold": fold, "site": site,
             "selected_round": result.selected_round,
             "test_dice": metrics.get("test_dice", math.nan),
             "test_aji": metrics.get("test_aji", math.nan),
             "val_loss": metrics.get("val_loss", math.nan), "seconds": round(seconds, 1)}
            for site, metrics in result.selected.items()]


def summary(rows: list[dict[str, object]], n_folds: int, rule: str) -> str:
    """Return the markdown table: each method's Dice and AJI, and FedBN minus it."""
    cells: dict[str, dict[tuple[int, int], dict[str, float]]] = defaultdict(dict)
    grouped: dict[tuple[str, int, int], list[dict[str, object]]] = defaultdict(list)
    for r in rows:
        grouped[(str(r["method"]), int(str(r["seed"])), int(str(r["fold"])))].append(r)
    for (method, seed, fold), members in grouped.items():
        cells[method][(seed, fold)] = {
            m: float(np.nanmean([float(str(x[f"test_{m}"])) for x in members]))
            for m in ("dice", "aji")}
    ratio = 1.0 / max(n_folds - 2, 1)  # a test fold against the training folds
    lines = [f"Sites by rule: **{rule}**. Scores: test Dice and AJI at each run's selected "
             "round (lowest mean validation loss), mean over sites, then over cells "
             "(seed x fold); intervals: corrected resampled t, 95 %.", "",
             "| method | cells | Dice | AJI | FedBN - method, Dice [95 % CI] |",
             "|---|---|---|---|---|"]
    fedbn = cells.get("fedbn", {})
    for method, scores in cells.items():
        dice = [s["dice"] for s in scores.values()]
        aji = [s["aji"] for s in scores.values()]
        diff = "-"
        shared = sorted(set(scores) & set(fedbn))
        if method != "fedbn" and shared:
            mean, low, high = corrected_t_interval(
                [fedbn[c]["dice"] - scores[c]["dice"] for c in shared], ratio)
            diff = f"{100 * mean:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]"
        lines.append(f"| {method} | {len(scores)} | {100 * np.mean(dice):.1f} | "
                     f"{100 * np.mean(aji):.1f} | {diff} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.summarise:
        rows = []
        for source in args.summarise:
            with source.open(encoding="utf-8") as handle:
                rows.extend(csv.DictReader(handle))
        rules = sorted({str(r["rule"]) for r in rows})
        table = summary(rows, args.n_folds, ", ".join(rules))
        (args.out / "summary.md").write_text(table + "\n", encoding="utf-8")
        print(table)
        return 0
    path = args.out / "runs.csv"
    rows: list[dict[str, object]] = []
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        writer.writeheader()
        for seed in range(args.seeds):
            for fold in (int(f) for f in args.folds.split(",")):
                for method in args.methods.split(","):
                    got = run_cell(args, method, seed, fold)
                    writer.writerows(got)
                    handle.flush()
                    rows.extend(got)
                    mean = np.nanmean([float(str(r["test_dice"])) for r in got])
                    print(f"seed {seed} fold {fold} {method}: Dice {100 * mean:.1f} "
                          f"(round {got[0]['selected_round']}, {got[0]['seconds']} s)",
                          flush=True)
    table = summary(rows, args.n_folds, args.rule)
    (args.out / "summary.md").write_text(table + "\n", encoding="utf-8")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
