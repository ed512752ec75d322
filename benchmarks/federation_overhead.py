#!/usr/bin/env python
"""What Flower costs on top of the work: a 4-site FedBN federation vs the in-process driver.

Prints (a) the overhead per round (federated minus in-process wall time of the rounds),
(b) start-up until every site is ready, (c) the whole federated run against the
in-process run with 8 local epochs, and (d) how many times each site loaded its data and
built its model. A second table shows where the CPU time of a federated round goes
(SuperLink, sites, ServerApp), sampled from the processes while the rounds run.

    python benchmarks/federation_overhead.py            # 50 rounds, then 8 local epochs
    python benchmarks/federation_overhead.py --quick    # a few rounds

Phases of a federated run, from its progress events: start-up is from the call until the
server has heard from every site; MLflow set-up is from there to the start of round 1;
the rounds run from the start of round 1 to the last round's evaluation (as the
in-process driver's rounds do, evaluation included); closing is writing the results
table, plot and weights to MLflow.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path

import psutil
import torch

from fedbn_med.driver import run_in_process
from fedbn_med.experiment import ExperimentConfig, build_trainer, prepare_site_data
from fedbn_med.federation.run import FlowerOptions, prepare_builtin, run_flower
from fedbn_med.sites import load_sites


def in_process_seconds(config: ExperimentConfig) -> float:
    """Return the wall time of the rounds alone (data loaded and trainers built before)."""
    sites = load_sites(list(config.sites))
    trainers = {n: build_trainer(s, config, prepare_site_data(s, config)) for n, s in
                sites.items()}
    started = time.perf_counter()
    run_in_process(trainers, config.strategy_obj(), config.rounds)
    return time.perf_counter() - started


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
                    if proc.pid not in roles:
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


def federated(config: ExperimentConfig, workdir: Path) -> dict:
    """Run over Flower; return the phases' wall times, CPU per role and set-up counts."""
    options = FlowerOptions(workdir=workdir, tracking_uri=f"sqlite:///{workdir / 'mlflow.db'}",
                            progress=False)
    with CpuSampler() as cpu:
        started = time.time()
        (result,) = run_flower([config], options, device="cpu")
        ended = time.time()
    run_dir = next(workdir.glob("run-0-*"))
    events = [json.loads(x) for x in (run_dir / "progress.jsonl").read_text().splitlines()]
    ready = next(e["t"] for e in events if e["event"] == "ready")
    first = next(e for e in events if e["event"] == "trained")
    rounds_start = first["t"] - first["seconds"]
    last = [e["t"] for e in events if e["event"] == "round"][-1]
    done = next(e["t"] for e in events if e["event"] == "done")
    usage = cpu.between(rounds_start, last)
    return {"startup": ready - started, "tracking_setup": rounds_start - ready,
            "rounds": last - rounds_start, "closing": done - last,
            "total": ended - started, "cpu": usage,
            "setups": sorted({int(r["setups"]) for r in result["rows"]})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args()
    rounds = args.rounds or (5 if args.quick else 50)
    torch.set_num_threads(1)
    base = ExperimentConfig(strategy="fedbn", rounds=rounds, device="cpu")
    prepare_builtin(base)
    rows = []
    with tempfile.TemporaryDirectory(prefix="fedbn-overhead-") as tmp:
        for label, config in (("E=1", base), ("E=8", base.replace(
                local_epochs=8, rounds=max(2, rounds // 5)))):
            inproc = in_process_seconds(config)
            fed = federated(config, Path(tmp) / label)
            rows.append((label, config, inproc, fed))
    print(f"\n4-site FedBN over Flower on 127.0.0.1 vs the in-process driver "
          f"({torch.get_num_threads()} thread in-process), {psutil.cpu_count()} CPUs\n")
    print("| run | rounds | in-process rounds s | federated rounds s | overhead/round s "
          "| fed/in-process | start-up s | MLflow set-up s | closing s | whole run s "
          "| set-ups per site |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for label, config, inproc, fed in rows:
        overhead = (fed["rounds"] - inproc) / config.rounds
        print(f"| {label} | {config.rounds} | {inproc:.2f} | {fed['rounds']:.2f} | "
              f"{overhead:.3f} | {fed['rounds'] / inproc:.2f} | {fed['startup']:.1f} | "
              f"{fed['tracking_setup']:.1f} | {fed['closing']:.1f} | {fed['total']:.1f} | "
              f"{fed['setups']} |")
    print("\nCPU seconds per round while the rounds run, by process:\n")
    roles = sorted({r for *_, fed in rows for r in fed["cpu"]})
    print("| run | " + " | ".join(roles) + " | total | wall s/round |")
    print("|---|" + "---|" * (len(roles) + 2))
    for label, config, _, fed in rows:
        cells = [fed["cpu"].get(r, 0.0) / config.rounds for r in roles]
        print(f"| {label} | " + " | ".join(f"{c:.3f}" for c in cells)
              + f" | {sum(cells):.3f} | {fed['rounds'] / config.rounds:.3f} |")
    print("\n(a) target: overhead per round < 0.5 s at 50 rounds; (b) start-up < 15 s; "
          "(c) E=8 federated <= 1.2x in-process; (d) set-ups per site == [1]")


if __name__ == "__main__":
    main()
