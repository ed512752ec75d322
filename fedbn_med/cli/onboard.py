"""Onboard a site that took no part in training: shared weights + its own BN layers.

Weights from ``--checkpoint WORKDIR/server/global.safetensors``, ``--run-dir WORKDIR`` (a
federation's run folder) or ``--mlflow-run RUN_ID``; with none, a quick FedBN and FedAvg
federation is trained in-process first, on the task's sites without the new one
(``--sites`` to choose them). ``--set KEY=VALUE`` gives the task's own settings, as the
federation ran with them (histo: ``site_rule``, ``channels``, ``patch_size``, ...).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from fedbn_med.cli.argtypes import absolute_path
from fedbn_med.spec import TASK_NAMES

if TYPE_CHECKING:
    from fedbn_med.onboarding import OnboardingResult

__all__ = ["build_parser", "main"]

_OPTIONAL = ("fold", "seed", "rounds", "device", "image_size", "subjects")


def build_parser() -> argparse.ArgumentParser:
    """Return the onboarding command's parser (nothing heavy is imported for it)."""
    p = argparse.ArgumentParser(prog="onboard_site.py", description=__doc__.splitlines()[0])
    p.add_argument("--task", choices=TASK_NAMES, default="abide",
                   help="the task (abide; also mri, xray, histo)")
    p.add_argument("--site", required=True, help="site file in sites/ (sites/<task>/), e.g. PITT")
    p.add_argument("--sites", help="quick federation sites (default: the task's, less --site)")
    p.add_argument("--data-dir", type=absolute_path,
                   help="every site's data root, the new one's and the quick federation's "
                        "(ABIDE: holds ABIDE_pcp/; default: each site's file, else the "
                        "built-in data)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--checkpoint", type=absolute_path, help="a server's global.safetensors")
    src.add_argument("--run-dir", type=absolute_path,
                     help="a FedBN federation's run folder (its --workdir)")
    src.add_argument("--mlflow-run", help="a federation's MLflow parent run ID")
    p.add_argument("--tracking-uri", help="MLflow store of --mlflow-run and of the result")
    avg = p.add_mutually_exclusive_group()  # a FedAvg run's full weights, for row (a)
    avg.add_argument("--fedavg-checkpoint", type=absolute_path, help="a FedAvg server's checkpoint")
    avg.add_argument("--fedavg-mlflow-run", help="a FedAvg federation's MLflow parent run ID")
    avg.add_argument("--fedavg-run-dir", type=absolute_path, help="a FedAvg run's folder")
    p.add_argument("--bn-affine", type=absolute_path, help="averaged BN scale/shift (else reset)")
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
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a task setting, as the federation's run had it (histo: channels, "
                        "patch_size, eval_crop, site_rule, ...)")
    p.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    return p


def main(argv: list[str] | None = None) -> OnboardingResult:
    """Parse the arguments, onboard the site, print the comparison and return it."""
    from fedbn_med.federation.telemetry import telemetry_off

    telemetry_off()  # its MLflow record, and a quick federation's processes
    args = build_parser().parse_args(argv)
    from fedbn_med.cli.parser import task_settings
    from fedbn_med.onboarding import (
        CheckpointSource,
        MlflowRunSource,
        OnboardingOptions,
        RunFolderSource,
        WeightsSource,
        onboard_new_site,
    )
    from fedbn_med.spec import RunSpec

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    config = RunSpec.for_task(args.task, **{**{k: getattr(args, k) for k in _OPTIONAL
                                               if getattr(args, k) is not None},
                                            **task_settings(args)})
    sites = (args.sites.split(",") if args.sites
             else [s for s in config.sites if s != args.site])
    def source(path: Path | None, folder: Path | None, run: str | None) -> WeightsSource | None:
        return (CheckpointSource(path) if path else RunFolderSource(folder) if folder
                else MlflowRunSource(run, args.tracking_uri) if run else None)

    sources = [source(args.checkpoint, args.run_dir, args.mlflow_run),
               source(args.fedavg_checkpoint, args.fedavg_run_dir, args.fedavg_mlflow_run)]
    result = onboard_new_site(
        args.site, config.replace(sites=tuple(sites)),
        data_dir=args.data_dir,
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

