"""Training throughput of an imaging site, with MONAI's caching in memory, on disk, or none.

The MRI task runs in its 3D mode (patches drawn by ``RandCropByPosNegLabeld``) and is
measured in 3D patches per second; X-ray in radiographs per second. Each configuration
(task x caching) runs in a fresh process, so its peak memory (``ru_maxrss``; on CUDA also
the allocator's peak) is its own:

- ``memory``: ``CacheDataset`` keeps every decoded, resized, normalised volume;
- ``disk``: ``PersistentDataset`` keeps them as files (MRI only; the first epoch writes
  them, the timed epochs read them back);
- ``none``: every epoch decodes and preprocesses each file again.

Setup is building the site (decoding and caching; imports excluded); the first epoch is
a warm-up (it also imports the optimiser), then ``--epochs`` epochs are timed. Mixed
precision is used on CUDA.

    OMP_NUM_THREADS=1 python benchmarks/research/imaging_throughput.py [--quick] [--task mri]
        [--device cuda] [--publish]

``--publish`` also writes the figures as a table into ``benchmarks/published/`` (key
``imaging_throughput``, or ``imaging_throughput-<task>`` for ``--task xray|both``) with the
machine's load during the run, and rewrites the README block.
"""

from __future__ import annotations

import fedbn_med.numerics.pinned  # noqa: F401  (first: it fixes the numeric code path before numpy loads)

# isort: split
import argparse
import math
import multiprocessing as mp
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

SIZES = {  # task: (realistic settings, quick settings); the rest are the task's defaults
    "mri": ({"mode": "3d"}, {"mode": "3d", "image_size": 24, "subjects": 6,
                             "patch_size": 16, "patches": 2}),
    "xray": ({}, {"image_size": 32, "subjects": 6}),
}
SITE = {"mri": "SiteA", "xray": "HospitalA"}
CACHES = {"mri": ("memory", "disk", "none"), "xray": ("memory", "none")}
UNIT = {"mri": "3D patches", "xray": "radiographs"}
CACHE_LABEL = {"memory": "memory (`CacheDataset`)", "disk": "disk (`PersistentDataset`)",
               "none": "none"}


def _cache_settings(cache: str, folder: str) -> dict[str, object]:
    if cache == "memory":
        return {"cache": True}
    return {"cache": False, "cache_dir": folder if cache == "disk" else ""}


def _measure(task: str, extra: dict[str, object], epochs: int, device: str,
             data_dir: str, queue: mp.Queue) -> None:
    import torch

    from fedbn_med.spec import RunSpec
    from fedbn_med.tasks import get_task

    torch.set_num_threads(max(1, torch.get_num_threads()))
    import importlib

    config = RunSpec.for_task(task, strategy="fedbn", rounds=1, sites=(SITE[task],),
                              device=device, **extra)
    for module in get_task(task).preload:  # imports are not the site's setup
        importlib.import_module(module)
    start = time.perf_counter()
    trainer = get_task(task).build_site(SITE[task], config, Path(data_dir), device)
    setup = time.perf_counter() - start
    per_item = config.settings.patches if task == "mri" else 1
    start = time.perf_counter()
    trainer.fit({}, {"round": 1, "local_epochs": 1})  # warm-up (a disk cache is written)
    warmup = time.perf_counter() - start
    if trainer.device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    trainer.fit({}, {"round": 2, "local_epochs": epochs})
    if trainer.device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    items = trainer.data.num_train * per_item * epochs
    gpu_peak = (torch.cuda.max_memory_allocated() / 2**20
                if trainer.device.type == "cuda" else float("nan"))
    queue.put({"setup_s": setup, "warmup_s": warmup, "items": items, "seconds": elapsed,
               "per_s": items / elapsed, "amp": trainer.amp, "device": str(trainer.device),
               "shape": "x".join(map(str, trainer.input_shape[1:])),
               "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
               "gpu_peak_mib": gpu_peak})


def _prepare(task: str, extra: dict[str, object], data_dir: str) -> None:
    """Generate the built-in site once, so that no configuration's setup pays for it."""
    from fedbn_med.spec import RunSpec
    from fedbn_med.tasks.imaging import synth

    settings = RunSpec.for_task(task, **extra).settings
    ensure = synth.ensure_mri_site if task == "mri" else synth.ensure_xray_site
    ensure(SITE[task], size=settings.image_size, subjects=settings.subjects,
           seed=settings.data_seed, data_dir=data_dir)


def _result(queue: mp.Queue, proc: mp.process.BaseProcess) -> dict[str, object]:
    """Return the configuration's figures, or raise if its process died without them."""
    import queue as queues

    while True:
        try:
            result: dict[str, object] = queue.get(timeout=5)
            proc.join()
            return result
        except queues.Empty:
            if not proc.is_alive():
                raise RuntimeError(f"A measuring process exited with code {proc.exitcode} "
                                   "and no result; its error is printed above.") from None


