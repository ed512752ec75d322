"""benchmarks/histo_figure.py --quick: a grid of predictions, a row per site, on generated tiles."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent


def test_the_figure_has_a_row_per_site_and_a_column_per_method(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import histo_figure
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    out = tmp_path / "grid.png"
    assert histo_figure.main(["--quick", "--runs", str(tmp_path / "runs"),
                              "--out", str(out)]) == 0

    # 4 generated sites; tile, annotation, FedBN and FedAvg; 48-pixel tiles
    with Image.open(out) as image:
        assert image.format == "PNG"
        assert image.size == histo_figure.grid_size(4, 4, 48)
    saved = np.load(tmp_path / "runs" / "predictions.npz")
    assert {k.split("/")[1] for k in saved.files} == {"image", "truth", "fedbn", "fedavg"}
    assert saved["H1/fedbn"].shape == saved["H1/truth"].shape == (48, 48)
    # a second call reuses the runs' folders (their weights) instead of training again
    stamp = (tmp_path / "runs" / "fedbn" / "shared.selected.safetensors").stat().st_mtime_ns
    histo_figure.main(["--quick", "--runs", str(tmp_path / "runs"), "--out", str(out)])
    assert (tmp_path / "runs" / "fedbn" / "shared.selected.safetensors").stat().st_mtime_ns \
        == stamp
