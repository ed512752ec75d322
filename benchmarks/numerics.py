"""The default run under each floating-point code path torch and MKL can take on x86.

torch's vectorised kernels (``ATEN_CPU_CAPABILITY``), MKL's GEMM (``MKL_CBWR``), numpy's
loops (``NPY_DISABLE_CPU_FEATURES``) and OpenBLAS (``OPENBLAS_CORETYPE``) pick their code
by the CPU; :mod:`fedbn_med.numerics` pins each to its AVX2 path. This runs the main
job's default spec on each fold once per code path, each in a fresh process (the
libraries read their variable once) and, on the built-in cohort, with the cohort written
afresh by that process. Per fold it reports the selected round, the site-mean test
accuracy, balanced accuracy and AUC at it, and the first round at which any site's
validation loss differs from the pinned run's; per path, a digest of the cohort's files.
A row equal to the pinned row shows the two paths round the same; one that differs
shows how far a run moves on last-bit differences alone, which is what a machine whose
libraries chose another path would do without the pin.

    python benchmarks/numerics.py [--quick] [--folds 5] [--rounds R]
        [--sites PITT,YALE,KKI,TRINITY --data-dir REAL] [--publish]
"""

from __future__ import annotations

import fedbn_med  # noqa: F401  (first: it fixes the numeric code path before numpy loads)

# isort: split
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from _common import markdown_table
from default_run import add_options, checked_folds, default_spec
from tqdm import tqdm

