"""Subjects per second from 4D BOLD to ROI series, with and without cleaning, on 2 cores.

The built-in scan site (6 mm, fMRIPrep-style, int16 NIfTI) is generated once into a
temporary folder; each setting then runs :func:`extract_site` in a fresh process so that
its peak memory (``ru_maxrss``) is its own, and the time per step of the MONAI chain
(``LoadImaged``, ``CheckBoldd``, ``ResampleToAtlasd``, ``ExtractRoiSignalsd``, writing)
says where it goes. Writes ``table.md`` and ``table.csv`` under
``benchmarks/results/scan_throughput/``.

    OMP_NUM_THREADS=1 python benchmarks/research/scan_throughput.py [--quick]
"""

from __future__ import annotations

import fedbn_med.numerics.pinned  # noqa: F401  (first: it fixes the numeric code path before numpy loads)

# isort: split
import argparse
import multiprocessing as mp
import resource
import tempfile
import time
from pathlib import Path

import _on_path  # noqa: F401  (benchmarks/ on the path: the shared _common, _sweep, _plots)
from _common import markdown_table  # noqa: E402

STEPS = ("LoadImaged", "CheckBoldd", "ResampleToAtlasd", "ExtractRoiSignalsd", "write")


def _measure(bids: str, out: str, clean: bool, queue: mp.Queue) -> None:
    from fedbn_med.tasks.abide.scans import Cleaning, extract_site

    start = time.perf_counter()
    report = extract_site(bids, out, site="CITY",
                          cleaning=Cleaning() if clean else Cleaning.off())
    elapsed = time.perf_counter() - start
    queue.put({"cleaning": "on" if clean else "off", "subjects": len(report.written),
               "seconds": round(elapsed, 2),
               "subjects_per_s": round(len(report.written) / elapsed, 2),
               "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
               **{f"{k}_s": round(report.seconds.get(k, 0.0), 2) for k in STEPS}})


def main(argv: list[str] | None = None) -> int:
    """Generate the scans, time each setting and print the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="8 subjects x 60 volumes (CI)")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "results"
                   / "scan_throughput", help="where table.md and table.csv go")
    args = p.parse_args(argv)
    started = time.perf_counter()
    from fedbn_med.tasks.abide.scans.builtin import generate_scan_site

    size = {"n_subjects": 8, "n_volumes": 60} if args.quick else {}
    with tempfile.TemporaryDirectory(prefix="scan_throughput_") as tmp:
        gen = time.perf_counter()
        bids = generate_scan_site(Path(tmp) / "bids", **size)
        print(f"Generated the built-in scans in {time.perf_counter() - gen:.1f} s")
        ctx = mp.get_context("spawn")
        rows = []
        for clean in (True, False):
            queue = ctx.Queue()
            proc = ctx.Process(target=_measure, args=(str(bids), f"{tmp}/out-{clean}", clean,
                                                      queue))
            proc.start()
            rows.append(queue.get())
            proc.join()
    header = ["cleaning", "subjects", "seconds", "subjects/s", "peak RSS MiB",
              *[f"{s} s" for s in STEPS]]
    table = markdown_table(header, [list(r.values()) for r in rows])
    print(table)
    print(f"Wall time {time.perf_counter() - started:.1f} s")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text(table + "\n", encoding="utf-8")
    from fedbn_med.evaluation.report import csv_text

    (args.out / "table.csv").write_text(csv_text(rows), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
