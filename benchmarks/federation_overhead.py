#!/usr/bin/env python
"""What Flower costs on top of the work: a 4-site FedBN federation vs the in-process driver.

Prints (a) the overhead per round (federated minus in-process wall time of the rounds),
(b) start-up until every site is ready, (c) the whole federated run against the
in-process run with 8 local epochs, and (d) how many times each site loaded its data and
built its model.

    python benchmarks/federation_overhead.py            # 50 rounds, then 8 local epochs
    python benchmarks/federation_overhead.py --quick    # a few rounds
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

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


def federated(config: ExperimentConfig, workdir: Path) -> dict:
    """Run over Flower; return start-up, rounds wall time, and set-up counts."""
    started = time.time()
    options = FlowerOptions(workdir=workdir, tracking_uri=f"sqlite:///{workdir / 'mlflow.db'}",
                            progress=False)
    (result,) = run_flower([config], options, device="cpu")
    run_dir = next(workdir.glob("run-0-*"))
    events = [json.loads(x) for x in (run_dir / "progress.jsonl").read_text().splitlines()]
    ready = next(e["t"] for e in events if e["event"] == "ready")
    done = next(e["t"] for e in events if e["event"] == "done")
    exchange = [e["seconds"] for e in events if e["event"] == "trained"][1:]
    return {"startup": ready - started, "rounds": done - ready, "total": time.time() - started,
            "exchange": sum(exchange) / max(1, len(exchange)),
            "setups": sorted({int(r["setups"]) for r in result["rows"]}),
            "sites": sorted({str(r["site"]) for r in result["rows"]})}


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
          f"({torch.get_num_threads()} thread in-process)\n")
    print("| run | rounds | in-process rounds s | federated rounds s | overhead/round s "
          "| send-to-replies s/round | start-up s | fed/in-process | set-ups per site |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, config, inproc, fed in rows:
        overhead = (fed["rounds"] - inproc) / config.rounds
        print(f"| {label} | {config.rounds} | {inproc:.2f} | {fed['rounds']:.2f} | "
              f"{overhead:.3f} | {fed['exchange']:.3f} | {fed['startup']:.1f} | "
              f"{fed['rounds'] / inproc:.2f} | "
              f"{fed['setups']} |")
    print("\n(a) target: overhead per round < 0.5 s at 50 rounds; (b) start-up < 15 s; "
          "(c) E=8 federated <= 1.2x in-process; (d) set-ups per site == [1]")


if __name__ == "__main__":
    main()
