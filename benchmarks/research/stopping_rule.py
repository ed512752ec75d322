"""Judge the stopping rule by nested cross-validation: no outer test fold is ever read.

Which round a run reports (its best-validation-loss round, its best-validation-AUC
round, a smoothed validation loss, or a fixed number of rounds) cannot be chosen on the
validation scores that pick the round, and must not be chosen on test scores. Here each
outer fold's training part is split again (:func:`fedbn_med.tasks.abide.splits.nested_split`):
FedBN trains on the inner training subjects, every rule picks its round from the inner
validation subjects, and the rules are scored on the inner test subjects, who are part
of the outer training part. The outer test folds are not loaded into any run.

The criterion, the same rule as ``defaults_sweep.py``'s: the inner-test AUC (mean over
sites and runs) per group; a rule replaces the default (the best-validation-loss round)
only where it is best in every group and beats the default in every group.

    python benchmarks/research/stopping_rule.py --data-dir DIR [--quick] [--rounds R] [--folds N]
        [--inner-folds K] [--groups PITT,YALE,KKI,TRINITY/MAX_MUN,STANFORD,CALTECH,SDSU]
"""

from __future__ import annotations

import fedbn_med.numerics.pinned  # noqa: F401  (first: it fixes the numeric code path before numpy loads)

# isort: split
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import _on_path  # noqa: F401  (benchmarks/ on the path: the shared _common, _sweep, _plots)
import numpy as np
from _common import (
    N_FOLDS,
    Benchmark,
    Budget,
    curve,
    make_parser,
    markdown_table,
    positive_int,
    scratch_dir,
    site_mean,
)
from _plots import bar_plot
from _sweep import corrected, inner_datas, inner_references, one_class_sites
from defaults_sweep import add_groups_option, resolve_groups

from fedbn_med import run
from fedbn_med.evaluation.comparison import REFERENCES

NAME = "stopping_rule"
#: The default rule first; a fixed-rounds rule reports round R of the run.
FIXED = (25, 50, 100, 150, 200)
SMOOTH = 10


def _argbest(curve: np.ndarray, lower: bool) -> int:
    if not np.isfinite(curve).any():
        return len(curve)
    return int(np.nanargmin(curve) if lower else np.nanargmax(curve)) + 1


def rules(rounds: int) -> dict[str, Callable[[Any], int]]:
    """Return each stopping rule (its round from a run's history), the default first."""
    def smoothed(history: Any) -> int:
        width = min(SMOOTH, rounds)
        # a centred moving mean: the round is the middle of the best window
        means = np.convolve(np.nan_to_num(curve(history, "val_loss"), nan=np.inf),
                            np.ones(width) / width, mode="valid")
        return _argbest(means, lower=True) + width // 2

    out: dict[str, Callable[[Any], int]] = {
        "best validation loss": lambda h: _argbest(curve(h, "val_loss"), True),
        "best validation AUC": lambda h: _argbest(curve(h, "val_auc"), False),
        f"validation loss, {SMOOTH}-round moving mean": smoothed,
    }
    for fixed in FIXED:
        if fixed <= rounds:
            out[f"fixed: round {fixed}"] = lambda _r, f=fixed: f
    if rounds not in FIXED:
        out[f"fixed: round {rounds}"] = lambda _r: rounds
    return out


def score_at(history: Any, rnd: int) -> dict[str, float]:
    """Return the inner-test AUC, balanced accuracy and one-class share at round ``rnd``."""
    one = [float(r["test_positive_rate"]) in (0.0, 1.0) for r in history.rows
           if int(r["round"]) == rnd and "test_positive_rate" in r]
    return {"auc": site_mean(history, "test_auc", rnd),
            "balanced_accuracy": site_mean(history, "test_balanced_accuracy", rnd),
            "one_class": float(np.mean(one)) if one else math.nan}


def reference_scores(cell: Any) -> dict[str, float]:
    """Return a reference cell's inner-test AUC, balanced accuracy and one-class share."""
    one = one_class_sites([cell])
    return {"auc": cell.scores["best"]["auc"]["mean"],
            "balanced_accuracy": cell.scores["best"]["balanced_accuracy"]["mean"],
            "one_class": float(np.mean(one)) if one else math.nan}


