"""How many local steps each site takes per round at the main job's defaults.

A site's round is ``local_epochs`` passes over its training split in batches of
``batch_size`` (a last batch of fewer than four examples joins the one before it: batch
norm's statistics on two or three examples are degenerate). Where
a site's training split fits in one batch and it trains one epoch, it takes one step per
round, and at that step FedProx's proximal term is zero (the weights are the ones just
received): FedProx then trains exactly as FedAvg does. This prints, for every site and
over every (fold, repetition) cell of the comparison protocol (each repetition re-draws
the split), the training subjects after validation is carved out, and the steps per
round. No training: it reads the sites' splits only. With the default windowed
features a training example is a window (32 volumes every 16), so a site holds several
times as many examples as subjects.

    python benchmarks/research/local_steps.py [--quick] [--data-dir DIR] [--sites A,B]
                                     [--folds N] [--seeds S] [--windows W] [--publish]

``--windows 0`` counts whole-series rows (one per subject; published apart, ``-w0``).

With ``--data-dir`` the default sites are the 14 shared real sites; on the built-in
cohort, the run spec's four.
"""

from __future__ import annotations

import fedbn_med.numerics.pinned  # noqa: F401  (first: it fixes the numeric code path before numpy loads)

# isort: split
from collections.abc import Sequence
from pathlib import Path

import _on_path  # noqa: F401  (benchmarks/ on the path: the shared _common, _sweep, _plots)
from _common import Benchmark, Budget, make_parser, markdown_table, prepare_all
from _plots import bar_plot

NAME = "local_steps"
#: the shared real sites (every ABIDE I site but the FedBN paper's four), largest first
SHARED = ("PITT", "YALE", "MAX_MUN", "KKI", "TRINITY", "STANFORD", "CALTECH", "SDSU", "OLIN",
          "LEUVEN_2", "SBL", "LEUVEN_1", "CMU", "OHSU")


def steps_per_round(n_train: int, batch_size: int, local_epochs: int) -> int:
    """Return the optimiser steps of one round, batched as the trainer batches.

    Per epoch: one step per batch; a last batch of fewer than ``MIN_LAST_BATCH`` examples
    joins the one before it, and a split of one example takes no step
    (:meth:`fedbn_med.training.objective.BinaryClassification.batches`).
    """
    from fedbn_med.training.objective import batch_bounds

    return local_epochs * sum(stop - start >= 2 for start, stop in batch_bounds(n_train,
                                                                                batch_size))


def main(argv: Sequence[str] | None = None) -> int:
    """Read every cell's splits and print each site's training size and steps per round."""
    parser = make_parser(NAME, __doc__.splitlines()[0],
                         full=Budget(rounds=1, folds=5, seeds=3),
                         quick=Budget(rounds=1, folds=1, seeds=1))
    parser.add_argument("--windows", type=int, default=None,
                        help="correlation windows of this many volumes; 0: one whole-series "
                             "row per subject (default: the task's)")
    bench = Benchmark(parser, argv)
    args = bench.args
    if args.sites is None and args.data_dir is not None:
        args.sites = SHARED
    spec = bench.config()
    if args.windows is not None and args.windows != spec.settings.windows:
        if not (args.windows == 0 or args.windows >= 3):
            parser.error(f"--windows must be 0 or at least 3, got {args.windows}")
        spec = bench.config(windows=args.windows)
        bench.set_variant(f"w{args.windows}")
    sites = spec.sites
    sizes: dict[str, list[int]] = {s: [] for s in sites}
    for fold, seed in bench.progress(bench.cells, desc="splits"):
        for site, data in prepare_all(spec.replace(fold=fold, seed=seed)).items():
            sizes[site].append(int(data.train[0].shape[0]))
    batch, epochs = spec.batch_size, spec.local_epochs
    windows = getattr(spec.settings, "windows", 0)
    unit = "training windows" if windows else "training subjects"
    rows, body = [], []
    for site in sites:
        low, high = min(sizes[site]), max(sizes[site])
        steps = sorted({steps_per_round(n, batch, epochs) for n in sizes[site]})
        acts = max(steps) >= 2
        rows.append({"site": site, "cells": len(sizes[site]), "train_min": low,
                     "train_max": high, "steps_min": steps[0], "steps_max": steps[-1],
                     "proximal_term_acts": acts})
        span = str(steps[0]) if steps[0] == steps[-1] else f"{steps[0]}-{steps[-1]}"
        body.append([site, len(sizes[site]), f"{low}" if low == high else f"{low}-{high}",
                     span, "yes" if acts else "no (FedProx = FedAvg)"])
    table = markdown_table(["site", "cells", unit, "local steps per round",
                            "proximal term acts"], body)
    one_step = [r["site"] for r in rows if not r["proximal_term_acts"]]
    notes = (f"Batch {batch}, {epochs} local epoch(s) per round (the main job's defaults); "
             f"{len(bench.cells)} (fold, repetition) cells of the {spec.n_folds}-fold split, "
             f"each repetition re-drawing it; training subjects are those left after the "
             f"test fold and the validation part"
             + (f", each giving its windows of {windows} volumes every "
                f"{spec.settings.window_step} (one training example each)" if windows else "")
             + ". One step per round at every site in every "
             f"cell: {len(one_step)} of {len(sites)} sites"
             + (f" ({', '.join(one_step)})." if one_step else "."))

    def plot(path: Path) -> Path:
        return bar_plot(path, list(sites),
                        {f"{unit} (max over cells)":
                         ([float(r["train_max"]) for r in rows],  # type: ignore[arg-type]
                          [0.0] * len(rows))},
                        ylabel=f"{unit} (one batch holds {batch})",
                        title="Training split per site")

    bench.publish(table, rows, plot, notes=notes,
                  metrics={"one_step_sites": float(len(one_step))},
                  protocol="no training: the sites' splits only")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
