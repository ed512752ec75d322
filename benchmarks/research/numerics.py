"""The default run under each floating-point code path torch, MKL and numpy can take on x86.

torch's vectorised kernels (``ATEN_CPU_CAPABILITY``), MKL's GEMM (``MKL_CBWR``), numpy's
loops (``NPY_DISABLE_CPU_FEATURES``) and OpenBLAS (``OPENBLAS_CORETYPE``) pick their code
by the CPU; :mod:`fedbn_med.numerics` pins each of them. This runs the main
job's default spec on each fold once per code path, each in a fresh process (the
libraries read their variable once) that makes its own data: on the built-in cohort it
writes the cohort afresh; on real data it computes the features afresh, into a feature
cache of its own. Per fold it reports the selected round, the site-mean test accuracy,
balanced accuracy and AUC at it, and the first round at which any site's validation loss
differs from the pinned run's; per path, a digest of its data (the cohort's files, or
the real features).
A row equal to the pinned row shows the two paths round the same; one that differs
shows how far a run moves on last-bit differences alone, which is what a machine whose
libraries chose another path would do without the pin. Each run's fingerprint is a
digest of its recorded validation-loss curve (every site, every round, at the 4
decimals a site records) and of its final shared weights, every bit.

``--against FILE`` compares each row with the same code path's row in another machine's
``table.csv`` (``benchmarks/reference/`` keeps one from an AMD AVX2 machine): the same
fingerprint, or where that file has none, the same selected round and the same
site-mean accuracy, balanced accuracy and AUC to the last bit.

    python benchmarks/research/numerics.py [--quick] [--folds 5] [--rounds R]
        [--sites PITT,YALE,KKI,TRINITY --data-dir REAL] [--against TABLE_CSV] [--publish]
"""

from __future__ import annotations

import fedbn_med.numerics.pinned  # noqa: F401  (first: it fixes the numeric code path before numpy loads)

# isort: split
import argparse
import csv
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import _on_path  # noqa: F401  (benchmarks/ on the path: the shared _common, _sweep, _plots)
from _common import markdown_table
from default_run import add_options, checked_folds, default_spec
from tqdm import tqdm

NAME = "numerics"
PINNED_PATH = "pinned"
#: Each code path: its label and the variables its process starts with (the first is
#: the pin itself; the rest leave fedbn_med.numerics to pin whatever they do not set).
PATHS: dict[str, dict[str, str]] = {
    PINNED_PATH: {},
    "torch kernels: default (no SIMD)": {"ATEN_CPU_CAPABILITY": "default"},
    "MKL: AVX2 branch (Intel CPUs only)": {"MKL_CBWR": "AVX2"},
    "numpy: no AVX2 loops (X86_V3 off)": {"NPY_DISABLE_CPU_FEATURES": "X86_V3 X86_V4 "
                                                                     "AVX512_ICL AVX512_SPR"},
    "OpenBLAS: Sandybridge kernels": {"OPENBLAS_CORETYPE": "Sandybridge"},
    "native (FEDBN_MED_NUMERICS=native)": {"FEDBN_MED_NUMERICS": "native"},
}
_WORKER_FLAG = "--worker"
#: What two machines' rows must share to count as the same run, when a row has no
#: fingerprint (a file written before fingerprints were kept).
_SAME = ("selected_round", "accuracy", "balanced_accuracy", "auc")


def _pct(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{100 * value:.1f}"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"benchmarks/{NAME}.py",
                                     description=__doc__.splitlines()[0], allow_abbrev=False)
    add_options(parser)
    parser.add_argument("--against", type=Path, default=None, metavar="TABLE_CSV",
                        help="another machine's table.csv of this benchmark: say, per "
                             "row, whether that machine's run of the same code path and "
                             "fold was the same")
    parser.add_argument(_WORKER_FLAG, action="store_true", help=argparse.SUPPRESS)
    return parser


