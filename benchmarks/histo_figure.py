"""Histopathology: one cell's predictions as a grid of tiles, one row per site.

For one (seed, fold), each method is trained through the public face
(:func:`fedbn_med.run`, task ``histo``; its run folder, the selected round's shared and
kept weights, goes to ``<runs>/<method>``, and a folder that already holds them is
reused), then each site's model (the shared weights with the site's kept layers, e.g.
its BN layers under FedBN) predicts the site's first test tile by the task's sliding
window. The predicted masks are saved (``<runs>/predictions.npz``) and drawn: per site,
the tile's central crop, its annotated nuclei, and each method's prediction (white:
nucleus found; red: predicted where there is none; blue: nucleus missed), with the
tile's Dice.

    python benchmarks/histo_figure.py --data-dir /path/to/monuseg --rule hospital \\
        --rounds 8 --patch 64 --patches 8 --eval-crop 512 --runs /tmp/histo-figure \\
        --out docs/results/histo_predictions.png

``--quick``: FedBN and FedAvg, one round on tiny generated tiles (seconds).
"""

from __future__ import annotations

import fedbn_med.numerics.pinned  # noqa: F401  (first: it fixes the numeric code path before numpy loads)

# isort: split
import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from histo_compare import add_data_options, add_model_options
from PIL import Image, ImageDraw

import fedbn_med as fb
from fedbn_med.checkpoint import load_tensors
from fedbn_med.tasks.histo.data import site_data, site_tiles
from fedbn_med.tasks.histo.metrics import dice
from fedbn_med.tasks.histo.objective import NucleiSegmentation

#: Pixels between cells, and the height of the header row of column titles.
PAD, HEADER = 4, 18


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_options(p, "fedbn,fedavg,silobn")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fold", type=int, default=0)
    p.add_argument("--n-folds", type=int, default=5)
    p.add_argument("--rounds", type=int, default=8)
    add_model_options(p, eval_crop=512)
    p.add_argument("--show", type=int, default=192, help="edge of the crop drawn, in pixels")
    p.add_argument("--runs", type=Path, required=True, help="the methods' run folders")
    p.add_argument("--out", type=Path, required=True, help="the PNG to write")
    p.add_argument("--quick", action="store_true", help="tiny generated tiles, 2 methods")
    args = p.parse_args(argv)
    if args.quick:
        args.data_dir, args.rule, args.methods, args.rounds = None, "datalist", "fedbn,fedavg", 1
        args.n_folds, args.patch, args.patches, args.eval_crop = 4, 16, 2, 0
        args.channels, args.batch_size, args.show = "4,8", 4, 48
    return args


def spec_of(args: argparse.Namespace, method: str) -> Any:
    """Return the run spec of one method in the figure's cell."""
    settings: dict[str, Any] = dict(
        strategy=method, seed=args.seed, fold=args.fold, n_folds=args.n_folds,
        rounds=args.rounds, batch_size=args.batch_size, patch_size=args.patch,
        patches=args.patches, eval_crop=args.eval_crop, channels=args.channels,
        site_rule=args.rule, device="cpu", data_dir=args.data_dir)
    if args.quick:
        settings.update(synthetic_tiles=4, synthetic_size=48)
    spec = fb.RunSpec.for_task("histo", **settings)
    sites = (tuple(args.sites.split(",")) if args.sites else tuple(sorted(site_tiles(spec)))
             if args.data_dir is not None else spec.sites)
    return spec.replace(sites=sites)


def site_model(spec: Any, folder: Path, site: str) -> torch.nn.Module:
    """Return a site's model of a run: the shared weights with the site's kept layers."""
    state: dict[str, torch.Tensor] = {}
    for path in (folder / "shared.selected.safetensors", folder / f"{site}.selected.safetensors"):
        if path.is_file():
            state.update(load_tensors(path)[0])
    model = fb.get_task("histo").build_server_model(spec, spec.input_shape())
    model.load_state_dict(state)
    return model.eval()


