#!/usr/bin/env python
"""What Flower costs on top of the work: our federation vs the in-process driver vs stock Flower.

Prints, for a 4-site ABIDE FedBN federation on 127.0.0.1:

- (a) the overhead per round (federated minus in-process wall time of the rounds), next
  to stock Flower 1.42 as shipped (``flower-supernode``, a fresh ClientApp process per
  message, Flower's own FedAvg strategy and polling) on the same machine and data;
- start-up until every site is ready, MLflow set-up, closing, and set-ups per site;
- the same with 8 local epochs (as the earlier figures);
- (c) a compute-dominated MRI run (MONAI UNet, 3 sites): federated over in-process time.

A second table shows where the CPU time of a federated round goes (SuperLink, sites,
ServerApp), sampled from the processes while the rounds run.

    python benchmarks/federation_overhead.py            # 50 rounds, stock Flower 3 rounds
    python benchmarks/federation_overhead.py --quick    # a few rounds of each

Phases of a federated run, from its progress events: start-up is from the call until the
server has heard from every site; MLflow set-up is from there to the start of round 1;
the rounds run from the start of round 1 to the last round's evaluation (as the
in-process driver's rounds do, evaluation included); closing is writing the results
table, plot and weights to MLflow.
"""

from __future__ import annotations

import fedbn_med.numerics.pinned  # noqa: F401  (first: it fixes the numeric code path before numpy loads)

# isort: split
import argparse
import dataclasses
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the stock-Flower helper

from _stock_flower import stock_flower_run  # noqa: E402

from fedbn_med import run  # noqa: E402
from fedbn_med.federation.events import Done, Ready, Round, Trained, read_events  # noqa: E402
from fedbn_med.spec import RunSpec  # noqa: E402
from fedbn_med.tasks import get_task  # noqa: E402
from fedbn_med.training.inprocess import build_federation  # noqa: E402

#: --quick: the smallest built-in MRI sites (16-voxel volumes, 6 subjects; those of
#: imaging_compare.py's --quick): the run's plumbing, not a compute-dominated figure.
MRI_QUICK = {"image_size": 16, "subjects": 6}


def in_process_seconds(spec: RunSpec) -> tuple[float, float]:
    """Return the rounds' wall time and the slowest site's compute per round.

    Data are loaded and trainers built before the clock starts.
    """
    federation = build_federation(spec.replace(device="cpu"))
    trainers = federation.trainers
    per_site = {n: 0.0 for n in trainers}

    class Timed:
        def __init__(self, name: str) -> None:
            self.name, self.inner = name, trainers[name]

        def __getattr__(self, attr: str) -> object:
            return getattr(self.inner, attr)

        def fit(self, *args: object) -> object:
            t0 = time.perf_counter()
            out = self.inner.fit(*args)
            per_site[self.name] += time.perf_counter() - t0
            return out

    started = time.perf_counter()
    timed = {n: Timed(n) for n in trainers}
    dataclasses.replace(federation, trainers=timed).run()
    return time.perf_counter() - started, max(per_site.values()) / spec.rounds


class CpuSampler:
    """Sample the CPU time of every process below this one, by role, a few times a second."""

    def __init__(self, every: float = 0.25) -> None:
        self.samples: list[tuple[float, dict[int, tuple[str, float]]]] = []
        self.every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _role(cmdline: list[str]) -> str:
        text = " ".join(cmdline)
        for key, role in (("flower-superlink", "SuperLink"), ("flwr-serverapp", "ServerApp"),
                          ("sitehost", "sites (4)"), ("federation.node", "sites (4)"),
                          ("flower-superexec", "Flower executor"), ("flwr run", "flwr run")):
            if key in text:
                return role
        return "other"

    def _run(self) -> None:
        me = psutil.Process()
        roles: dict[int, str] = {}
        while not self._stop.is_set():
            snap: dict[int, tuple[str, float]] = {}
            for proc in me.children(recursive=True):
                try:
                    if roles.get(proc.pid, "other") == "other":
                        # a child seen between its fork and its exec still shows its
                        # parent's command line: look again until it shows its own
                        roles[proc.pid] = self._role(proc.cmdline())
                    cpu = proc.cpu_times()
                    snap[proc.pid] = (roles[proc.pid], cpu.user + cpu.system)
                except psutil.Error:
                    continue
            self.samples.append((time.time(), snap))
            self._stop.wait(self.every)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, t0: float, t1: float) -> dict[str, float]:
        """Return CPU seconds per role spent between wall times ``t0`` and ``t1``."""
        before = next((s for t, s in reversed(self.samples) if t <= t0), {})
        after = next((s for t, s in reversed(self.samples) if t <= t1), {})
        out: dict[str, float] = {}
        for pid, (role, cpu) in after.items():
            if pid in before:
                out[role] = out.get(role, 0.0) + cpu - before[pid][1]
        return out


def federated(spec: RunSpec, workdir: Path) -> dict:
    """Run over Flower; return the phases' wall times, CPU per role and set-up counts."""
    with CpuSampler() as cpu:
        started = time.time()
        result = run(spec, engine="flower", workdir=workdir,
                     tracking_uri=f"sqlite:///{workdir / 'mlflow.db'}")
        ended = time.time()
    run_dir = next(workdir.glob("run-0-*"))
    events = read_events(run_dir / "progress.jsonl", strict=False)
    ready = next(e.t for e in events if isinstance(e, Ready))
    first = next(e for e in events if isinstance(e, Trained))
    rounds_start = first.t - first.seconds
    last = [e.t for e in events if isinstance(e, Round)][-1]
    done = next(e.t for e in events if isinstance(e, Done))
    usage = cpu.between(rounds_start, last)
    return {"startup": ready - started, "tracking_setup": rounds_start - ready,
            "rounds": last - rounds_start, "closing": done - last,
            "total": ended - started, "cpu": usage,
            "setups": sorted({int(r["setups"]) for r in result.rows})}