def worker(args: argparse.Namespace, folds: int) -> dict[str, object]:
    """Run the default spec on each fold in this process; return what the parent compares."""
    from fedbn_med.numerics import describe
    from fedbn_med.training.inprocess import build_federation

    spec = default_spec(args)
    out: list[dict[str, object]] = []
    for fold in range(folds):
        # the engine itself: its last global weights are what this benchmark digests
        history = build_federation(spec.replace(fold=fold)).run()
        result = history.result()
        val = {}
        for row in history.rows:
            if "val_loss" in row:
                val.setdefault(int(row["round"]), {})[str(row["site"])] = float(row["val_loss"])
        mean = {k: sum(float(result.selected[s][f"test_{k}"]) for s in spec.sites)
                / len(spec.sites) for k in ("accuracy", "balanced_accuracy", "auc")}
        curve = [val[r] for r in sorted(val)]
        weights = weights_digest(history.global_weights)
        out.append({"fold": fold, "selected_round": result.selected_round,
                    "last_round": result.last_round, **mean, "val_loss": curve,
                    "weights_sha256": weights,
                    "val_loss_sha256": fingerprint(curve, weights)})
    hashed = hashlib.sha256()
    if args.data_dir is None:  # the cohort this process wrote (FEDBN_MED_DATA is its own)
        from fedbn_med.paths import resolve_data_dir

        root = resolve_data_dir() / "builtin"  # its ABIDE_pcp/ files (not the caches)
        for path in sorted(p for p in root.glob("*/ABIDE_pcp/**/*") if p.is_file()):
            hashed.update(path.relative_to(root).as_posix().encode())
            hashed.update(path.read_bytes())
    else:  # the features this process computed from the real files (its own cache)
        import numpy as np

        from fedbn_med.tasks.abide.build import resolve_site_data_dir
        from fedbn_med.tasks.abide.data import load_site_features
        from fedbn_med.tasks.abide.sites import load_sites

        for name, site in sorted(load_sites(list(spec.sites)).items()):
            feats = load_site_features(resolve_site_data_dir(site, spec),
                                       site.abide_site_ids, name=name)
            for array in (feats.features, feats.labels, feats.mean_fd):
                hashed.update(np.ascontiguousarray(array).tobytes())
    digest = hashed.hexdigest()[:12]
    return {"numerics": describe(), "data_sha256": digest, "folds": out}


def weights_digest(weights: Mapping[str, Any]) -> str:
    """Return a digest (12 hex digits) of a run's final shared weights, every bit of them."""
    hashed = hashlib.sha256()
    for key in sorted(weights):
        hashed.update(key.encode())
        hashed.update(weights[key].detach().cpu().contiguous().numpy().tobytes())
    return hashed.hexdigest()[:12]


def fingerprint(val_loss: Sequence[Mapping[str, float]], weights: str = "") -> str:
    """Return a digest (12 hex digits) of a run: its recorded validation losses (as the
    sites record them, :func:`fedbn_med.fl.release.bounded`) and its final weights'
    digest (:func:`weights_digest`, every bit: the whole run shows in them)."""
    exact = [{site: float(loss).hex() for site, loss in sorted(row.items())}
             for row in val_loss]
    return hashlib.sha256(json.dumps([exact, weights]).encode()).hexdigest()[:12]


def read_against(path: Path) -> dict[tuple[str, int], dict[str, str]]:
    """Read another machine's ``table.csv``: its rows by (code path, fold).

    Raises ``SystemExit`` naming the file (and the row) when it is missing, empty, lacks a
    needed column or value, or lists one (code path, fold) twice.
    """
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            rows = list(reader)
            columns = set(reader.fieldnames or ())
    except (OSError, UnicodeDecodeError) as exc:
        raise SystemExit(f"--against {path}: cannot read it ({exc})") from exc
    needed = {"path", "fold", *_SAME}
    if not needed <= columns:
        raise SystemExit(f"--against {path}: expected a table.csv of "
                         f"benchmarks/research/numerics.py with columns "
                         f"{', '.join(sorted(needed))}")
    if not rows:
        raise SystemExit(f"--against {path}: has no rows")
    out: dict[tuple[str, int], dict[str, str]] = {}
    for line, row in enumerate(rows, start=2):
        try:
            if any(row.get(k) is None for k in needed):
                raise ValueError("too few values")
            int(row["selected_round"])
            for k in _SAME[1:]:
                float(row[k])
            key = (row["path"], int(row["fold"]))
        except ValueError as exc:
            raise SystemExit(f"--against {path}, line {line}: expected a fold, a selected "
                             f"round and three figures ({exc})") from exc
        if key in out:
            raise SystemExit(f"--against {path}, line {line}: {key[0]!r} fold {key[1]} is "
                             f"listed twice")
        out[key] = row
    return out


