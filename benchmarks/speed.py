"""Wall and CPU time of the ABIDE main job and of ``--compare``, before and after a change.

Each run is the command a user types, ``python pipelines/abide_fedbn.py --engine
inprocess`` (imports included), in a fresh process with its own MLflow store and workdir.
Per run it prints the wall time, the CPU time of the process and its children, and a
digest of the results table (the lines starting with ``|``): two checkouts whose digests
agree printed the same table to the digit. ``--ref REV`` runs the same commands on a
copy of that git revision too (``git archive`` into a temporary folder), in alternation
with this checkout so that both see the same load.

    python benchmarks/speed.py --main --repeat 2 --ref HEAD~3
    python benchmarks/speed.py --compare --folds 1 --seeds 1 --ref HEAD~3
    python benchmarks/speed.py --compare --workers 2          # the default --compare
    python benchmarks/speed.py --main --cores 1               # the job's work, uncontended

CPU time is the steadier figure on a shared machine: wall time counts the waits for
cores that other jobs hold. With ``--cores 1`` the job runs on one core, so its sites
take turns (no two threads contend for the interpreter or the caches): its CPU time is
then the work the job needs, and that work divided by the cores is the shortest wall
time any schedule of the same computation could reach on them.
"""

from __future__ import annotations

import fedbn_med.numerics.pinned  # noqa: F401  (first: numpy reads its pin when it loads)

# isort: split
import argparse
import hashlib
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _checkout(ref: str, into: Path) -> Path:
    """Write the tree of git revision ``ref`` into ``into``; return it."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_command(tree: Path, args: Sequence[str], scratch: Path, cores: int | None = None
                 ) -> dict[str, object]:
    """Run the pipeline of ``tree`` with ``args``; return wall, CPU and the table digest.

    ``cores``: run it on that many of this process's CPUs (Linux), else on all of them.
    """
    scratch.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(tree), "FLWR_TELEMETRY_ENABLED": "0"}
    command = [sys.executable, str(tree / "pipelines" / "abide_fedbn.py"), "--engine",
               "inprocess", "--quiet", "--tracking-uri",
               f"sqlite:///{scratch / 'mlflow.db'}", "--workdir", str(scratch / "run"), *args]
    cpu, started = _children_cpu(), time.perf_counter()
    cpus = sorted(os.sched_getaffinity(0))[:cores] if cores else None
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True,
                          preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    wall, cpu = time.perf_counter() - started, _children_cpu() - cpu
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n"
                           f"{done.stderr[-3000:]}")
    table = "\n".join(line for line in done.stdout.splitlines() if line.startswith("|"))
    return {"wall_s": wall, "cpu_s": cpu, "digest": hashlib.sha256(table.encode()).hexdigest()[:12],
            "stdout": done.stdout}


def main(argv: Sequence[str] | None = None) -> int:
    """Time the chosen job on this checkout (and on ``--ref``); print one line per run."""
    parser = argparse.ArgumentParser(prog="benchmarks/speed.py",
                                     description=__doc__.splitlines()[0])
    job = parser.add_mutually_exclusive_group(required=True)
    job.add_argument("--main", action="store_true", help="the main job (one run)")
    job.add_argument("--compare", action="store_true", help="the default --compare")
    parser.add_argument("--folds", type=int, default=None, help="with --compare: --folds")
    parser.add_argument("--seeds", type=int, default=None, help="with --compare: --seeds")
    parser.add_argument("--workers", type=int, default=None,
                        help="with --compare: --workers (this checkout only)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each checkout")
    parser.add_argument("--ref", default=None, help="also time this git revision")
    parser.add_argument("--show", action="store_true", help="print each run's output")
    parser.add_argument("--cores", type=int, default=None,
                        help="run the job on this many CPUs (1: its work, uncontended)")
    parser.add_argument("extra", nargs="*", help="further pipeline options (after --)")
    args = parser.parse_args(argv)
    if args.cores is not None and not 1 <= args.cores <= len(os.sched_getaffinity(0)):
        parser.error(f"--cores must lie between 1 and {len(os.sched_getaffinity(0))} (the "
                     f"CPUs this process may use), got {args.cores}")
    common = list(args.extra)
    if args.compare:
        common.append("--compare")
        common += ["--folds", str(args.folds)] if args.folds else []
        common += ["--seeds", str(args.seeds)] if args.seeds else []
    mine = common + (["--workers", str(args.workers)] if args.workers else [])
    with tempfile.TemporaryDirectory(prefix="fedbn-speed-") as tmp:
        trees = [("this checkout", ROOT, mine)]
        if args.ref:
            base = Path(tmp) / "ref"
            base.mkdir()
            trees.append((f"ref {args.ref}", _checkout(args.ref, base), common))
        load = os.getloadavg()[0]
        on = f", the job on {args.cores} of them" if args.cores else ""
        print(f"{'job':<8} {'tree':<22} {'run':>3} {'wall s':>8} {'cpu s':>8}  table digest"
              f"   (load average at start {load:.1f} on {os.cpu_count()} cores{on})")
        for i in range(args.repeat):
            for label, tree, options in trees:
                out = time_command(tree, options, Path(tmp) / f"{label[:3]}{i}", args.cores)
                print(f"{'compare' if args.compare else 'main':<8} {label:<22} {i + 1:>3} "
                      f"{out['wall_s']:>8.1f} {out['cpu_s']:>8.1f}  {out['digest']}",
                      flush=True)
                if args.show:
                    print(out["stdout"])
        if args.cores == 1:
            print(f"On one core the CPU time is the job's work: no schedule of it on "
                  f"{os.cpu_count()} cores can take less wall time than that work divided "
                  f"by {os.cpu_count()}.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
