"""Leave-one-site-out onboarding benchmark on the built-in ABIDE cohort.

For each of NYU, UM, USM and UCLA: train FedBN and FedAvg in-process on the other three
sites, then onboard the held-out site at test time (fedbn_med.onboarding). Then train on
all four and onboard sites no federation has seen (PITT, YALE). The held-out site is
scored over its folds (BN statistics from its train and validation inputs, the few
labeled cases from its train split, scores on its test split) and over seeds.

Compared per held-out site: (a) the FedAvg global model as is, FedAvg with local BN
statistics, (b) FedBN's shared weights with local BN statistics (scale/shift averaged
over the training sites, paper appendix G; and reset), (c) (b) plus BN fine-tuning on
k labeled cases per class, each plus fine-tuning, and a model trained on those k cases
alone (SingleSet reference).

Usage::

    python benchmarks/research/leave_one_site_out.py            # 3 seeds x 5 folds, 30 rounds
    python benchmarks/research/leave_one_site_out.py --quick    # 1 seed x 1 fold, 10 rounds
    python benchmarks/research/leave_one_site_out.py --quick --data-dir DIR   # sites from DIR

Writes ``benchmarks/results/leave_one_site_out/{table.md,table.csv}`` and logs to the
MLflow experiment ``abide-onboarding``.
"""

from __future__ import annotations

import fedbn_med.numerics.pinned  # noqa: F401  (first: it fixes the numeric code path before numpy loads)

# isort: split
import argparse
import csv
import io
import logging
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import psutil
import torch

from fedbn_med.evaluation.report import paper_table
from fedbn_med.onboarding import (
    ONBOARDING_EXPERIMENT,
    OnboardingOptions,
    method_table,
    onboard,
    train_federation,
)
from fedbn_med.spec import RunSpec
from fedbn_med.tasks.abide.build import build_model, prepare_site_data
from fedbn_med.tasks.abide.sites import load_sites
from fedbn_med.tracking import tracked

DEFAULT_SITES = RunSpec().sites

OUT_DIR = Path(__file__).resolve().parents[1] / "results" / "leave_one_site_out"
NEW_SITES = ("PITT", "YALE")


def _scenarios(new_sites: Sequence[str]) -> list[tuple[str, tuple[str, ...]]]:
    loso = [(held, tuple(s for s in DEFAULT_SITES if s != held)) for held in DEFAULT_SITES]
    return loso + [(new, tuple(DEFAULT_SITES)) for new in new_sites]


def run(rounds: int, seeds: Sequence[int], folds: Sequence[int], shots: int,
        new_sites: Sequence[str], data_dir: Path | None = None
        ) -> tuple[dict[str, dict[str, list[dict[str, float]]]], dict[str, str]]:
    """Return ``{held_out: {method: [metrics per (seed, fold)]}}`` and the row labels.

    ``data_dir`` holds ``ABIDE_pcp/`` with every site; None: the built-in cohort.
    """
    base = RunSpec(rounds=rounds, device="cpu", data_dir=data_dir)
    configs = load_sites([*DEFAULT_SITES, *new_sites])
    train_data = {n: prepare_site_data(configs[n], base) for n in DEFAULT_SITES}
    results: dict[str, dict[str, list[dict[str, float]]]] = {}
    labels: dict[str, str] = {}
    for seed in seeds:
        federations = {}
        for held, training in _scenarios(new_sites):
            cfg = base.replace(seed=seed, sites=training)
            if training not in federations:
                started = time.perf_counter()
                federations[training] = [train_federation(cfg.replace(strategy=s), train_data)
                                         for s in ("fedavg", "fedbn")]
                print(f"seed {seed}: trained FedAvg and FedBN on {', '.join(training)} "
                      f"({rounds} rounds) in {time.perf_counter() - started:.1f} s", flush=True)
            fedavg, fedbn = federations[training]
            dim = fedbn.input_shape[0]
            for fold in folds:
                data = prepare_site_data(configs[held], base.replace(fold=fold))
                result = onboard(
                    held, data, lambda c=cfg, d=dim: build_model(d, c),
                    [fedavg.weights, fedbn.weights], input_shape=fedbn.input_shape,
                    affine=fedbn.bn_affine, options=OnboardingOptions(shots=shots, seed=seed),
                )
                for method, metrics in result.metrics.items():
                    results.setdefault(held, {}).setdefault(method, []).append(metrics)
                labels.update(result.labels)
    return results, labels