def main(argv: list[str] | None = None) -> None:
    """Measure each run and print the tables; ``argv`` as on the command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--stock-rounds", type=int, default=None,
                        help="rounds of stock Flower (about 25-40 s each here; default 3)")
    parser.add_argument("--mri-rounds", type=int, default=None)
    parser.add_argument("--mri-epochs", type=int, default=9,
                        help="local epochs of the MRI run (9: over 5 s per site and round "
                             "on one core here)")
    parser.add_argument("--mri-only", action="store_true",
                        help="measure only the compute-dominated MRI run (c)")
    args = parser.parse_args(argv)
    rounds = args.rounds or (5 if args.quick else 50)
    stock_rounds = args.stock_rounds or (1 if args.quick else 3)
    mri_rounds = args.mri_rounds or (1 if args.quick else 3)
    torch.set_num_threads(1)
    mri = RunSpec.for_task("mri", rounds=mri_rounds, device="cpu",
                           **(MRI_QUICK if args.quick else {"local_epochs": args.mri_epochs}))
    if args.mri_only:
        with tempfile.TemporaryDirectory(prefix="fedbn-overhead-") as tmp:
            mri_inproc, mri_site = in_process_seconds(mri)
            fed = federated(mri, Path(tmp) / "mri")
        print(f"\n(c) MRI, {mri.rounds} rounds of {mri.local_epochs} local epochs, "
              f"{mri_site:.1f} s of compute per round at the slowest site: federated "
              f"{fed['rounds']:.1f} s vs in-process {mri_inproc:.1f} s = "
              f"{fed['rounds'] / mri_inproc:.2f}x (target <= 1.15x with >= 5 s per site); "
              f"start-up {fed['startup']:.1f} s")
        return
    base = RunSpec(strategy="fedbn", rounds=rounds, device="cpu")
    get_task("abide").prepare(base)
    rows = []
    with tempfile.TemporaryDirectory(prefix="fedbn-overhead-") as tmp:
        for label, spec in (("ABIDE E=1", base), ("ABIDE E=8", base.replace(
                local_epochs=8, rounds=max(2, rounds // 5)))):
            inproc, _ = in_process_seconds(spec)
            rows.append((label, spec, inproc, federated(spec, Path(tmp) / label[-3:])))
        mri_inproc, mri_site = in_process_seconds(mri)
        rows.append(("MRI", mri, mri_inproc, federated(mri, Path(tmp) / "mri")))
        stock = stock_flower_run(stock_rounds, base.sites, Path(tmp) / "stock", timeout=1800)
    print(f"\nFederations over Flower on 127.0.0.1 vs the in-process driver "
          f"({torch.get_num_threads()} thread in-process), {psutil.cpu_count()} CPUs\n")
    print("| run | rounds | in-process rounds s | federated rounds s | overhead/round s "
          "| fed/in-process | start-up s | MLflow set-up s | closing s | whole run s "
          "| set-ups per site |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for label, spec, inproc, fed in rows:
        overhead = (fed["rounds"] - inproc) / spec.rounds
        print(f"| {label} | {spec.rounds} | {inproc:.2f} | {fed['rounds']:.2f} | "
              f"{overhead:.3f} | {fed['rounds'] / inproc:.2f} | {fed['startup']:.1f} | "
              f"{fed['tracking_setup']:.1f} | {fed['closing']:.1f} | {fed['total']:.1f} | "
              f"{fed['setups']} |")
    ours = (rows[0][3]["rounds"] - rows[0][2]) / rows[0][1].rounds
    stock_overhead = stock["seconds_per_round"] - rows[0][2] / rows[0][1].rounds
    print(f"| stock Flower 1.42 | {stock['rounds']} | {rows[0][2] / rows[0][1].rounds:.2f}/round "
          f"| {stock['rounds_seconds']:.2f} | {stock_overhead:.3f} | "
          f"{stock['seconds_per_round'] / (rows[0][2] / rows[0][1].rounds):.1f} | "
          f"{stock['startup_seconds']:.1f} | - | - | {stock['seconds_total']:.1f} | "
          f"one process per message |")
    print("\nCPU seconds per round while the rounds run, by process:\n")
    roles = sorted({r for *_, fed in rows for r in fed["cpu"]})
    print("| run | " + " | ".join(roles) + " | total | wall s/round |")
    print("|---|" + "---|" * (len(roles) + 2))
    for label, spec, _, fed in rows:
        cells = [fed["cpu"].get(r, 0.0) / spec.rounds for r in roles]
        print(f"| {label} | " + " | ".join(f"{c:.3f}" for c in cells)
              + f" | {sum(cells):.3f} | {fed['rounds'] / spec.rounds:.3f} |")
    mri_fed = rows[2][3]["rounds"]
    print(f"\n(a) overhead per round: ours {ours:.3f} s, stock Flower {stock_overhead:.2f} s: "
          f"{stock_overhead / ours:.0f}x lower (target: at least 30x)")
    print(f"(c) MRI, {mri_site:.1f} s of compute per round at the slowest site: federated "
          f"{mri_fed:.1f} s vs in-process {mri_inproc:.1f} s = {mri_fed / mri_inproc:.2f}x "
          f"(target <= 1.15x with >= 5 s per site)")
    print(f"start-up {rows[0][3]['startup']:.1f} s (target < 15 s); set-ups per site "
          f"{rows[0][3]['setups']} (target [1])")


if __name__ == "__main__":
    main()
