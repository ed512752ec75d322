"""The benchmarks' figures: lines with error bars in side-by-side panels, grouped bars.

Matplotlib is imported (with the Agg backend) only when a figure is drawn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Panel", "Series", "bar_plot", "line_panels", "line_plot"]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


Series = Mapping[str, tuple[Sequence[float], Sequence[float], Sequence[float] | None]]


@dataclass(frozen=True)
class Panel:
    """One axes of a line figure: ``{label: (x, y, yerr or None)}`` and its labels."""

    series: Series
    xlabel: str
    ylabel: str
    xlog: bool = False
    hline: float | None = None


def line_panels(path: Path, panels: Sequence[Panel], *, title: str) -> Path:
    """Draw panels side by side as lines with error bars and save a PNG."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        for label, (xs, ys, err) in panel.series.items():
            ax.errorbar(xs, ys, yerr=err, marker="o", ms=4, capsize=3, label=label)
        if panel.hline is not None:
            ax.axhline(panel.hline, color="grey", lw=0.8, ls="--")
        if panel.xlog:
            ax.set_xscale("log")
        ax.set(xlabel=panel.xlabel, ylabel=panel.ylabel)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def line_plot(path: Path, series: Series, *, xlabel: str, ylabel: str, title: str,
              xlog: bool = False, hline: float | None = None) -> Path:
    """Plot ``{label: (x, y, yerr or None)}`` as lines with error bars and save a PNG."""
    return line_panels(path, [Panel(series, xlabel, ylabel, xlog, hline)], title=title)


def bar_plot(path: Path, groups: Sequence[str],
             series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
             *, ylabel: str, title: str) -> Path:
    """Plot ``{label: (means, stds)}`` as grouped bars, one group per entry of ``groups``."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(1.6 * len(groups) + 2, 4))
    width = 0.8 / max(len(series), 1)
    x = np.arange(len(groups))
    for i, (label, (means, stds)) in enumerate(series.items()):
        ax.bar(x + (i - (len(series) - 1) / 2) * width, means, width, yerr=stds, capsize=2,
               label=label)
    ax.set_xticks(x, groups)
    ax.set(ylabel=ylabel, title=title)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize="small", ncol=min(len(series), 5))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