NAME = "numerics"
#: Each code path: its label and the variables its process starts with (the first is
#: the pin itself; the rest leave fedbn_med.numerics to pin whatever they do not set).
PATHS: dict[str, dict[str, str]] = {
    "pinned (AVX2)": {},
    "torch kernels: default (no SIMD)": {"ATEN_CPU_CAPABILITY": "default"},
    "MKL: COMPATIBLE (SSE2)": {"MKL_CBWR": "COMPATIBLE"},
    "both of the above": {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"},
    "numpy: no AVX2 loops (X86_V3 off)": {"NPY_DISABLE_CPU_FEATURES": "X86_V3 X86_V4 "
                                                                     "AVX512_ICL AVX512_SPR"},
    "OpenBLAS: Sandybridge kernels": {"OPENBLAS_CORETYPE": "Sandybridge"},
    "native (FEDBN_MED_NUMERICS=native)": {"FEDBN_MED_NUMERICS": "native"},
}
_WORKER_FLAG = "--worker"


def _pct(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{100 * value:.1f}"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"benchmarks/{NAME}.py",
                                     description=__doc__.splitlines()[0])
    add_options(parser)
    parser.add_argument(_WORKER_FLAG, action="store_true", help=argparse.SUPPRESS)
    return parser


def worker(args: argparse.Namespace, folds: int) -> dict[str, object]:
    """Run the default spec on each fold in this process; return what the parent compares."""
    from _common import run

    from fedbn_med.numerics import describe

    spec = default_spec(args)
    out: list[dict[str, object]] = []
    for fold in range(folds):
        history = run(spec.replace(fold=fold))
        result = history.result()
        val = {}
        for row in history.rows:
            if "val_loss" in row:
                val.setdefault(int(row["round"]), {})[str(row["site"])] = float(row["val_loss"])
        mean = {k: sum(float(result.selected[s][f"test_{k}"]) for s in spec.sites)
                / len(spec.sites) for k in ("accuracy", "balanced_accuracy", "auc")}
        out.append({"fold": fold, "selected_round": result.selected_round,
                    "last_round": result.last_round, **mean,
                    "val_loss": [val[r] for r in sorted(val)]})
    digest = "n/a (real files, read as they are)"
    if args.data_dir is None:  # the cohort this process wrote (FEDBN_MED_DATA is its own)
        import hashlib

        from fedbn_med.paths import resolve_data_dir

        root = resolve_data_dir() / "builtin"  # its ABIDE_pcp/ files (not the caches)
        hashed = hashlib.sha256()
        for path in sorted(p for p in root.glob("*/ABIDE_pcp/**/*") if p.is_file()):
            hashed.update(path.relative_to(root).as_posix().encode())
            hashed.update(path.read_bytes())
        digest = hashed.hexdigest()[:12]
    return {"numerics": describe(), "cohort_sha256": digest, "folds": out}


def _first_difference(a: Sequence[Mapping[str, float]], b: Sequence[Mapping[str, float]]
                      ) -> int | None:
    """Return the first round (1-based) at which any site's validation loss differs."""
    for rnd, (x, y) in enumerate(zip(a, b), start=1):
        if x != y:
            return rnd
    return None if len(a) == len(b) else min(len(a), len(b)) + 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run the default spec under each code path and print the comparison."""
    parser = _parser()
    args = parser.parse_args(argv)
    folds = checked_folds(parser, args)
    if args.worker:
        print(json.dumps(worker(args, folds)))
        return 0
    from fedbn_med.numerics import PINNED, SWITCH

    started = time.perf_counter()
    forwarded = [a for a in (sys.argv[1:] if argv is None else list(argv))
                 if a != "--publish"]
    results: dict[str, dict[str, object]] = {}
    scratch = tempfile.TemporaryDirectory(prefix="fedbn-numerics-")
    for i, (label, variables) in enumerate(tqdm(PATHS.items(), desc="code paths",
                                                unit="path")):
        env = {k: v for k, v in os.environ.items() if k not in (*PINNED, SWITCH)}
        env.update(variables)
        env["FEDBN_MED_DATA"] = str(Path(scratch.name) / str(i))  # a cohort of its own
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), _WORKER_FLAG,
                               *forwarded], env=env, capture_output=True, text=True,
                              check=False)
        if done.returncode != 0:
            raise SystemExit(f"the {label!r} run failed (exit {done.returncode}):\n"
                             f"{done.stderr[-2000:]}")
        results[label] = json.loads(done.stdout.strip().splitlines()[-1])
    scratch.cleanup()
    spec = default_spec(args)
    pinned = results["pinned (AVX2)"]["folds"]
    body, rows = [], []
    for label, result in results.items():
        capability = result["numerics"]["torch_capability"]
        mkl = result["numerics"]["MKL_CBWR"] or "unset"
        for ref, got in zip(pinned, result["folds"]):
            first = _first_difference(ref["val_loss"], got["val_loss"])
            body.append([label, f"{capability} / {mkl}", got["fold"],
                         f"{got['selected_round']} of {got['last_round']}",
                         _pct(got["accuracy"]), _pct(got["balanced_accuracy"]),
                         _pct(got["auc"]), "identical" if first is None else f"round {first}"])
            rows.append({"path": label, "torch_capability": capability, "mkl_cbwr": mkl,
                         "fold": got["fold"], "selected_round": got["selected_round"],
                         "accuracy": got["accuracy"],
                         "balanced_accuracy": got["balanced_accuracy"], "auc": got["auc"],
                         "first_difference_round": first if first is not None else ""})
    table = markdown_table(
        ["code path", "torch kernels / MKL_CBWR", "fold", "selected round",
         "mean acc (%)", "mean bal. acc (%)", "mean AUC (%)",
         "validation loss first differs from pinned"], body)
    digests = markdown_table(
        ["code path", "built-in cohort files: sha256 (first 12)", "same as pinned"],
        [[label, r["cohort_sha256"],
          "yes" if r["cohort_sha256"] == results["pinned (AVX2)"]["cohort_sha256"] else "no"]
         for label, r in results.items()])
    table = f"{table}\n\n{digests}"
    data = "built-in cohort" if args.data_dir is None else f"real ABIDE ({args.data_dir})"
    moved = sum(1 for r in rows if r["path"] != "pinned (AVX2)"
                and r["first_difference_round"] != "")
    total = sum(1 for r in rows if r["path"] != "pinned (AVX2)")
    summary = (f"Runs that differ from the pinned run: {moved} of {total} (code path, fold) "
               f"cells. Each path ran in its own process; {spec.label}, {spec.rounds} rounds, "
               f"seed {spec.seed}, {data}; test split at each run's selected round (lowest "
               f"mean validation loss).")
    print(f"\n{table}\n\n{summary}\n{time.perf_counter() - started:.1f} s")
    if args.publish:
        from _published import describe_data, publish, publish_key

        from fedbn_med.evaluation.report import csv_text

        real = args.data_dir is not None
        folder = publish(publish_key(NAME, spec.sites, real), name=NAME, argv=argv,
                         report=f"{table}\n\n{summary}", csv_text=csv_text(rows),
                         data=describe_data(spec.sites, real),
                         protocol=(f"{spec.label}, {spec.rounds} rounds, folds 0-{folds - 1} "
                                   f"of 5, seed {spec.seed}, once per code path in a fresh "
                                   "process; each run's result at its lowest mean "
                                   "validation loss round"),
                         wall_time_s=time.perf_counter() - started)
        print(f"published to {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
