"""``benchmarks/research/defaults_sweep.py``: the main job's defaults, chosen on validation only.

Its ``--quick`` run goes end to end on a small release the test writes in the real
layout (:func:`tests.test_determinism.write_release`), two federations of two sites,
into a real MLflow sqlite store; the decision rule is checked on figures made here.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
from mlflow.tracking import MlflowClient

from tests.test_determinism import write_release

BENCH_DIR = Path(__file__).resolve().parent.parent / "benchmarks"
SITES = {"PITT": 12, "YALE": 12, "KKI": 12, "TRINITY": 12}
GROUPS = "PITT,YALE/KKI,TRINITY"


@pytest.fixture()
def sweep(benchmark_module: Callable[[str], ModuleType]) -> ModuleType:
    """Return the benchmark module, with the built-in data (if any) kept in ``tmp_path``."""
    return benchmark_module("defaults_sweep")


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return a small real-shaped release holding the sites of :data:`SITES`."""
    return write_release(tmp_path_factory.mktemp("release"), SITES, seed=2)


def _rows(text: str) -> list[list[str]]:
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines][2:]


def test_quick_run_publishes_the_table_and_reuses_its_cells(
        sweep: ModuleType, release: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tmp_path / "out"
    argv = ["--quick", "--data-dir", str(release), "--groups", GROUPS, "--out", str(out),
            "--tracking-uri", store]
    assert sweep.main(argv) == 0
    printed = capsys.readouterr().out
    body = _rows((out / "table.md").read_text(encoding="utf-8"))
    # every value of the quick grid, each axis with exactly one chosen value
    assert [(r[0], r[1]) for r in body if r[0] != "combined"] == [
        ("optimiser", "SGD lr 3e-3"), ("optimiser", "Adam lr 1e-3"),
        ("stopping rule", "best-validation-loss round"), ("stopping rule", "last round"),
        ("features", "whole series"), ("features", "windows 32 (step 16)"),
        ("reference", "Majority class"), ("reference", "Motion only (mean FD)"),
        ("reference", "Ridge, pooled (site z)"), ("reference", "Ridge, site only (site z)")]
    # the majority class scores every subject alike: AUC 50 % on validation and test
    majority = next(r for r in body if r[1] == "Majority class")
    assert majority[2:4] == ["50.0", "50.0"] and majority[5].startswith("50.0")
    assert majority[-1] == "reference, not a value"
    for axis in ("optimiser", "stopping rule", "features"):
        assert sum("**chosen**" in r[-1] for r in body if r[0] == axis) == 1, body
    # the stopping rule is never chosen on validation (its round is chosen there)
    assert "**chosen**" in next(r[-1] for r in body if r[1] == "best-validation-loss round")
    assert all(re.fullmatch(r"\d+\.\d", r[2]) and re.fullmatch(r"\d+\.\d", r[3])
               for r in body), body
    assert "Criterion, fixed before the runs: val_auc" in printed
    assert "Reference rows: the majority class and motion alone" in printed
    with open(out / "cells.csv", newline="", encoding="utf-8") as handle:
        cells = list(csv.DictReader(handle))
    # the default is run once per group and shared by every axis: 3 settings x 2 groups
    assert sorted((c["group"], c["config"]) for c in cells) == sorted(
        (g, c) for g in "AB" for c in ("default",
                                       "connectivity=correlation;harmonize=none;windows=0",
                                       "lr=0.001;optimizer=adam"))
    with open(out / "table.csv", newline="", encoding="utf-8") as handle:
        table = list(csv.DictReader(handle))
    assert {"val_auc_A", "val_auc_B", "test_auc_A_low", "chosen"} <= set(table[0])
    client = MlflowClient(tracking_uri=store)
    runs = client.search_runs([client.get_experiment_by_name("abide-benchmarks")
                               .experiment_id], "tags.benchmark = 'defaults_sweep'")
    assert len(runs) == 1

    # --resume runs nothing again: the cells come back from cells.csv
    assert sweep.main([*argv, "--resume"]) == 0
    assert "defaults_sweep: 0 runs" in capsys.readouterr().out


def test_axes_sharing_a_label_keep_their_own_rows_and_the_groups_are_published(
        sweep: ModuleType, benchmark_module: Callable[[str], ModuleType], release: Path,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    published = benchmark_module("_published")
    monkeypatch.setattr(published, "PUBLISHED_DIR", tmp_path / "published")
    monkeypatch.setattr(published, "rewrite_readme", lambda *a, **k: True)
    argv = ["--quick", "--data-dir", str(release), "--groups", GROUPS, "--axes",
            "weight decay,dropout", "--no-confirm", "--out", str(tmp_path / "out"),
            "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", "--publish"]
    assert sweep.main(argv) == 0
    with open(tmp_path / "out" / "table.csv", newline="", encoding="utf-8") as handle:
        rows = {(r["axis"], r["value"]): r for r in csv.DictReader(handle)}
    figures = [k for k in rows[("weight decay", "0")] if k.startswith(("val_", "test_"))]
    # weight decay 0 and dropout 0.5 are both the default: the same runs, the same figures;
    # "weight decay 0" is not given the figures of "dropout 0" (a different setting)
    assert all(rows[("weight decay", "0")][k] == rows[("dropout", "0.5")][k] for k in figures)
    with open(tmp_path / "out" / "cells.csv", newline="", encoding="utf-8") as handle:
        cells = {(c["group"], c["config"]): c for c in csv.DictReader(handle)}
    assert rows[("dropout", "0")]["val_auc_A"] == cells[("A", "dropout=0.0")]["val_auc_best"]
    # the published data are the two groups run, not the task's default sites
    meta = json.loads((tmp_path / "published"
                       / "defaults_sweep-real-PITT_YALE-KKI_TRINITY-weight_decay-dropout"
                       / "meta.json")
                      .read_text(encoding="utf-8"))
    assert "group A PITT, YALE" in meta["data"] and "group B KKI, TRINITY" in meta["data"]
    assert "NYU" not in meta["data"]


def _summary(auc: float) -> object:
    from _sweep_grid import Summary

    return Summary(3, {"val_auc": auc, "val_balanced_accuracy": 0.5, "val_loss": 0.7}, {})


@pytest.mark.parametrize(("aucs", "chosen", "why"), [
    ({"a": (0.60, 0.60), "b": (0.65, 0.66), "c": (0.62, 0.61)}, "b", "changed"),
    ({"a": (0.60, 0.60), "b": (0.65, 0.58), "c": (0.62, 0.63)}, "a", "groups' best values differ"),
    ({"a": (0.70, 0.70), "b": (0.65, 0.66), "c": (0.62, 0.61)}, "a", "default is best"),
])
def test_a_default_changes_only_when_both_groups_agree(
        sweep: ModuleType, aucs: dict[str, tuple[float, float]], chosen: str, why: str) -> None:
    from _sweep_grid import Value, choose

    values = [Value("dropout", label) for label in aucs]
    summaries = {(label, g): _summary(auc[i]) for label, auc in aucs.items()
                 for i, g in enumerate("AB")}
    value, reason = choose("dropout", values, values[0], summaries, ["A", "B"])
    assert value.label == chosen and why in reason


def test_the_stopping_rule_keeps_the_protocols_round(sweep: ModuleType) -> None:
    from _sweep_grid import AXES, choose

    best, last = AXES["stopping rule"]
    summaries = {(best.label, g): _summary(0.6) for g in "AB"}
    summaries.update({(last.label, g): _summary(0.9) for g in "AB"})
    value, reason = choose("stopping rule", [best, last], best, summaries, ["A", "B"])
    assert value is best and "circular" in reason


def test_intervals_of_independent_groups_add_in_quadrature(sweep: ModuleType) -> None:
    from _sweep_grid import combine_intervals

    mean, low, high = combine_intervals([(0.6, 0.5, 0.7), (0.8, 0.8, 0.8)])
    assert (mean, round(low, 6), round(high, 6)) == (0.7, 0.65, 0.75)
    assert combine_intervals([(0.6, float("nan"), float("nan"))])[0] == 0.6


@pytest.mark.parametrize(("argv", "message"), [
    (["--groups", "PITT,YALE/KKI"], ("expected groups of at least two comma-separated sites "
                                    "split by '/'.*got 'PITT,YALE/KKI'")),
    (["--groups", "C=PITT,YALE/C=KKI,TRINITY"], "names distinct.*got 'C=PITT,YALE/C=KKI"),
    (["--groups", "grp=PITT,YALE"], "one capital letter.*got 'grp=PITT,YALE'"),
    (["--groups", "PITT,YALEE/KKI,TRINITY"], (r"--groups: Unknown site 'YALEE'\. Valid "
                                             r"sites: .*YALE")),
    (["--axes", "dropout,momentum"], ("unknown axis 'momentum'; valid axes: optimiser, "
                                     "weight decay, dropout")),
])
def test_bad_options_say_what_is_valid(sweep: ModuleType, release: Path, tmp_path: Path,
                                       argv: list[str], message: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        sweep.main(["--quick", "--data-dir", str(release), "--out", str(tmp_path), *argv])
    assert re.search(message, capsys.readouterr().err), message


def test_nested_sweep_chooses_on_inner_test_subjects_and_publishes_apart(
        sweep: ModuleType, benchmark_module: Callable[[str], ModuleType], release: Path,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import numpy as np

    from fedbn_med.tasks.abide.build import resolve_site_data_dir
    from fedbn_med.tasks.abide.data import load_site_features
    from fedbn_med.tasks.abide.sites import load_sites
    from fedbn_med.tasks.abide.splits import site_splits

    published = benchmark_module("_published")
    monkeypatch.setattr(published, "PUBLISHED_DIR", tmp_path / "published")
    monkeypatch.setattr(published, "rewrite_readme", lambda *a, **k: True)
    helpers = benchmark_module("_sweep")
    seen: list[tuple[str, int, int, object]] = []
    real_inner = helpers.inner_datas

    def spy(sites, spec, inner_folds, inner_fold):  # what every nested run trains on
        datas = real_inner(sites, spec, inner_folds, inner_fold)
        seen.extend((s, spec.fold, spec.seed, d) for s, d in datas.items())
        return datas

    monkeypatch.setattr(sweep, "inner_datas", spy)
    out = tmp_path / "out"
    argv = ["--quick", "--nested", "--data-dir", str(release), "--groups", GROUPS, "--axes",
            "model", "--no-confirm", "--out", str(out), "--tracking-uri",
            f"sqlite:///{tmp_path / 'mlflow.db'}", "--publish"]
    assert sweep.main(argv) == 0
    printed = capsys.readouterr().out
    with open(out / "cells.csv", newline="", encoding="utf-8") as handle:
        cells = list(csv.DictReader(handle))
    # 8 values of the model axis x 2 groups x 1 outer fold x 2 inner folds
    configs = {c["config"] for c in cells}
    assert len(configs) == 8 and sorted({c["inner"] for c in cells}) == ["0", "1"]
    assert len(cells) == 8 * 2 * 2
    header = (out / "table.md").read_text(encoding="utf-8").splitlines()[0]
    assert "A: inner-test AUC %" in header and "choice (inner test only)" in header
    body = _rows((out / "table.md").read_text(encoding="utf-8"))
    # the reference rows of the same inner splits: no candidate, majority at 50 %
    assert [r[1] for r in body[-4:]] == ["Majority class", "Motion only (mean FD)",
                                         "Ridge, pooled (site z)", "Ridge, site only (site z)"]
    assert body[-4][2:4] == ["50.0"] * 2 and body[-4][-1] == "reference, not a value"
    # (an inner validation part of this small release may hold one class: AUC undefined)
    assert set(body[-4][4:6]) <= {"50.0", "nan"}
    assert not any("**chosen**" in r[-1] for r in body[-4:])
    assert "No outer test subject is trained on, fitted on or scored" in printed
    # no nested run saw an outer test subject: every row it holds is outside the fold
    assert seen
    sites = load_sites(list(SITES))
    for name, fold, seed, data in seen:
        site = sites[name]
        feats = load_site_features(resolve_site_data_dir(site, sweep_spec(release)),
                                   site.abide_site_ids, name=name)
        from fedbn_med.tasks.abide.splits import repetition_split_seed

        outer = site_splits(feats.labels, fold=fold,
                            seed=repetition_split_seed(site.split_seed, seed)).test
        outer_rows = np.asarray(feats.features)[outer]
        for part in (data.train, data.val, data.test):
            x = part[0].numpy()
            assert not any(np.allclose(x[i], r) for i in range(len(x)) for r in outer_rows)
    published = tmp_path / "published" / "defaults_sweep-real-nested-PITT_YALE-KKI_TRINITY-model"
    assert (published / "meta.json").is_file()
    with pytest.raises(SystemExit):
        sweep.main(["--quick", "--inner-folds", "3", "--data-dir", str(release), "--groups",
                    GROUPS, "--out", str(tmp_path / "x")])
    assert "--inner-folds needs --nested" in capsys.readouterr().err


def sweep_spec(release: Path):
    """Return a run spec reading ``release`` (for the sites' feature files)."""
    from fedbn_med.spec import RunSpec

    return RunSpec.for_task("abide", data_dir=release)


def test_resume_refuses_a_cells_file_of_other_columns(sweep: ModuleType, release: Path,
                                                      tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    old = ("group,config,rounds,fold,seed,best_round,last_round\n"
           "A,default,3,0,0,2,3\n")
    (out / "cells.csv").write_text(old, encoding="utf-8")
    with pytest.raises(ValueError, match=r"cells\.csv has the columns group, config, rounds, "
                                         r"fold, seed, best_round, last_round, not this"):
        sweep.main(["--quick", "--data-dir", str(release), "--groups", GROUPS, "--out",
                    str(out), "--resume", "--axes", "dropout"])
    assert (out / "cells.csv").read_text(encoding="utf-8") == old  # nothing lost


def test_a_confirmation_run_of_conflicting_changes_is_refused(sweep: ModuleType) -> None:
    from _sweep_grid import AXES, Value

    wd = next(v for v in AXES["weight decay"] if v.label == "5e-2")
    linear = next(v for v in AXES["model"] if v.label == "linear, tangent space, wd 100")
    defaults = {"weight decay": Value("weight decay", "0"), "model": Value("model", "MLP")}
    with pytest.raises(ValueError, match=r"set weight_decay to both 0\.05 and 100\.0"):
        sweep._combined({"weight decay": (wd, ""), "model": (linear, "")}, defaults)
    dropout = next(v for v in AXES["dropout"] if v.label == "0.2")
    both = sweep._combined({"dropout": (dropout, ""), "model": (linear, "")},
                           {"dropout": Value("dropout", "0.5"), "model": defaults["model"]})
    assert both is not None and both.settings["dropout"] == 0.2
    assert both.settings["weight_decay"] == 100.0


def test_quick_run_without_a_data_folder_sweeps_the_built_in_sites(
        sweep: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = ["--quick", "--axes", "dropout", "--no-confirm", "--out", str(out),
            "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]
    assert sweep.main(argv) == 0
    with open(out / "cells.csv", newline="", encoding="utf-8") as handle:
        cells = list(csv.DictReader(handle))
    # one group, the task's own four sites: 3 dropout values x 1 group x 1 fold
    assert {c["group"] for c in cells} == {"A"} and len(cells) == 3


@pytest.mark.parametrize(("argv", "variant"), [
    (["--data-dir", "D"], None),
    (["--data-dir", "D", "--nested"], "nested"),
    (["--data-dir", "D", "--groups", "PITT,YALE,KKI,TRINITY/MAX_MUN,STANFORD,CALTECH,SDSU"],
     None),
    (["--data-dir", "D", "--nested", "--groups", "OLIN,SBL,OHSU"], "nested-OLIN_SBL_OHSU"),
    (["--data-dir", "D", "--groups", "PITT,YALE/KKI,TRINITY"], "PITT_YALE-KKI_TRINITY"),
    # one group of the same four sites: a key of its own, not the two groups' key
    (["--data-dir", "D", "--groups", "PITT,YALE,KKI,TRINITY"], "PITT_YALE_KKI_TRINITY"),
    (["--data-dir", "D", "--nested", "--groups", "C=OLIN,SBL,OHSU"], "nested-OLIN_SBL_OHSU"),
    (["--data-dir", "D", "--nested", "--groups", "C=OLIN,SBL", "--axes", "model"],
     "nested-OLIN_SBL-model"),
    (["--data-dir", "D", "--groups", "C=OLIN,SBL", "--axes", "local epochs,features"],
     "OLIN_SBL-local_epochs-features"),
    (["--groups", "PITT,YALE"], None),  # built-in cohort: groups are not real sites
    # some axes of the main groups: beside the sweep of every axis, not over it
    (["--data-dir", "D", "--nested", "--axes", "optimiser,dropout"],
     "nested-optimiser-dropout"),
    (["--axes", "local epochs"], "local_epochs"),
    (["--data-dir", "D", "--nested", "--axes", "model,motion,features,stopping rule,"
                                             "local epochs,dropout,weight decay,optimiser"],
     "nested"),
    (["--data-dir", "D", "--nested", "--axes", "motion"], "nested-motion"),
])
def test_a_sweep_on_other_groups_is_published_beside_the_main_one(
        sweep: ModuleType, argv: list[str], variant: str | None) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir")
    parser.add_argument("--nested", action="store_true")
    parser.add_argument("--axes", type=sweep._axes, default=None)
    sweep.add_groups_option(parser)
    assert sweep.sweep_variant(parser.parse_args(argv)) == variant
