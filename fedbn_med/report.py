"""Results as a person would read them: per-site tables and convergence plots."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from fedbn_med.protocol import format_interval

__all__ = ["convergence_plot", "paper_table", "paper_table_csv", "result_columns", "site_table"]


def _fmt(value: float, pct: bool) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{100 * value:.1f}" if pct else f"{value:.3f}"


#: The epsilons a DP run reports: add/remove (the accountant's) and replace-one patient.
_EPSILONS = ("dp_epsilon", "dp_epsilon_replace_one")


def _epsilon_label(col: str, final: Mapping[str, Mapping[str, float]]) -> str:
    from fedbn_med.dp_terms import EPSILON_WARNING, NOT_PRIVATE

    name = "epsilon add/remove" if col == "dp_epsilon" else "epsilon replace-one"
    values = [float(m[col]) for m in final.values() if col in m]
    notes = ["mean row: max"]
    if any(v > EPSILON_WARNING for v in values):
        notes.append(f"above {EPSILON_WARNING:g}: weak")
    if any(float(m.get("dp_seeded", 0.0)) for m in final.values()):
        notes.append(NOT_PRIVATE)
    return f"{name} ({'; '.join(notes)})"


def result_columns(final: Mapping[str, Mapping[str, float]]) -> tuple[str, ...]:
    """Return the columns of a results table: every test metric but the loss, the epsilon a
    DP site spent, then size."""
    first = next(iter(final.values()), {})
    dp = tuple(k for k in _EPSILONS if any(k in m for m in final.values()))
    return (*[k for k in first if k.startswith("test_") and k != "test_loss"], *dp,
            "num_examples")


def site_table(
    final: Mapping[str, Mapping[str, float]],
    columns: Sequence[str] = ("test_accuracy", "test_auc", "test_balanced_accuracy",
                              "test_f1", "num_examples"),
) -> str:
    """Return a markdown table with one row per site and a mean row (rates in %)."""
    header = ["site", *[_epsilon_label(c, final) if c in _EPSILONS else
                        c.replace("test_", "") for c in columns]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for site in final:
        row = [site]
        for col in columns:
            value = final[site].get(col, math.nan)
            row.append(str(int(value)) if col == "num_examples"
                       else _fmt(value, col not in _EPSILONS))
        lines.append("| " + " | ".join(row) + " |")
    mean_row = ["mean"]
    for col in columns:
        vals = [float(final[s][col]) for s in final if col in final[s]]
        vals = [v for v in vals if not math.isnan(v)]
        if col == "num_examples":
            mean_row.append(str(int(sum(vals))) if vals else "n/a")
        elif col in _EPSILONS:  # the federation's worst case, not a mean
            mean_row.append(_fmt(max(vals), False) if vals else "n/a")
        else:
            mean_row.append(_fmt(float(np.mean(vals)), True) if vals else "n/a")
    lines.append("| " + " | ".join(mean_row) + " |")
    return "\n".join(lines)


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    arr = np.asarray([v for v in values if not math.isnan(v)], dtype=float)
    if arr.size == 0:
        return math.nan, math.nan
    return float(arr.mean()), float(arr.std(ddof=0))


def paper_table(
    results: Mapping[str, Mapping[str, Sequence[float]]], sites: Sequence[str],
    metric: str = "accuracy",
) -> str:
    """Return the paper-style markdown table: mean [95 % CI] in % over runs, per site and mean.

    Parameters
    ----------
    results : mapping
        ``{strategy: {site: [value per run]}}``.
    sites : sequence of str
        Column order.
    """
    header = ["method", *sites, "mean"]
    lines = [f"{metric} (%), mean [95 % CI] over runs", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for method, per_site in results.items():
        row = [method]
        means = []
        for site in sites:
            values = [float(v) for v in per_site.get(site, [])]
            means.append(_mean_std(values)[0])
            row.append(format_interval(values))
        finite = [m for m in means if not math.isnan(m)]
        row.append(f"{100 * float(np.mean(finite)):.1f}" if finite else "n/a")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def csv_text(rows: Sequence[Mapping[str, object]]) -> str:
    """Return rows of values as CSV text, one column per key seen (in first-seen order)."""
    buf = io.StringIO()
    fields = list(dict.fromkeys(k for row in rows for k in row))
    writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def paper_table_csv(results: Mapping[str, Mapping[str, Sequence[float]]],
                    sites: Sequence[str]) -> str:
    """Return the paper-style table as CSV (method, site, mean, std, runs)."""
    lines = ["method,site,mean,std,runs"]
    for method, per_site in results.items():
        for site in sites:
            vals = per_site.get(site, [])
            mean, std = _mean_std(vals)
            lines.append(f"{method},{site},{mean:.6f},{std:.6f},{len(vals)}")
    return "\n".join(lines) + "\n"


def convergence_plot(
    curves: Mapping[str, Sequence[Mapping[str, float]]], path: str | Path,
    metrics: Sequence[str] = ("train_loss", "test_accuracy"), title: str = "",
) -> Path:
    """Plot per-round curves (mean over sites) for each strategy and save a PNG.

    Parameters
    ----------
    curves : mapping
        ``{label: [history row, ...]}`` where rows hold ``round``, ``site`` and metrics.
    path : path
        Where to write the PNG.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics), 4), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        for label, rows in curves.items():
            by_round: dict[int, list[float]] = {}
            for row in rows:
                if metric in row and not math.isnan(float(row[metric])):
                    by_round.setdefault(int(row["round"]), []).append(float(row[metric]))
            if by_round:
                xs = sorted(by_round)
                ax.plot(xs, [np.mean(by_round[x]) for x in xs], marker="o", ms=3, label=label)
        ax.set_xlabel("round")
        ax.set_ylabel(metric.replace("_", " ") + " (mean over sites)")
        ax.grid(alpha=0.3)
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