def tables(results: dict[str, dict[str, list[dict[str, float]]]], labels: dict[str, str],
           header: str) -> tuple[str, str]:
    """Return the markdown report and the CSV of every (held-out site, method, metric)."""
    sites = list(results)
    methods = list(dict.fromkeys(m for s in sites for m in results[s]))
    parts = [header]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["held_out", "method", "label", "metric", "mean", "std", "runs"])
    for metric in ("accuracy", "auc"):
        summary = {labels[m]: {s: [r[f"test_{metric}"] for r in results[s].get(m, [])]
                               for s in sites} for m in methods}
        parts += [f"## Summary: test {metric} per held-out site", "",
                  paper_table(summary, sites, metric=f"test {metric}"), ""]
        for m in methods:
            for s in sites:
                vals = np.array(summary[labels[m]][s], dtype=float)
                vals = vals[~np.isnan(vals)]
                mean, std = (vals.mean(), vals.std()) if vals.size else (np.nan, np.nan)
                writer.writerow([s, m, labels[m], metric, f"{mean:.6f}", f"{std:.6f}",
                                 vals.size])
    for site in sites:
        parts += [f"## Held-out site {site}", "", method_table(results[site], labels), ""]
    return "\n".join(parts), out.getvalue()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark, print and write its tables, log them to MLflow."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="1 seed, 1 fold, 10 rounds, new site PITT only")
    parser.add_argument("--rounds", type=int, default=None, help="federated rounds (30)")
    parser.add_argument("--seeds", type=int, default=None, help="number of seeds (3)")
    parser.add_argument("--folds", type=int, default=None,
                        help="folds of the held-out site to score (5)")
    parser.add_argument("--shots", type=int, default=5, help="labeled cases per class (5)")
    parser.add_argument("--new-sites", default=None,
                        help="sites no federation has seen (PITT,YALE; --quick: PITT)")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="folder holding ABIDE_pcp/ with the training and new sites "
                             "(default: the built-in cohort)")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="output folder")
    parser.add_argument("--tracking-uri", default=None, help="MLflow store")
    args = parser.parse_args(argv)
    if args.data_dir is not None and not (args.data_dir / "ABIDE_pcp").is_dir():
        parser.error(f"--data-dir must hold ABIDE_pcp/ (the ABIDE Preprocessed layout); "
                     f"{args.data_dir} does not")
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    rounds = args.rounds or (10 if args.quick else 30)
    seeds = range(args.seeds or (1 if args.quick else 3))
    folds = range(args.folds or (1 if args.quick else 5))
    new_sites = tuple(s for s in (args.new_sites or ("PITT" if args.quick else
                                                     ",".join(NEW_SITES))).split(",") if s)
    results, labels = run(rounds, list(seeds), list(folds), args.shots, new_sites,
                          args.data_dir)
    header = (f"# Leave-one-site-out onboarding{' (quick)' if args.quick else ''}\n\n"
              f"{rounds} rounds, {len(seeds)} seed(s) x {len(folds)} fold(s) of the held-out "
              f"site, {args.shots} labeled cases per class; mean [95 % CI] in % over runs.\n")
    report, csv = tables(results, labels, header)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text(report + "\n", encoding="utf-8")
    (args.out / "table.csv").write_text(csv, encoding="utf-8")
    print(report)
    params = {"rounds": rounds, "seeds": len(seeds), "folds": len(folds), "shots": args.shots,
              "training_sites": ",".join(DEFAULT_SITES), "new_sites": ",".join(new_sites)}
    with tracked(ONBOARDING_EXPERIMENT,
                 "leave-one-site-out" + ("-quick" if args.quick else ""), params, (),
                 tracking_uri=args.tracking_uri, tags={"kind": "benchmark"}) as tracker:
        for site, per_method in results.items():
            tracker.add_site(site)
            n_runs = len(next(iter(per_method.values())))
            for i in range(n_runs):
                tracker.log_round(i + 1, {site: {f"{m}_{k}": v for m, runs in per_method.items()
                                                 for k, v in runs[i].items()}})
        tracker.log_text(report + "\n", "table.md")
        tracker.log_text(csv, "table.csv")
    print(f"\nWrote {args.out / 'table.md'} and table.csv; MLflow experiment "
          f"'{ONBOARDING_EXPERIMENT}', run {tracker.parent_id}.")
    wall = time.time() - psutil.Process().create_time()
    print(f"Wall time: {wall:.1f} s (process start to end, imports included)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
