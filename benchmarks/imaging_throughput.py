"""Images per second through an imaging site's training loop, with caching on and off.

Each configuration (task x caching) runs in a fresh process so that its peak memory
(``ru_maxrss``; on CUDA also the allocator's peak) is its own. Mixed precision is used on
CUDA. ``--quick`` uses tiny images for CI.

    OMP_NUM_THREADS=1 python benchmarks/imaging_throughput.py [--quick] [--task mri]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import sys
import time
from pathlib import Path

SIZES = {  # task: (realistic settings, quick settings); the rest are the task's defaults
    "mri": ({}, {"image_size": 16, "subjects": 6, "slices": 4}),
    "xray": ({}, {"image_size": 32, "subjects": 6}),
}
SITE = {"mri": "SiteA", "xray": "HospitalA"}


def _measure(task: str, extra: dict[str, object], epochs: int, device: str,
             data_dir: str | None, queue: mp.Queue) -> None:
    import torch

    from fedbn_med.spec import RunSpec
    from fedbn_med.tasks import get_task

    torch.set_num_threads(max(1, torch.get_num_threads()))
    config = RunSpec.for_task(task, strategy="fedbn", rounds=1, sites=(SITE[task],),
                              device=device, **extra)
    start = time.perf_counter()
    trainer = get_task(task).build_site(SITE[task], config,
                                        Path(data_dir) if data_dir else None, device)
    setup = time.perf_counter() - start
    per_item = config.settings.slices if task == "mri" else 1
    trainer.fit({}, {"round": 1, "local_epochs": 1})  # warm-up (and first decode)
    if trainer.device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    trainer.fit({}, {"round": 2, "local_epochs": epochs})
    if trainer.device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    images = trainer.data.num_train * per_item * epochs
    gpu_peak = (torch.cuda.max_memory_allocated() / 2**20
                if trainer.device.type == "cuda" else float("nan"))
    queue.put({"setup_s": setup, "images": images, "seconds": elapsed,
               "images_per_s": images / elapsed, "amp": trainer.amp,
               "device": str(trainer.device),
               "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
               "gpu_peak_mib": gpu_peak})


def main(argv: list[str] | None = None) -> None:
    """Run every configuration and print one line per configuration."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny images (CI)")
    p.add_argument("--task", choices=("mri", "xray", "both"), default="both")
    p.add_argument("--epochs", type=int, default=None, help="timed epochs (default 2, quick 1)")
    p.add_argument("--device", default="auto")
    p.add_argument("--data-dir", default=None)
    args = p.parse_args(argv)
    epochs = args.epochs or (1 if args.quick else 2)
    tasks = ("mri", "xray") if args.task == "both" else (args.task,)
    ctx = mp.get_context("spawn")
    print(f"{'task':5} {'cache':5} {'device':6} {'amp':5} {'images':>6} {'img/s':>8} "
          f"{'setup s':>8} {'peak RSS MiB':>12} {'GPU peak MiB':>12}")
    for task in tasks:
        extra = SIZES[task][1 if args.quick else 0]
        for cache in (True, False):
            queue = ctx.Queue()
            proc = ctx.Process(target=_measure, args=(
                task, {**extra, "cache": cache}, epochs, args.device,
                args.data_dir, queue))
            proc.start()
            result = queue.get()
            proc.join()
            print(f"{task:5} {'on' if cache else 'off':5} {result['device']:6} "
                  f"{result['amp']!s:5} {result['images']:6d} "
                  f"{result['images_per_s']:8.1f} {result['setup_s']:8.1f} "
                  f"{result['peak_rss_mib']:12.0f} {result['gpu_peak_mib']:12.0f}")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
