"""Results as a person would read them: per-site tables and convergence plots."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedbn_med.evaluation.selection import Rule, select_round
from fedbn_med.evaluation.tables import format_interval, markdown_table

__all__ = ["RunResult", "convergence_plot", "metrics_at", "one_class_sites", "paper_table",
           "paper_table_csv", "result_columns", "run_result", "site_table"]


def _fmt(value: float, pct: bool) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{100 * value:.1f}" if pct else f"{value:.3f}"


#: The epsilons a DP run reports: add/remove (the accountant's) and replace-one patient.
_EPSILONS = ("dp_epsilon", "dp_epsilon_replace_one")


def _epsilon_label(col: str, final: Mapping[str, Mapping[str, float]]) -> str:
    from fedbn_med.fl.dp_terms import EPSILON_WARNING, NOT_PRIVATE

    name = "epsilon add/remove" if col == "dp_epsilon" else "epsilon replace-one"
    values = [float(m[col]) for m in final.values() if col in m]
    notes = ["mean row: max"]
    if any(v > EPSILON_WARNING for v in values):
        notes.append(f"above {EPSILON_WARNING:g}: weak")
    if any(float(m.get("dp_seeded", 0.0)) for m in final.values()):
        notes.append(NOT_PRIVATE)
    return f"{name} ({'; '.join(notes)})"


#: What a site reports beside its scores, in this order after them (``test_n`` first).
_COUNTS = ("test_n", "test_majority_rate", "test_positive_rate")
_HEADERS = {"test_n": "test n", "test_majority_rate": "majority rate",
            "test_positive_rate": "predicted positive", "num_examples": "train examples",
            "test_balanced_accuracy": "balanced accuracy", "test_auc": "AUC"}
#: The scores shown again at the last round, beside the selected round's (those present).
_LAST = ("test_accuracy", "test_balanced_accuracy", "test_auc", "test_dice")


def result_columns(final: Mapping[str, Mapping[str, float]]) -> tuple[str, ...]:
    """Return the columns of a results table, in order.

    Test n, every test score but the loss, the majority rate and the share predicted
    positive, the epsilon a DP site spent, then the training size.
    """
    first = next(iter(final.values()), {})
    dp = tuple(k for k in _EPSILONS if any(k in m for m in final.values()))
    counts = [k for k in _COUNTS if any(k in m for m in final.values())]
    scores = [k for k in first if k.startswith("test_") and k != "test_loss"
              and k not in _COUNTS]
    return (*counts[:1], *scores, *counts[1:], *dp, "num_examples")


def _wilson_cell(metrics: Mapping[str, float], value: float) -> str:
    from fedbn_med.evaluation.intervals import wilson_interval

    n = metrics.get("test_n", math.nan)
    if math.isnan(value) or not (math.isfinite(n) and n >= 1):
        return _fmt(value, True)
    low, high = wilson_interval(value * round(n), int(round(n)))
    return f"{100 * value:.1f} [{100 * low:.1f}, {100 * high:.1f}]"


def _header(col: str, final: Mapping[str, Mapping[str, float]]) -> str:
    if col in _EPSILONS:
        return _epsilon_label(col, final)
    if col == "test_accuracy" and any("test_n" in m for m in final.values()):
        return "accuracy [95 % Wilson]"
    return _HEADERS.get(col, col.replace("test_", ""))


def site_table(
    final: Mapping[str, Mapping[str, float]],
    columns: Sequence[str] = ("test_accuracy", "test_auc", "test_balanced_accuracy",
                              "test_f1", "num_examples"),
    *, last: Mapping[str, Mapping[str, float]] | None = None, last_label: str = "last",
) -> str:
    """Return a markdown table with one row per site and a mean row (rates in %).

    A site's accuracy carries its Wilson 95 % interval when the site reported its test
    ``n``; the mean row holds the mean over sites (counts: the sum). With ``last``, the
    headline scores of those metrics (e.g. the last round's) follow, headed
    ``last_label``.
    """
    extra = [c for c in _LAST if last and any(c in m for m in last.values())]
    header = ["site", *[_header(c, final) for c in columns],
              *[f"{last_label}: {_header(c, {}).split(' [')[0]}" for c in extra]]
    body = []
    for site in final:
        row = [site]
        for col in columns:
            value = float(final[site].get(col, math.nan))
            if col in ("num_examples", "test_n"):
                row.append("n/a" if math.isnan(value) else str(int(round(value))))
            elif col == "test_accuracy":
                row.append(_wilson_cell(final[site], value))
            else:
                row.append(_fmt(value, col not in _EPSILONS))
        row += [_fmt(float((last or {}).get(site, {}).get(c, math.nan)), True) for c in extra]
        body.append(row)
    mean_row = ["mean"]
    for table, cols in ((final, columns), (last or {}, extra)):
        for col in cols:
            vals = [float(table[s][col]) for s in table if col in table[s]]
            vals = [v for v in vals if not math.isnan(v)]
            if col in ("num_examples", "test_n"):
                mean_row.append(str(int(round(sum(vals)))) if vals else "n/a")
            elif col in _EPSILONS:  # the federation's worst case, not a mean
                mean_row.append(_fmt(max(vals), False) if vals else "n/a")
            else:
                mean_row.append(_fmt(float(np.mean(vals)), True) if vals else "n/a")
    return markdown_table(header, [*body, mean_row])


def metrics_at(rows: Sequence[Mapping[str, Any]], rnd: int,
               sites: Sequence[str] | None = None) -> dict[str, dict[str, float]]:
    """Return each site's metrics at round ``rnd`` (in ``sites`` order, else as found)."""
    found = {str(r["site"]): {k: v for k, v in r.items() if k not in ("round", "site")}
             for r in rows if int(r["round"]) == rnd}
    return found if sites is None else {s: found[s] for s in sites if s in found}


#: What a run spends over all its rounds: reported from its last round at any round.
_RUN_TOTALS = (*_EPSILONS, "dp_delta", "dp_seeded")


@dataclass(frozen=True)
class RunResult:
    """A single run's result: its selected round's model, with the last round beside it.

    Attributes
    ----------
    selected_round : int
        The round with the lowest mean validation loss over the sites
        (:func:`fedbn_med.evaluation.comparison.best_round`, the comparison protocol's rule): the
        run's result is that round's model. No test split takes part in choosing it.
    last_round : int
        The run's last round.
    selected, last : dict
        Each site's metrics at those rounds. A DP site's epsilon in ``selected`` is the
        whole run's (its last round's): the run spent it, whichever round is kept.
    table : str
        The per-site markdown table, with the selection, the saved weights and any
        one-class site stated under it.
    one_class : tuple of str
        Sites whose model predicts one class only at the selected round.
    """

    selected_round: int
    last_round: int
    selected: dict[str, dict[str, float]]
    last: dict[str, dict[str, float]]
    table: str
    one_class: tuple[str, ...] = ()


def one_class_sites(selected: Mapping[str, Mapping[str, float]]) -> tuple[str, ...]:
    """Return the sites whose scores say they predict one class only (binary tasks)."""
    return tuple(site for site, m in selected.items()
                 if float(m.get("test_positive_rate", 0.5)) in (0.0, 1.0))


def run_result(rows: Sequence[Mapping[str, Any]], sites: Sequence[str] | None = None, *,
               weights_round: int | None = None, selected_weights_round: int | None = None,
               private_note: str = "", rule: Rule | None = None) -> RunResult:
    """Return a run's result from its per-round rows: the selected round, then the last.

    Parameters
    ----------
    rows : sequence of mapping
        One row per (round, site), as :class:`fedbn_med.training.inprocess.History` holds them.
    sites : sequence of str, optional
        Table order (default: as found in the rows).
    weights_round : int, optional
        The round whose shared weights the run saves, stated under the table (None: the
        run saves no shared weights, e.g. SingleSet).
    selected_weights_round : int, optional
        The round of the selected round's shared weights the run saves too (None: none
        kept); stated only when it is the selected round.
    private_note : str
        Where the sites keep their private layers of the selected round, said after.
    rule : Rule, optional
        The task's selection rule (its ``Task.selection``; None: the lowest mean
        validation loss).
    """
    chosen = select_round(rows, rule)
    last = max(int(r["round"]) for r in rows)
    at_last = metrics_at(rows, last, sites)
    selected = {site: {**m, **{k: at_last[site][k] for k in _RUN_TOTALS
                               if k in at_last.get(site, {})}}
                for site, m in metrics_at(rows, chosen, sites).items()}
    table = site_table(selected, result_columns(selected), last=at_last,
                       last_label=f"round {last}")
    metric, lower = ("loss", True) if rule is None else (rule.metric, rule.lower)
    if any(f"val_{metric}" in r for r in rows):
        how = (f"the {'lowest' if lower else 'highest'} mean validation "
               f"{metric.replace('_', ' ')} over the sites")
    else:
        how = f"no validation {metric.replace('_', ' ')} was reported: the last round"
    notes = [f"Round {chosen} of {last} selected ({how}); the last round's scores beside it."]
    if weights_round is None:
        notes.append("No shared weights are saved.")
    elif weights_round == chosen:
        notes.append(f"Saved model: the shared weights of round {weights_round}, the "
                     f"selected round.{private_note}")
    elif selected_weights_round == chosen:
        notes.append(f"Saved models: the shared weights of the selected round {chosen} "
                     f"(model/selected) and of the last round {weights_round} "
                     f"(model).{private_note}")
    else:
        notes.append(f"Saved model: the shared weights of round {weights_round}, not of the "
                     f"selected round {chosen}.")
    one_class = one_class_sites(selected)
    for site in one_class:
        share = 100 * float(selected[site]["test_positive_rate"])
        notes.append(f"Warning: {site} predicts one class only at round {chosen} (predicted "
                     f"positive {share:.0f} %): its accuracy is that class's share of its "
                     "test split.")
    return RunResult(chosen, last, selected, at_last,
                     table + "\n\n" + "\n".join(notes), one_class)


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
    body = []
    for method, per_site in results.items():
        row = [method]
        means = []
        for site in sites:
            values = [float(v) for v in per_site.get(site, [])]
            means.append(_mean_std(values)[0])
            row.append(format_interval(values))
        finite = [m for m in means if not math.isnan(m)]
        row.append(f"{100 * float(np.mean(finite)):.1f}" if finite else "n/a")
        body.append(row)
    return f"{metric} (%), mean [95 % CI] over runs\n\n" + markdown_table(header, body)


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


def progress_postfix(per_site: Mapping[str, Mapping[str, float]]) -> dict[str, str]:
    """Return what a progress bar shows after a round: the sites' mean validation loss.

    The validation loss is what picks the reported round, so the bar shows it; test
    scores stay out of sight while a run trains, where no one can pick a round by them.
    """
    losses = [float(m["val_loss"]) for m in per_site.values()
              if "val_loss" in m and math.isfinite(float(m["val_loss"]))]
    shown = {"sites": str(len(per_site))}
    if losses:
        shown["val_loss"] = f"{sum(losses) / len(losses):.4f}"
    return shown

