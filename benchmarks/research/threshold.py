"""Judge the decision threshold on validation: 0.5, or each site's training prevalence.

A FedBN site whose features sit apart from the others' can score every subject on one
side of 0.5: its AUC may be fine while it predicts one class only (balanced accuracy
50 %). ``threshold=site_prior`` lets each site turn probabilities into classes at its
own threshold, the one at which its training subjects are predicted positive as often
as they are (:func:`fedbn_med.training.objective.prior_threshold`). The threshold does
not change training, the loss or AUC, so both thresholds select the same round.

Criterion, fixed before the runs: the validation balanced accuracy (mean over sites and
cells) at the best-validation-loss round, per group; ``site_prior`` replaces the default
only where it is higher in every group. Test figures are for information.

    python benchmarks/research/threshold.py --data-dir DIR [--quick] [--rounds R] [--folds N]
        [--groups PITT,YALE,KKI,TRINITY/MAX_MUN,STANFORD,CALTECH,SDSU]
"""

from __future__ import annotations

import fedbn_med.numerics.pinned  # noqa: F401  (first: it fixes the numeric code path before numpy loads)

# isort: split
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import _on_path  # noqa: F401  (benchmarks/ on the path: the shared _common, _sweep, _plots)
import numpy as np
from _common import Benchmark, Budget, make_parser, markdown_table, scratch_dir
from _plots import bar_plot
from _sweep import corrected, one_class_sites, references
from defaults_sweep import add_groups_option, resolve_groups

from fedbn_med import run

NAME = "threshold"
#: The incumbent first (0.5, the default when the criterion was fixed), then the challenger.
THRESHOLDS = ("0.5", "site_prior")
#: What each (cell, site) records at the run's selected round.
KEYS = ("val_balanced_accuracy", "test_balanced_accuracy", "test_auc", "test_one_class",
        "val_one_class")


