"""The main job's default settings on every fold: does any site end below chance?

``python pipelines/abide_fedbn.py`` runs one fold (0) of the default spec. This runs the
same spec (in this process: the same numbers as over Flower) on each of the 5 folds and
prints each site's test accuracy and AUC at the last round, the mean, and how many
(fold, site) results are below chance (50 %).

    python benchmarks/default_run.py [--folds 5] [--rounds R]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from _common import markdown_table, run

NAME = "default_run"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the default spec on each fold and print the per-site table."""
    parser = argparse.ArgumentParser(prog=f"benchmarks/{NAME}.py",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--folds", type=int, default=5, help="folds 0..N-1 (default 5)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="communication rounds (default: the task's)")
    args = parser.parse_args(argv)
    from fedbn_med.spec import RunSpec

    started = time.perf_counter()
    spec = RunSpec.for_task("abide")
    if args.rounds is not None:
        spec = spec.replace(rounds=args.rounds)
    body, below, total = [], 0, 0
    for fold in range(args.folds):
        final = run(spec.replace(fold=fold)).final()
        accs = {site: float(final[site]["test_accuracy"]) for site in spec.sites}
        aucs = {site: float(final[site]["test_auc"]) for site in spec.sites}
        below += sum(a < 0.5 for a in accs.values())
        total += len(accs)
        body.append([fold, *[f"{100 * accs[s]:.1f} / {100 * aucs[s]:.1f}" for s in spec.sites],
                     f"{100 * sum(accs.values()) / len(accs):.1f}"])
    table = markdown_table(["fold", *[f"{s} acc / AUC (%)" for s in spec.sites],
                            "mean acc (%)"], body)
    print(f"{spec.label}, {spec.rounds} rounds, seed {spec.seed}, test split, last round\n")
    print(table)
    print(f"\n(fold, site) results below 50 % accuracy: {below} of {total}; "
          f"{time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