def choose(means: Mapping[tuple[str, str], float], names: Sequence[str],
           groups: Sequence[str]) -> tuple[str, str]:
    """Return the chosen rule and why: best in every group and beats the default in each."""
    default = names[0]
    best = [max(names, key=lambda n, g=g: means[(n, g)]) for g in groups]
    if len(set(best)) > 1:
        return default, "kept: the groups' best rules differ (" + ", ".join(
            f"{g}: {b}" for g, b in zip(groups, best)) + ")"
    winner = best[0]
    if winner == default:
        return default, "kept: best in every group"
    if all(means[(winner, g)] > means[(default, g)] for g in groups):
        return winner, "changed: best in every group"
    return default, "kept: does not beat the default in every group"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the nested design, score every rule on the inner test sets, print the choice."""
    parser = make_parser(NAME, __doc__.splitlines()[0],
                         full=Budget(rounds=200, folds=5, seeds=1),
                         quick=Budget(rounds=4, folds=1, seeds=1))
    add_groups_option(parser)
    parser.add_argument("--inner-folds", type=positive_int, default=None,
                        help="inner folds of each outer training part (default 4; 2 with "
                             "--quick)")
    bench = Benchmark(parser, argv)
    args = bench.args
    from fedbn_med.spec import RunSpec

    inner_folds = args.inner_folds or (2 if args.quick else 4)
    if inner_folds < 2:
        parser.error(f"--inner-folds must be at least 2, got {inner_folds}")
    base = RunSpec.for_task("abide", rounds=args.rounds, data_dir=args.data_dir,
                            device=args.device)
    groups = resolve_groups(bench, base)  # published as one table over every group
    table_rules = rules(args.rounds)
    names = list(table_rules)
    grid = [(g, fold, seed, inner) for g in groups for fold, seed in bench.cells
            for inner in range(inner_folds)]
    scores: dict[tuple[str, str], list[dict[str, float]]] = {}
    picked: dict[tuple[str, str], list[int]] = {}
    for g, fold, seed, inner in bench.progress(grid, NAME):
        spec = base.replace(sites=groups[g], fold=fold, seed=seed)
        history = run(spec, data=inner_datas(groups[g], spec, inner_folds, inner),
                      workdir=scratch_dir())
        for name, rule in table_rules.items():
            rnd = rule(history)
            scores.setdefault((name, g), []).append(score_at(history, rnd))
            picked.setdefault((name, g), []).append(rnd)
        # the reference rows, fitted on the same inner training subjects, paired by run
        for cell in inner_references(groups[g], spec, inner_folds, inner):
            scores.setdefault((cell.strategy, g), []).append(reference_scores(cell))

    def values(name: str, g: str, key: str) -> list[float]:
        return [c[key] for c in scores[(name, g)]]

    means = {(n, g): float(np.nanmean(values(n, g, "auc"))) for n in [*names, *REFERENCES]
             for g in groups}
    chosen, why = choose(means, names, list(groups))
    # paired against the default, run by run; runs share subjects (corrected t)
    n_ratio = inner_folds  # folds of the inner split: n_test / n_train = 1 / (K - 1)
    body, csv_rows = [], []
    for name in [*names, *REFERENCES]:
        cells, row = [], {"rule": name, "chosen": name == chosen}
        for g in groups:
            auc = values(name, g, "auc")
            gap = corrected(np.subtract(auc, values(names[0], g, "auc")), n_folds=n_ratio)
            bal = float(np.nanmean(values(name, g, "balanced_accuracy")))
            one = float(np.nanmean(values(name, g, "one_class")))
            rnds = picked.get((name, g), [])
            cells += [f"{100 * means[(name, g)]:.1f}",
                      "—" if name == names[0] else _gap(gap),
                      f"{100 * bal:.1f}", f"{100 * one:.0f}",
                      f"{int(np.median(rnds))} ({min(rnds)}-{max(rnds)})" if rnds else "—"]
            row.update({f"auc_{g}": round(means[(name, g)], 6),
                        f"auc_gap_{g}": round(gap[0], 6), f"auc_gap_{g}_low": round(gap[1], 6),
                        f"auc_gap_{g}_high": round(gap[2], 6),
                        f"balanced_accuracy_{g}": round(bal, 6),
                        f"one_class_{g}": round(one, 6), f"runs_{g}": len(values(name, g, "auc")),
                        f"round_median_{g}": float(np.median(rnds)) if rnds else math.nan})
        mark = ("**chosen** " + why) if name == chosen else (
            "(current default)" if name == names[0] else
            "reference, not a rule" if name in REFERENCES else "")
        body.append([name, *cells, mark])
        csv_rows.append(row)
    header = ["rule"]
    for g in groups:
        header += [f"{g}: inner-test AUC %", f"{g}: minus default (pp) [95 % CI]",
                   f"{g}: bal. acc. %", f"{g}: one-class sites %", f"{g}: round, median (range)"]
    header.append("choice (inner test only)")
    table = markdown_table(header, body)
    runs = len(grid) // len(groups)
    names_text = "; ".join(f"{g} = {', '.join(s)}" for g, s in groups.items())
    notes = (
        f"FedBN, in process, {args.rounds} rounds; {names_text}; data: "
        f"{args.data_dir or 'the built-in cohort'}. Nested design: outer folds "
        f"{args.folds} of {N_FOLDS} x {args.seeds} repetition(s), each outer training part "
        f"split again into {inner_folds} inner folds ({runs} runs per group); each run "
        "trains on the inner training subjects, picks its round on the inner validation "
        "subjects and is scored on the inner test subjects. No outer test subject is "
        "loaded. Criterion, as in defaults_sweep: the inner-test AUC (mean over sites and "
        "runs) per group; a rule replaces the default only when it is best in every group "
        "and beats the default in every group. Differences: paired by run, mean [95 % CI] "
        f"with the corrected resampled t (n_test/n_train = 1/{inner_folds - 1}). "
        "'One-class sites': the share of (run, site) scores whose test predictions were "
        "all one class. The majority-class and motion-only (mean FD) rows are fitted on "
        "each run's inner training subjects and scored on its inner test subjects, "
        "predicting at 0.5 (FedBN at the run's threshold); they are no stopping rule and "
        "are not chosen from. Every other setting is the main "
        f"job's default. Chosen: {chosen} ({why}).")

    def plot(path: Path) -> Path:
        series = {f"group {g}": ([100 * means[(n, g)] for n in names], [0.0] * len(names))
                  for g in groups}
        return bar_plot(path, [n[:28] for n in names], series, ylabel="inner-test AUC (%)",
                        title="stopping rules, nested cross-validation")

    metrics = {f"auc_{g}.{i}": means[(n, g)] for i, n in enumerate(names) for g in groups}
    bench.publish(table, csv_rows, plot, notes=notes, metrics=metrics,
                  protocol=(f"nested: {inner_folds} inner folds of each outer training part; "
                            "rules scored on inner test subjects only"))
    return 0


def _gap(stats: tuple[float, float, float]) -> str:
    mean, low, high = stats
    if not math.isfinite(low):
        return f"{100 * mean:+.1f}"
    return f"{100 * mean:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]"


if __name__ == "__main__":
    raise SystemExit(main())