def predict(args: argparse.Namespace) -> dict[str, Any]:
    """Train (or reuse) each method's run; return every site's first test tile and masks."""
    out: dict[str, Any] = {}
    for method in args.methods.split(","):
        spec = spec_of(args, method)
        folder = args.runs / method
        if not (folder / "shared.selected.safetensors").is_file():
            fb.run(spec, workdir=folder)
        inferer = NucleiSegmentation(args.patch, batch=args.batch_size).inferer
        for site in spec.sites:
            item = site_data(site, spec).test[0]
            out.setdefault(f"{site}/image", np.asarray(item["image"]))
            out.setdefault(f"{site}/truth", np.asarray(item["inst"])[0] > 0)
            with torch.no_grad():
                logits = inferer(torch.as_tensor(item["image"])[None], site_model(
                    spec, folder, site))
            out[f"{site}/{method}"] = np.asarray(logits.argmax(1)[0]).astype(bool)
    return out


def grid_size(sites: int, columns: int, show: int) -> tuple[int, int]:
    """Return the figure's (width, height) in pixels: a row per site, a column per panel."""
    return PAD + columns * (show + PAD), HEADER + PAD + sites * (show + PAD)


def draw(masks: dict[str, Any], methods: list[str], show: int, path: Path) -> tuple[int, int]:
    """Draw the grid of central crops to ``path`` (PNG); return its size in pixels."""
    sites = sorted({k.split("/")[0] for k in masks})
    titles = ["tile", "annotated", *methods]
    width, height = grid_size(len(sites), len(titles), show)
    canvas = Image.new("RGB", (width, height), "white")
    pen = ImageDraw.Draw(canvas)
    for c, title in enumerate(titles):
        pen.text((PAD + c * (show + PAD) + 2, 3), title, fill="black")
    for r, site in enumerate(sites):
        truth = masks[f"{site}/truth"]
        top = (truth.shape[0] - show) // 2 if truth.shape[0] > show else 0
        left = (truth.shape[1] - show) // 2 if truth.shape[1] > show else 0
        window = (slice(top, top + show), slice(left, left + show))
        rgb = (np.clip(masks[f"{site}/image"], 0, 1) * 255).astype(np.uint8).transpose(1, 2, 0)
        panels = [(rgb[window], site), (np.repeat(truth[window][..., None] * 255, 3, -1), "")]
        for method in methods:
            pred = masks[f"{site}/{method}"]
            colour = np.zeros((*truth.shape, 3), np.uint8)
            colour[pred & truth] = 255
            colour[pred & ~truth] = (220, 40, 40)
            colour[~pred & truth] = (60, 110, 255)
            panels.append((colour[window], f"Dice {100 * dice(pred, truth):.0f}"))
        y = HEADER + PAD + r * (show + PAD)
        for c, (pixels, label) in enumerate(panels):
            x = PAD + c * (show + PAD)
            tile = Image.fromarray(np.ascontiguousarray(pixels, dtype=np.uint8))
            canvas.paste(tile.resize((show, show), Image.Resampling.NEAREST), (x, y))
            if label:
                pen.rectangle((x, y, x + 7 * len(label) + 4, y + 13), fill="black")
                pen.text((x + 2, y + 1), label, fill="white")
    path.parent.mkdir(parents=True, exist_ok=True)
    canvas.save(path, optimize=True)
    return canvas.size


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    args.runs.mkdir(parents=True, exist_ok=True)
    masks = predict(args)
    np.savez_compressed(args.runs / "predictions.npz", **masks)
    size = draw(masks, args.methods.split(","), args.show, args.out)
    print(f"Wrote {args.out} ({size[0]} x {size[1]} pixels, "
          f"{args.out.stat().st_size // 1024} KB); predictions in {args.runs / 'predictions.npz'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
