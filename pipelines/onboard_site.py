"""Onboard a site that took no part in training: shared weights + its own BN layers.

Weights from ``--checkpoint WORKDIR/server/global.safetensors`` or ``--mlflow-run RUN_ID``;
with neither, a quick FedBN and FedAvg federation is trained in-process first.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from pathlib import Path

from fedbn_med.onboarding import (
    CheckpointSource,
    MlflowRunSource,
    OnboardingOptions,
    onboard_new_site,
)
from fedbn_med.spec import RunSpec
from fedbn_med.tasks.abide.sites import load_site


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments, onboard the site and print the comparison."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--site", required=True, help="site file in sites/, e.g. PITT")
    p.add_argument("--data-dir", type=Path, help="folder holding ABIDE_pcp/ (default: site file)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--checkpoint", type=Path, help="a server's global.safetensors")
    src.add_argument("--mlflow-run", help="a federation's MLflow parent run ID")
    p.add_argument("--tracking-uri", help="MLflow store of --mlflow-run and of the result")
    avg = p.add_mutually_exclusive_group()  # a FedAvg run's full weights, for row (a)
    avg.add_argument("--fedavg-checkpoint", type=Path, help="a FedAvg server's checkpoint")
    avg.add_argument("--fedavg-mlflow-run", help="a FedAvg federation's MLflow parent run ID")
    p.add_argument("--bn-affine", type=Path, help="averaged BN scale/shift (else reset)")
    p.add_argument("--shots", type=int, default=5, help="labeled cases per class (5; 0: none)")
    p.add_argument("--fold", type=int, default=0, help="fold of the site's split to score")
    p.add_argument("--rounds", type=int, default=30, help="rounds of the quick federation")
    p.add_argument("--seed", type=int, default=0, help="seed of the labeled-case draw")
    p.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    site = load_site(args.site)
    if args.data_dir is not None:
        site = dataclasses.replace(site, data_dir=args.data_dir.expanduser().resolve())
    sources = [CheckpointSource(path) if path else MlflowRunSource(run, args.tracking_uri)
               if run else None for path, run in ((args.checkpoint, args.mlflow_run),
                                                  (args.fedavg_checkpoint,
                                                   args.fedavg_mlflow_run))]
    result = onboard_new_site(
        site, RunSpec.for_task("abide", rounds=args.rounds, seed=args.seed, fold=args.fold),
        federation=sources[0], fedavg=sources[1],
        bn_affine=args.bn_affine, options=OnboardingOptions(shots=args.shots, seed=args.seed),
        tracking_uri=args.tracking_uri, log=not args.no_mlflow,
    )
    print(f"\nOnboarded site {result.site} ({result.counts}); weights: "
          + "; ".join(result.sources))
    print(*result.notes, sep="\n")
    print("\n" + result.table())


if __name__ == "__main__":
    main()