def same_as(row: Mapping[str, object], other: Mapping[str, str] | None) -> str:
    """Say whether ``other`` (a checked row of another machine) matches ``row``.

    Rows with fingerprints compare those (the recorded validation-loss curve and, since
    2026-12-05, the final weights' every bit); otherwise the
    selected round and the three site-mean figures, every bit (a weaker match: different
    curves can end in equal figures).
    """
    if other is None:
        return "no such row"
    if other.get("val_loss_sha256"):
        return "same fingerprint" if other["val_loss_sha256"] == row["val_loss_sha256"] \
            else "differs"
    same = (int(other["selected_round"]) == row["selected_round"]
            and all(float(other[k]) == row[k] for k in _SAME[1:]))
    return "same figures" if same else "differs"


def _without(argv: Sequence[str], flags: Sequence[str], options: Sequence[str]
             ) -> list[str]:
    """Return ``argv`` less ``flags`` and less ``options`` with their values."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in options:
            skip = True
        elif arg not in flags and not any(arg.startswith(f"{o}=") for o in options):
            out.append(arg)
    return out


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
    against = read_against(args.against) if args.against is not None else None
    from fedbn_med.numerics import PINNED, SWITCH, cpu_info

    started = time.perf_counter()
    given = sys.argv[1:] if argv is None else list(argv)
    forwarded = _without(given, flags=("--publish",), options=("--against", "--data-dir"))
    results: dict[str, dict[str, object]] = {}
    scratch = tempfile.TemporaryDirectory(prefix="fedbn-numerics-")
    for i, (label, variables) in enumerate(tqdm(PATHS.items(), desc="code paths",
                                                unit="path")):
        env = {k: v for k, v in os.environ.items() if k not in (*PINNED, SWITCH)}
        env.update(variables)
        own = Path(scratch.name) / str(i)
        env["FEDBN_MED_DATA"] = str(own)  # a cohort of its own
        data = []
        if args.data_dir is not None:  # the real files, with a feature cache of its own
            (own / "real").mkdir(parents=True)
            (own / "real" / "ABIDE_pcp").symlink_to((args.data_dir / "ABIDE_pcp").resolve())
            data = ["--data-dir", str(own / "real")]
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), _WORKER_FLAG,
                               *forwarded, *data], env=env, capture_output=True, text=True,
                              check=False)
        if done.returncode != 0:
            raise SystemExit(f"the {label!r} run failed (exit {done.returncode}):\n"
                             f"{done.stderr[-2000:]}")
        results[label] = json.loads(done.stdout.strip().splitlines()[-1])
    scratch.cleanup()
    spec = default_spec(args)
    pinned = results[PINNED_PATH]["folds"]
    info = cpu_info()
    cpu = (f"{info.get('model name', 'unknown CPU')} (family {info.get('cpu family', '?')} "
           f"model {info.get('model', '?')})")
    other = ""
    if against is not None:
        first_row = next(iter(against.values()))
        other = first_row.get("cpu_model") or str(args.against)
    body, rows = [], []
    for label, result in results.items():
        found = result["numerics"]
        capability = found["torch_capability"]
        mkl = found["MKL_CBWR"] or "unset"
        for ref, got in zip(pinned, result["folds"]):
            first = _first_difference(ref["val_loss"], got["val_loss"])
            same_weights = got["weights_sha256"] == ref["weights_sha256"]
            row = {"path": label, "cpu_model": cpu, "torch_capability": capability,
                   "mkl_cbwr": mkl,
                   "npy_disable_cpu_features": found["NPY_DISABLE_CPU_FEATURES"] or "unset",
                   "openblas_coretype": found["OPENBLAS_CORETYPE"] or "unset",
                   "onednn_max_cpu_isa": found["ONEDNN_MAX_CPU_ISA"] or "unset",
                   "fold": got["fold"], "selected_round": got["selected_round"],
                   "accuracy": got["accuracy"],
                   "balanced_accuracy": got["balanced_accuracy"], "auc": got["auc"],
                   "first_difference_round": first if first is not None else "",
                   "weights_sha256": got["weights_sha256"],
                   "same_final_weights": same_weights,
                   "val_loss_sha256": got["val_loss_sha256"],
                   "data_sha256": result["data_sha256"]}
            line = [label, f"{capability} / {mkl}", got["fold"],
                    f"{got['selected_round']} of {got['last_round']}",
                    _pct(got["accuracy"]), _pct(got["balanced_accuracy"]),
                    _pct(got["auc"]), "identical" if first is None else f"round {first}",
                    "identical" if same_weights else "differ", got["val_loss_sha256"]]
            if against is not None:
                row["same_as_against"] = same_as(row, against.get((label, got["fold"])))
                line.append(row["same_as_against"])
            rows.append(row)
            body.append(line)
    header = ["code path", "torch kernels / MKL_CBWR", "fold", "selected round",
              "mean acc (%)", "mean bal. acc (%)", "mean AUC (%)",
              "recorded validation loss first differs from pinned",
              "final weights against pinned", "fingerprint"]
    if against is not None:
        header.append(f"against {other}")
    table = markdown_table(header, body)
    what = ("built-in cohort files" if args.data_dir is None
            else "features computed from the real files")
    digests = markdown_table(
        ["code path", f"{what}: sha256 (first 12)", "same as pinned"],
        [[label, r["data_sha256"],
          "yes" if r["data_sha256"] == results[PINNED_PATH]["data_sha256"] else "no"]
         for label, r in results.items()])
    table = f"{table}\n\n{digests}"
    data = ("built-in cohort" if args.data_dir is None
            else f"real ABIDE, sites {', '.join(spec.sites)}")
    others = [r for r in rows if r["path"] != PINNED_PATH]
    moved = [r for r in others
             if r["first_difference_round"] != "" or not r["same_final_weights"]]
    by_fold = {r["fold"]: r for r in rows if r["path"] == PINNED_PATH}
    figures = sum(1 for r in moved if any(r[k] != by_fold[r["fold"]][k] for k in _SAME))
    summary = (f"On {cpu}: runs whose final weights or recorded validation losses differ "
               f"from the pinned run's: "
               f"{len(moved)} of {len(others)} (code path, fold) cells; of those, {figures} "
               f"changed the selected round or a site-mean figure. Each path ran in its own "
               f"process; {spec.label}, "
               f"{spec.rounds} rounds, seed {spec.seed}, {data}; test split at each run's "
               f"selected round (lowest mean validation loss). Validation losses are "
               f"recorded as a site sends them (4 decimals), so a last-bit difference "
               f"shows first in the final weights (every bit). Fingerprint: sha256 of the "
               f"run's recorded validation losses and final weights (first 12 hex digits).")
    if against is not None:
        compared = [r for r in rows if r["same_as_against"] != "no such row"]
        same = [r for r in compared if r["same_as_against"] != "differs"]
        summary += (f" Against {args.against} ({other}): {len(same)} of {len(compared)} "
                    f"runs agree ('same fingerprint': the same validation-loss curve, every "
                    f"bit; 'same figures', where that file has no fingerprint: the same "
                    f"selected round and site-mean accuracy, balanced accuracy and AUC, "
                    f"every bit).")
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