def _report(results: list[dict[str, object]]) -> str:
    """Return the published table: one row per configuration."""
    from fedbn_med.evaluation.tables import markdown_table

    gpu = any(math.isfinite(float(r["gpu_peak_mib"])) for r in results)  # type: ignore[arg-type]
    header = ["task", "cache", "device", "amp", "input", "items", "items/s", "setup s",
              "warm-up epoch s", "peak RSS MiB", *(["GPU peak MiB"] if gpu else [])]
    body = [[r["task"], CACHE_LABEL[str(r["cache"])], r["device"], r["amp"], r["shape"],
             r["items"], f"{r['per_s']:.2f}", f"{r['setup_s']:.1f}", f"{r['warmup_s']:.1f}",
             f"{r['peak_rss_mib']:.0f}", *([f"{r['gpu_peak_mib']:.0f}"] if gpu else [])]
            for r in results]
    return markdown_table(header, body)


def _publish(args: argparse.Namespace, argv: list[str] | None, tasks: tuple[str, ...],
             results: list[dict[str, object]], epochs: int, load: tuple[float, float],
             seconds: float) -> None:
    """Write the figures into ``benchmarks/published/`` and rewrite the README block."""
    from _published import publish

    from fedbn_med.evaluation.report import csv_text
    from fedbn_med.spec import RunSpec

    data = []
    for task in tasks:
        s = RunSpec.for_task(task, **SIZES[task][1 if args.quick else 0]).settings
        size = "^3 volumes" if task == "mri" else "^2 radiographs"
        patches = (f", {s.patches} patches of {s.patch}^3 per training volume"
                   if task == "mri" else "")
        data.append(f"built-in {task} site {SITE[task]}: {s.image_size}{size}, "
                    f"{s.subjects} subjects{patches}")
    items = ", ".join(f"{t}: {UNIT[t]}" for t in tasks)
    protocol = (f"one warm-up epoch, then {epochs} timed epoch(s) ({items}); each "
                f"configuration in a fresh process; OMP_NUM_THREADS="
                f"{os.environ.get('OMP_NUM_THREADS', 'unset')}; measured on a shared "
                f"machine ({os.cpu_count()} cores, load average {load[0]:.1f} before and "
                f"{load[1]:.1f} after, other jobs running), so the rates are lower bounds")
    key = "imaging_throughput" if tasks == ("mri",) else f"imaging_throughput-{args.task}"
    folder = publish(key, name="imaging_throughput", argv=argv, report=_report(results),
                     csv_text=csv_text(results), data="; ".join(data), protocol=protocol,
                     wall_time_s=seconds)
    print(f"published to {folder}")


def main(argv: list[str] | None = None) -> int:
    """Run every configuration and print one line per configuration."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny volumes and images (CI)")
    p.add_argument("--task", choices=("mri", "xray", "both"), default="mri")
    p.add_argument("--epochs", type=int, default=None, help="timed epochs (default 2, quick 1)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="data root of the built-in sites (default: a temporary folder)")
    p.add_argument("--publish", action="store_true",
                   help="also write the table into benchmarks/published/ and the README")
    args = p.parse_args(argv)
    started, load_before = time.perf_counter(), os.getloadavg()[0]
    results: list[dict[str, object]] = []
    epochs = args.epochs or (1 if args.quick else 2)
    tasks = ("mri", "xray") if args.task == "both" else (args.task,)
    ctx = mp.get_context("spawn")
    print(f"{'task':5} {'cache':6} {'device':7} {'amp':5} {'input':9} {'items':>6} "
          f"{'items/s':>8} {'setup s':>8} {'warm-up s':>9} {'peak RSS MiB':>12} "
          f"{'GPU peak MiB':>12}")
    with tempfile.TemporaryDirectory(prefix="fedbn-throughput-") as tmp:
        data_dir = str(args.data_dir.resolve()) if args.data_dir else str(Path(tmp) / "data")
        for task in tasks:
            extra = SIZES[task][1 if args.quick else 0]
            _prepare(task, extra, data_dir)
            for cache in CACHES[task]:
                queue = ctx.Queue()
                settings = {**extra, **_cache_settings(cache, str(Path(tmp) / f"{task}-disk"))}
                proc = ctx.Process(target=_measure, args=(task, settings, epochs,
                                                          args.device, data_dir, queue))
                proc.start()
                result = _result(queue, proc)
                results.append({"task": task, "cache": cache, **result})
                print(f"{task:5} {cache:6} {result['device']:7} {result['amp']!s:5} "
                      f"{result['shape']:9} {result['items']:6d} {result['per_s']:8.2f} "
                      f"{result['setup_s']:8.1f} {result['warmup_s']:9.1f} "
                      f"{result['peak_rss_mib']:12.0f} {result['gpu_peak_mib']:12.0f}")
                sys.stdout.flush()
        print(f"\nitems: {', '.join(f'{t} {UNIT[t]}' for t in tasks)} per timed epoch "
              f"x {epochs} epoch(s)")
    if args.publish:
        _publish(args, argv, tasks, results, epochs, (load_before, os.getloadavg()[0]),
                 time.perf_counter() - started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
