"""Onboard a site that took no part in training: shared weights + its own BN layers.

Weights from ``--checkpoint WORKDIR/server/global.safetensors`` or ``--mlflow-run RUN_ID``;
with neither, a quick FedBN and FedAvg federation is trained in-process first, on the
task's sites without the new one (``--sites`` to choose them).
"""

from __future__ import annotations

import fedbn_med.numerics.pinned  # noqa: F401  (first: numpy reads its pin when it loads)

# isort: split
import argparse
import logging
from pathlib import Path

from fedbn_med.onboarding import (
    CheckpointSource,
    MlflowRunSource,
    OnboardingOptions,
    OnboardingResult,
    onboard_new_site,
)
from fedbn_med.spec import RunSpec
from fedbn_med.tasks import TASK_NAMES

_OPTIONAL = ("fold", "seed", "rounds", "device", "image_size", "subjects")


def main(argv: list[str] | None = None) -> OnboardingResult:
    """Parse the arguments, onboard the site, print the comparison and return it."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", choices=TASK_NAMES, default="abide", help="the task (abide)")
    p.add_argument("--site", required=True, help="site file in sites/ (sites/<task>/), e.g. PITT")
    p.add_argument("--sites", help="quick federation sites (default: the task's, less --site)")
    p.add_argument("--data-dir", type=Path, help="the site's data root (ABIDE: holds ABIDE_pcp/)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--checkpoint", type=Path, help="a server's global.safetensors")
    src.add_argument("--mlflow-run", help="a federation's MLflow parent run ID")
    p.add_argument("--tracking-uri", help="MLflow store of --mlflow-run and of the result")
    avg = p.add_mutually_exclusive_group()  # a FedAvg run's full weights, for row (a)
    avg.add_argument("--fedavg-checkpoint", type=Path, help="a FedAvg server's checkpoint")
    avg.add_argument("--fedavg-mlflow-run", help="a FedAvg federation's MLflow parent run ID")
    p.add_argument("--bn-affine", type=Path, help="averaged BN scale/shift (else reset)")
    p.add_argument("--shots", type=int, default=5,
                   help="labeled cases (5; per class for a classification; 0: none)")
    p.add_argument("--finetune-steps", type=int, default=50, help="BN fine-tuning steps (50)")
    p.add_argument("--reference-epochs", type=int, default=100,
                   help="epochs of the local few-shot reference (100)")
    p.add_argument("--fold", type=int, help="fold of the site's split to score (0)")
    p.add_argument("--rounds", type=int, default=30, help="rounds of the quick federation")
    p.add_argument("--seed", type=int, default=0, help="seed of the labeled-case draw")
    p.add_argument("--device", help="auto, cpu or cuda:N (auto)")
    p.add_argument("--image-size", type=int, help="imaging tasks: image edge of built-in sites")
    p.add_argument("--subjects", type=int, help="imaging tasks: subjects per built-in site")
    p.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    config = RunSpec.for_task(args.task, **{k: getattr(args, k) for k in _OPTIONAL
                                            if getattr(args, k) is not None})
    sites = (args.sites.split(",") if args.sites
             else [s for s in config.sites if s != args.site])
    sources = [CheckpointSource(path) if path else MlflowRunSource(run, args.tracking_uri)
               if run else None for path, run in ((args.checkpoint, args.mlflow_run),
                                                  (args.fedavg_checkpoint,
                                                   args.fedavg_mlflow_run))]
    result = onboard_new_site(
        args.site, config.replace(sites=tuple(sites)),
        data_dir=args.data_dir.expanduser().resolve() if args.data_dir else None,
        federation=sources[0], fedavg=sources[1], bn_affine=args.bn_affine,
        options=OnboardingOptions(shots=args.shots, seed=args.seed,
                                  finetune_steps=args.finetune_steps,
                                  reference_epochs=args.reference_epochs),
        tracking_uri=args.tracking_uri, log=not args.no_mlflow,
    )
    print(f"\nOnboarded site {result.site} ({result.counts}); weights: "
          + "; ".join(result.sources))
    print(*result.notes, sep="\n")
    print("\n" + result.table())
    return result


if __name__ == "__main__":
    main()
