#!/usr/bin/env python
"""What SecAgg+ costs per round: FedBN over Flower, plain and under secure aggregation.

Runs the 4-site ABIDE FedBN federation on 127.0.0.1 with the same spec, plain and with
``--secagg`` (Flower's SecAgg+ workflow and mod: four exchanges per round instead of one,
masks and their shares), and prints the seconds and exchanges per round of each and their
ratio (target: SecAgg at most 2x plain FedBN on 4 sites). With ``--repeat N`` the two
runs alternate N times; the medians are printed, and the median ratio of the pairs: a
shared machine's speed drifts between runs minutes apart.

    python benchmarks/secagg_overhead.py              # 20 rounds each
    python benchmarks/secagg_overhead.py --quick      # 3 rounds each
    python benchmarks/secagg_overhead.py --repeat 3   # plain, SecAgg+, three times over
    python benchmarks/secagg_overhead.py --local-epochs 8 --rounds 5

A round is timed as the federation overhead benchmark does: from the start of round 1 to
the last round's scores, over the rounds; the median of the server's own per-round times
(its ``trained`` events, round 1 left out: the sites warm up) is printed next to it. So is
the SuperLink's CPU time per round over the same span (sampled every 0.2 s): every message
moves as several HTTP requests through it (the message, then each of its objects, each
way), and on a small model a round costs those requests rather than its arithmetic.
"""

from __future__ import annotations

import fedbn_med.numerics.pinned  # noqa: F401  (first: it fixes the numeric code path before numpy loads)

# isort: split
import argparse
import statistics
import tempfile
from pathlib import Path

from federation_overhead import CpuSampler

from fedbn_med import run
from fedbn_med.federation.events import Round, Trained, read_events
from fedbn_med.spec import RunSpec
from fedbn_med.tasks import get_task


def per_round(spec: RunSpec, workdir: Path, secagg: bool) -> dict[str, float]:
    """Run ``spec`` over Flower; return its seconds per round (two measures) and the
    SuperLink's CPU seconds per round."""
    with CpuSampler(every=0.2) as cpu:
        run(spec, engine="flower", workdir=workdir,
            tracking_uri=f"sqlite:///{workdir / 'mlflow.db'}", server={"secagg": secagg})
    run_dir = next(workdir.glob("run-0-*"))
    events = read_events(run_dir / "progress.jsonl", strict=False)
    trained = [e for e in events if isinstance(e, Trained)]
    start = trained[0].t - trained[0].seconds
    last = [e.t for e in events if isinstance(e, Round)][-1]
    later = trained[1:] or trained
    return {"rounds": (last - start) / spec.rounds,
            "median": statistics.median(e.seconds for e in later),
            "exchanges": statistics.median(e.exchanges for e in later),
            "superlink_cpu": cpu.between(start, last).get("SuperLink", float("nan"))
            / spec.rounds}


def main(argv: list[str] | None = None) -> None:
    """Measure both runs and print the table; ``argv`` as on the command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds each")
    parser.add_argument("--rounds", type=int, default=None, help="rounds each (default 20)")
    parser.add_argument("--local-epochs", type=int, default=1,
                        help="local epochs per round (default 1): more compute per round, "
                             "the same SecAgg+ exchanges")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs of each, alternating; medians printed (default 1)")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {args.repeat}")
    rounds = args.rounds or (3 if args.quick else 20)
    spec = RunSpec(strategy="fedbn", rounds=rounds, device="cpu",
                   local_epochs=args.local_epochs)
    get_task("abide").prepare(spec)
    runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="fedbn-secagg-") as tmp:
        for k in range(args.repeat):
            for secagg in (False, True):
                runs[secagg].append(per_round(spec, Path(tmp) / f"{k}-{secagg}", secagg))
    plain, secure = ({key: statistics.median(r[key] for r in runs[s]) for key in runs[s][0]}
                     for s in (False, True))
    print(f"\nFedBN over Flower on 127.0.0.1, {len(spec.sites)} sites "
          f"({', '.join(spec.sites)}), {rounds} rounds of {spec.local_epochs} local "
          f"epoch(s) each, {args.repeat} run(s) each (medians)\n")
    print("| run | s/round (rounds phase) | median s/round (server, rounds 2+) | "
          "exchanges per round (rounds 2+) | SuperLink CPU s/round |")
    print("|---|---|---|---|---|")
    for label, row in (("plain FedBN", plain), ("SecAgg+ FedBN", secure)):
        print(f"| {label} | {row['rounds']:.3f} | {row['median']:.3f} | "
              f"{row['exchanges']:g} | {row['superlink_cpu']:.3f} |")
    pairs = list(zip(runs[False], runs[True]))  # each ratio of runs a minute apart
    ratio = statistics.median(s["rounds"] / p["rounds"] for p, s in pairs)
    median = statistics.median(s["median"] / p["median"] for p, s in pairs)
    print(f"\nSecAgg+ / plain: {ratio:.2f}x per round (median {median:.2f}x);"
          " target at most 2x on 4 sites")


if __name__ == "__main__":
    main()