def site_scores(rows: Sequence[Mapping[str, object]], rnd: int) -> list[dict[str, float]]:
    """Return each site's :data:`KEYS` at round ``rnd`` (one class: all predictions alike)."""
    out = []
    for r in rows:
        if int(r["round"]) != rnd:  # type: ignore[call-overload]
            continue
        scores = {k: float(r.get(k, math.nan)) for k in KEYS[:3]}  # type: ignore[arg-type]
        for split in ("test", "val"):
            rate = float(r.get(f"{split}_positive_rate", math.nan))  # type: ignore[arg-type]
            scores[f"{split}_one_class"] = (float(rate in (0.0, 1.0)) if math.isfinite(rate)
                                            else math.nan)
        out.append(scores)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run both thresholds on every group and cell, choose on validation, publish."""
    parser = make_parser(NAME, __doc__.splitlines()[0],
                         full=Budget(rounds=100, folds=5, seeds=1),
                         quick=Budget(rounds=3, folds=1, seeds=1))
    add_groups_option(parser)
    bench = Benchmark(parser, argv)
    args = bench.args
    from fedbn_med.evaluation.comparison import best_round
    from fedbn_med.evaluation.tables import format_stats
    from fedbn_med.spec import RunSpec

    base = RunSpec.for_task("abide", rounds=args.rounds, data_dir=args.data_dir,
                            device=args.device)
    groups = resolve_groups(bench, base)  # published as one table over every group
    grid = [(g, fold, seed, t) for g in groups for fold, seed in bench.cells
            for t in THRESHOLDS]
    # (threshold, group) -> one {key: site mean} per cell; and every (cell, site) score
    cells: dict[tuple[str, str], list[dict[str, float]]] = {}
    sites: dict[tuple[str, str], list[dict[str, float]]] = {}
    for g, fold, seed, t in bench.progress(grid, NAME):
        rows = run(base.replace(sites=groups[g], fold=fold, seed=seed, threshold=t),
                   workdir=scratch_dir()).rows
        per_site = site_scores(rows, best_round(rows))
        sites.setdefault((t, g), []).extend(per_site)
        cells.setdefault((t, g), []).append(
            {k: float(np.nanmean([s[k] for s in per_site])) for k in KEYS})

    def mean(t: str, g: str, key: str) -> float:
        return float(np.nanmean([c[key] for c in cells[(t, g)]]))

    crit = {(t, g): mean(t, g, "val_balanced_accuracy") for t in THRESHOLDS for g in groups}
    default, other = THRESHOLDS
    if all(crit[(other, g)] > crit[(default, g)] for g in groups):
        chosen, why = other, "changed: higher validation balanced accuracy in every group"
    else:
        chosen, why = default, ("kept: " + other + " is not higher in every group (" + ", ".join(
            f"{g}: {100 * crit[(other, g)]:.1f} vs {100 * crit[(default, g)]:.1f}"
            for g in groups) + ")")
    body, csv_rows = [], []
    for t in THRESHOLDS:
        row: dict[str, object] = {"threshold": t, "chosen": t == chosen}
        out = [t]
        for g in groups:
            bal = corrected([c["test_balanced_accuracy"] for c in cells[(t, g)]])
            one = float(np.nanmean([s["test_one_class"] for s in sites[(t, g)]]))
            out += [f"{100 * crit[(t, g)]:.1f}", format_stats(*bal),
                    f"{100 * mean(t, g, 'test_auc'):.1f}", f"{100 * one:.0f}"]
            row.update({f"val_balanced_accuracy_{g}": round(crit[(t, g)], 6),
                        f"test_balanced_accuracy_{g}": round(bal[0], 6),
                        f"test_balanced_accuracy_{g}_low": round(bal[1], 6),
                        f"test_balanced_accuracy_{g}_high": round(bal[2], 6),
                        f"test_auc_{g}": round(mean(t, g, "test_auc"), 6),
                        f"test_one_class_{g}": round(one, 6),
                        f"val_one_class_{g}": round(float(np.nanmean(
                            [s["val_one_class"] for s in sites[(t, g)]])), 6),
                        f"cells_{g}": len(cells[(t, g)])})
        mark = ("**chosen** " + why) if t == chosen else ""
        now = base.settings.threshold
        body.append([*out, ("(the default now) " if t == now else "") + mark])
        csv_rows.append(row)
    for name, out, row in _reference_rows(bench, groups):
        body.append([*out, "reference, not a threshold"])
        csv_rows.append({"threshold": name, "chosen": False, **row})
    header = ["threshold"]
    for g in groups:
        header += [f"{g}: val bal. acc. %", f"{g}: test bal. acc. % [95 % CI]",
                   f"{g}: test AUC %", f"{g}: one-class test sites %"]
    header.append("choice (validation only)")
    table = markdown_table(header, [[c.strip() for c in r] for r in body])
    names_text = "; ".join(f"{g} = {', '.join(s)}" for g, s in groups.items())
    notes = (
        f"FedBN, in process, {args.rounds} rounds; {names_text}; data: "
        f"{args.data_dir or 'the built-in cohort'}; {args.folds} fold(s) x {args.seeds} "
        "repetition(s) per group. Each run is scored at its best-validation-loss round "
        "(the same round for both thresholds: neither the loss nor AUC depends on the "
        "threshold). Criterion, fixed before the runs: the validation balanced accuracy "
        "(mean over sites and cells) per group; site_prior replaces 0.5 only when it is "
        "higher in every group. Test balanced accuracy: mean [95 % CI] over cells, "
        "corrected resampled t (Nadeau-Bengio). 'One-class test sites': the share of "
        "(cell, site) test scores whose predictions were all one class. The majority-class "
        "and motion-only (mean FD) rows are fitted on each site's training subjects of the "
        "same cells and predict at 0.5, as in every comparison's tables. Every other "
        f"setting is the main job's default. Chosen: {chosen} ({why}).")

    def plot(path: Path) -> Path:
        series = {f"group {g}": ([100 * crit[(t, g)] for t in THRESHOLDS],
                                 [0.0] * len(THRESHOLDS)) for g in groups}
        return bar_plot(path, list(THRESHOLDS), series,
                        ylabel="validation balanced accuracy (%)",
                        title="decision threshold, best-validation-loss round")

    metrics = {f"val_balanced_accuracy_{g}.{t}": crit[(t, g)] for t in THRESHOLDS
               for g in groups}
    bench.publish(table, csv_rows, plot, notes=notes, metrics=metrics,
                  protocol="each run at its best-validation-loss round; threshold chosen on "
                           "validation balanced accuracy")
    return 0


def _reference_rows(bench: Benchmark, groups: Mapping[str, tuple[str, ...]]
                    ) -> list[tuple[str, list[str], dict[str, object]]]:
    """Return the majority-class and motion-only rows: their table cells and CSV values."""
    from fedbn_med.evaluation.comparison import REFERENCES
    from fedbn_med.evaluation.tables import format_stats

    out: dict[str, tuple[list[str], dict[str, object]]] = {n: ([n], {}) for n in REFERENCES}
    for g, sites in groups.items():
        test = references(bench, sites=sites)
        val = references(bench, sites=sites, scored_on="val")
        for name in REFERENCES:
            crit = float(np.nanmean(list(val.values(name, "best", "balanced_accuracy").values())))
            bal = corrected(test.values(name, "best", "balanced_accuracy").values())
            auc = float(np.nanmean(list(test.values(name, "best", "auc").values())))
            one = float(np.mean(one_class_sites(c for c in test.cells if c.strategy == name)))
            cells, row = out[name]
            cells += [f"{100 * crit:.1f}", format_stats(*bal), f"{100 * auc:.1f}",
                      f"{100 * one:.0f}"]
            row.update({f"val_balanced_accuracy_{g}": round(crit, 6),
                        f"test_balanced_accuracy_{g}": round(bal[0], 6),
                        f"test_balanced_accuracy_{g}_low": round(bal[1], 6),
                        f"test_balanced_accuracy_{g}_high": round(bal[2], 6),
                        f"test_auc_{g}": round(auc, 6), f"test_one_class_{g}": round(one, 6)})
    return [(name, cells, row) for name, (cells, row) in out.items()]


if __name__ == "__main__":
    raise SystemExit(main())
