"""The ``--quick`` run of every benchmark that tests/test_benchmarks.py does not run.

Each script runs in this process through its ``main(argv)`` (the throughput scripts start
their own measuring processes, federation_overhead a real Flower federation on
127.0.0.1), on the tiny real-layout release of conftest's ``abide_release`` wherever it
reads real data, and on built-in data in the session's ``bench_data`` folder otherwise
(conftest's ``bench``). Each test asserts on what the script printed or wrote.

Where the other ``--quick`` runs are: paper_table, convergence, local_epochs, data_size,
heterogeneity, rounds_to_target and privacy_utility in tests/test_benchmarks.py;
defaults_sweep in tests/test_defaults_sweep.py; real_compare in tests/test_real_compare.py
and tests/test_readme_tables.py. readme_tables only checks the README (no figures, no
``--quick``): tests/test_readme_tables.py runs it.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import psutil
import pytest
import torch
from mlflow.tracking import MlflowClient

from tests.conftest import BENCH_EXPERIMENT

Loader = Callable[[str], ModuleType]
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


@pytest.fixture(autouse=True)
def _torch_threads() -> Iterator[None]:
    # leave_one_site_out and federation_overhead set one thread for the whole process
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Return every markdown table of ``text``: its header and its body rows."""
    found, block = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            block.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif block:
            found.append((block[0], block[2:]))
            block = []
    return found


def _numbers(cell: str) -> list[float]:
    """Return the numbers of a cell such as ``60.0 / 53.3 / 59.0`` (all finite)."""
    values = [float(v) for v in NUMBER.findall(cell)]
    assert values and all(math.isfinite(v) for v in values), cell
    return values


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _benchmark_run(store: str, name: str) -> None:
    client = MlflowClient(tracking_uri=store)
    exp = client.get_experiment_by_name(BENCH_EXPERIMENT)
    assert exp is not None
    (run,) = client.search_runs([exp.experiment_id], f"tags.benchmark = '{name}'")
    assert run.info.status == "FINISHED" and run.data.tags["mode"] == "quick"


def test_cohort_check(bench: Loader, bench_data: Path, tmp_path: Path, capsys) -> None:
    # Two cohort seeds in one run: the per-site tables, and the calibration table per seed
    assert bench("cohort_check").main(["--quick", "--data-dir", str(bench_data), "--out",
                                       str(tmp_path), "--cohort-seeds", "0,1"]) == 0
    printed = capsys.readouterr().out
    assert "0.5 x the subjects" in printed
    (header, body), (_, identified), *calibration = _tables(printed)
    assert header == ["site effect", "site", "subjects", "gain", "offset (z)", "oracle AUC",
                      "logreg acc (%)"]
    assert [(r[0], r[1]) for r in body] == [("1", s) for s in ("NYU", "UM", "USM", "UCLA")]
    for row in body:
        assert int(row[2]) > 10 and 0 <= _numbers(row[5])[0] <= 1
        assert 0 <= _numbers(row[6])[0] <= 100
    assert len(identified) == 1 and 25 <= _numbers(identified[0][1])[0] <= 100
    assert calibration, printed
    for figure, *values in calibration[-1][1]:
        assert all(_numbers(v) for v in values), figure
    assert (tmp_path / "table.md").read_text(encoding="utf-8").strip() in printed
    assert calibration[-1][0][-1] == "cohort v3, 4 sites, cohort seeds 0, 1: mean (range)"
    rows = _csv(tmp_path / "table.csv")
    for row in (r for r in rows if r["table"] == "calibration"):
        one, other, mean = (float(row[k]) for k in ("cohort_seed0", "cohort_seed1", "cohort"))
        assert mean == pytest.approx((one + other) / 2)
    assert any(float(r["cohort_seed0"]) != float(r["cohort_seed1"])
               for r in rows if r["table"] == "calibration")  # two draws, two cohorts
    with pytest.raises(SystemExit):
        bench("cohort_check").main(["--quick", "--cohort-seeds", "0,x"])
    assert "expected comma-separated seeds >= 0 such as 0,1,2, got '0,x'" in \
        capsys.readouterr().err


def test_cohort_calibrate(bench: Loader, abide_release: Path, tmp_path: Path,
                          capsys) -> None:
    assert bench("cohort_calibrate").main(["--quick", "--data-dir", str(abide_release),
                                           "--out", str(tmp_path)]) == 0
    assert "Calibration figures, 2 sites, train part" in capsys.readouterr().out
    rows = _csv(tmp_path / "sites.csv")
    assert [r["site"] for r in rows] == ["PITT", "YALE"]
    assert all(10 <= int(r["n"]) < 16 for r in rows)  # the training part only
    summary = json.loads((tmp_path / "summary.json").read_text())["summary"]
    assert summary["sites"] == ["PITT", "YALE"] and summary["n_sites"] == 2
    assert summary["n_subjects"] == sum(int(r["n"]) for r in rows)
    figures = [v for v in summary.values() if isinstance(v, float)]
    assert len(figures) > 5 and sum(map(math.isfinite, figures)) > len(figures) / 2


def test_reader_coverage(bench: Loader, tmp_path: Path, capsys) -> None:
    bench("reader_coverage").main(["--quick", "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    rows = _csv(tmp_path / "table.csv")
    sources = [r["source"] for r in rows]
    assert {"pydicom", "nibabel", "pydicom DICOMDIR"} <= set(sources)
    assert all(sources.count(s) <= 3 for s in set(sources) - {"pydicom DICOMDIR series"})
    assert {r["outcome"] for r in rows} <= {"read", "refused"}  # never crashed
    assert any(re.fullmatch(r"\d+(x\d+)+", r["detail"]) for r in rows if r["outcome"] == "read")
    assert f"{len(rows)} files: " in printed and " 0 crashed" in printed


def test_default_run(bench: Loader, abide_release: Path, capsys) -> None:
    assert bench("default_run").main(["--quick", "--data-dir", str(abide_release),
                                      "--sites", "PITT,YALE"]) == 0
    printed = capsys.readouterr().out
    assert f"5 rounds, seed 0, real ABIDE ({abide_release})" in printed
    (header, body), (site_header, sites) = _tables(printed)
    assert header[:4] == ["fold", "selected round", "PITT acc / bal. acc / AUC (%)",
                          "YALE acc / bal. acc / AUC (%)"]
    (row,) = body
    assert row[0] == "0" and re.fullmatch(r"[1-5] of 5", row[1])
    for cell in row[2:9]:
        assert all(0 <= v <= 100 for v in _numbers(cell))
    assert header[5:8] == ["mean bal. acc (%)", "mean majority rate (%)",
                           "motion only: mean AUC (%)"]
    assert site_header[0] == "site" and [r[0] for r in sites] == ["PITT", "YALE", "mean"]


def test_leave_one_site_out(bench: Loader, abide_release: Path, store: str, tmp_path: Path,
                            capsys) -> None:
    assert bench("leave_one_site_out").main(
        ["--quick", "--rounds", "2", "--data-dir", str(abide_release), "--out",
         str(tmp_path), "--tracking-uri", store]) == 0
    assert "# Leave-one-site-out onboarding (quick)" in capsys.readouterr().out
    rows = _csv(tmp_path / "table.csv")
    assert {r["held_out"] for r in rows} == {"NYU", "UM", "USM", "UCLA", "PITT"}
    assert {r["metric"] for r in rows} == {"accuracy", "auc"}
    accuracy = [float(r["mean"]) for r in rows if r["metric"] == "accuracy"]
    assert accuracy and all(0 <= a <= 1 for a in accuracy)
    header, _ = _tables((tmp_path / "table.md").read_text(encoding="utf-8"))[0]
    assert {"NYU", "PITT"} <= set(header)


def test_drift(bench: Loader, abide_release: Path, store: str, tmp_path: Path,
               capsys) -> None:
    out = tmp_path / "out"
    assert bench("drift").main(["--quick", "--rounds", "2", "--data-dir", str(abide_release),
                                "--out", str(out), "--tracking-uri", store]) == 0
    (header, body), = _tables((out / "table.md").read_text(encoding="utf-8"))
    assert header == ["method", "ABIDE E=1 acc (%)", "ABIDE E=1 rounds to 60 (val)",
                      "ABIDE E=8 acc (%)", "ABIDE E=8 rounds to 60 (val)", "MRI Dice (%)",
                      "MRI rounds to 50 (val)"]
    assert [r[0] for r in body] == ["FedAvg", "FedProx", "SCAFFOLD", "FedBN",
                                    "FedBN+FedProx", "FedBN+SCAFFOLD"]
    for row in body:
        assert all(0 <= _numbers(c)[0] <= 100 for c in row[1::2])
    rows = _csv(out / "table.csv")
    assert len(rows) == 18 and {r["setting"] for r in rows} == {"ABIDE E=1", "ABIDE E=8",
                                                                 "MRI"}
    assert "| " + " | ".join(header) + " |" in capsys.readouterr().out
    _benchmark_run(store, "drift")


def test_interval_design(bench: Loader, abide_release: Path, store: str, tmp_path: Path,
                         capsys) -> None:
    out = tmp_path / "out"
    assert bench("interval_design").main(
        ["--quick", "--data-dir", str(abide_release), "--sites", "PITT,YALE",
         "--out", str(out), "--tracking-uri", store]) == 0
    printed = capsys.readouterr().out
    (header, body), (_, projected) = _tables(printed)
    assert header[:4] == ["design", "metric", "cells", "FedBN - FedAvg (pp)"]
    assert [(r[0], r[1]) for r in body] == [
        (d, m) for d in ("fixed splits", "re-split") for m in ("balanced_accuracy", "auc")]
    assert all(r[2] == "4" and -100 <= _numbers(r[3])[0] <= 100 for r in body)
    assert len(projected) == 8 and "First design reaching 3 pp: " in printed
    assert len(_csv(out / "table.csv")) == 6
    _benchmark_run(store, "interval_design")


def test_interval_design_runs_a_design_on_a_larger_cohort(bench: Loader, abide_release: Path,
                                                          tmp_path: Path, monkeypatch,
                                                          capsys) -> None:
    """--cohort-scale: the built-in cohort with more subjects per site, re-split only."""
    monkeypatch.setenv("FEDBN_MED_DATA", str(tmp_path / "data"))
    module = bench("interval_design")
    # one round: what is checked is the size of the cohort (1.2: above the built-in one)
    argv = ["--quick", "--rounds", "1", "--sites", "USM,UCLA", "--resplit-only", "--out",
            str(tmp_path / "o"), "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]
    subjects = {}
    for scale in ("0.4", "1.2"):
        assert module.main([*argv, "--cohort-scale", scale]) == 0
        printed = capsys.readouterr().out
        (header, body), _ = _tables(printed)
        assert [r[0] for r in body] == ["re-split", "re-split"]
        found = re.search(rf"built-in cohort at {scale} times each site's subjects "
                          r"\((\d+) subjects\)", printed)
        assert found, printed
        subjects[scale] = int(found.group(1))
    # three times the scale, about three times the subjects (rounding per site and class)
    assert 2.5 < subjects["1.2"] / subjects["0.4"] < 3.5
    with pytest.raises(SystemExit):
        module.main(["--quick", "--data-dir", str(abide_release), "--cohort-scale", "2"])
    assert "--cohort-scale sizes the built-in cohort" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        module.main(["--quick", "--cohort-scale", "6"])
    assert "expected a number in (0, 5]" in capsys.readouterr().err


def test_paper_pipeline(bench: Loader, abide_release: Path, store: str, tmp_path: Path,
                        capsys) -> None:
    out = tmp_path / "out"
    assert bench("paper_pipeline").main(["--quick", "--data-dir", str(abide_release),
                                         "--window-step", "24", "--out", str(out),
                                         "--tracking-uri", store]) == 0
    printed = capsys.readouterr().out
    (header, body), (gap_header, gaps) = _tables(printed)[:2]
    assert header[:2] == ["pipeline", "method"]
    assert [(r[0], r[1]) for r in body] == [
        ("default", "FedBN"), ("default", "FedAvg"), ("paper", "FedBN"), ("paper", "FedAvg"),
        ("(either)", "Majority class"), ("(either)", "Motion only (mean FD)"),
        ("(either)", "Ridge, pooled (site z)"), ("(either)", "Ridge, site only (site z)")]
    for row in body[:4]:
        assert all(0 <= _numbers(c)[0] <= 100 for c in row[2:6])
        assert _numbers(row[6])[0] >= 0  # the best test round is never below the honest one
    assert body[4][3].startswith("50.0")  # the majority class ranks nobody: AUC 50 %
    assert [r[0] for r in gaps] == ["paper - default", "paper - default",
                                    "default: FedBN - FedAvg", "paper: FedBN - FedAvg"]
    rows = _csv(out / "table.csv")
    assert len(rows) == 4
    for row in rows:
        assert 1 <= int(row["val_round"]) <= 2 and 1 <= int(row["best_test_round"]) <= 2
        assert float(row["best_test_accuracy"]) >= float(row["honest_accuracy"])
    _benchmark_run(store, "paper_pipeline")


def test_scan_throughput(bench: Loader, tmp_path: Path, capsys) -> None:
    assert bench("scan_throughput").main(["--quick", "--out", str(tmp_path)]) == 0
    (header, body), = _tables(capsys.readouterr().out)
    assert header[:4] == ["cleaning", "subjects", "seconds", "subjects/s"]
    assert [(r[0], r[1]) for r in body] == [("on", "8"), ("off", "8")]
    assert all(_numbers(r[3])[0] > 0 for r in body)
    assert [r["cleaning"] for r in _csv(tmp_path / "table.csv")] == ["on", "off"]


def test_imaging_throughput(bench: Loader, tmp_path: Path, capsys) -> None:
    bench("imaging_throughput").main(["--quick", "--device", "cpu", "--data-dir",
                                      str(tmp_path)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["task", "cache", "device"]
    rows = [ln.split() for ln in lines[1:4]]
    assert [r[:3] for r in rows] == [["mri", c, "cpu"] for c in ("memory", "disk", "none")]
    for row in rows:
        assert int(row[5]) > 0 and float(row[6]) > 0  # items, items per second
    assert "mri 3D patches per timed epoch x 1 epoch(s)" in lines[-1]


@pytest.mark.integration
def test_federation_overhead(bench: Loader, capsys) -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    bench("federation_overhead").main(["--quick", "--mri-only"])
    printed = capsys.readouterr().out
    found = re.search(r"\(c\) MRI, 1 rounds of \d+ local epochs, ([\d.]+) s of compute per "
                      r"round at the slowest site: federated ([\d.]+) s vs in-process "
                      r"([\d.]+) s = ([\d.]+)x .*; start-up ([\d.]+) s", printed)
    assert found, printed
    compute, federated, inprocess, ratio, startup = map(float, found.groups())
    assert 0 < compute <= inprocess and federated > 0 and ratio > 0 and startup > 0
    # every process the federation started is gone, children included
    for proc in psutil.Process().children(recursive=True):
        if proc.pid not in before:
            assert proc.status() == psutil.STATUS_ZOMBIE, proc.cmdline()


def _publish_into(monkeypatch: pytest.MonkeyPatch, bench: Loader, tmp_path: Path,
                  key: str) -> tuple[ModuleType, Path]:
    """Return readme_tables, with --publish writing into ``tmp_path`` and its README."""
    published = bench("_published")
    readme = tmp_path / "README.md"
    readme.write_text(f"x\n<!-- results:{key} -->\nSTALE\n<!-- /results:{key} -->\n",
                      encoding="utf-8")
    monkeypatch.setattr(published, "PUBLISHED_DIR", tmp_path / "published")
    monkeypatch.setattr(published, "rewrite_readme",
                        lambda key=None, readme=readme, _f=published.rewrite_readme:
                        _f(key, readme))
    tables = bench("readme_tables")
    monkeypatch.setattr(tables, "PUBLISHED_DIR", tmp_path / "published")
    return tables, readme


def test_imaging_compare(bench: Loader, store: str, tmp_path: Path,
                         monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    key = "imaging_compare-mri"
    tables, readme = _publish_into(monkeypatch, bench, tmp_path, key)
    assert bench("imaging_compare").main(
        ["--quick", "--device", "cpu", "--out", str(tmp_path / "out"), "--tracking-uri",
         store, "--publish"]) == 0
    printed = capsys.readouterr().out
    assert ("The same runs as `python pipelines/mri_fedbn.py --compare fedbn,fedavg "
            "--folds 2 --seeds 1 --rounds 1 ") in printed
    title = "Test dice at the best-validation round:\n\n"
    (header, body), *_ = _tables(printed.split(title, 1)[1])
    assert header == ["method", "SiteA", "SiteB", "SiteC", "mean"]
    assert [r[0] for r in body] == ["fedbn", "fedavg"]
    assert all(0 <= _numbers(c)[0] <= 100 for r in body for c in r[1:])
    rows = _csv(tmp_path / "out" / "table.csv")
    assert sorted((r["strategy"], r["fold"]) for r in rows) == [
        ("fedavg", "0"), ("fedavg", "1"), ("fedbn", "0"), ("fedbn", "1")]
    assert all(0 <= float(r["dice_best_mean"]) <= 1 for r in rows)
    # the block is the published report, and the Dice means are recomputed from the CSV
    text = readme.read_text(encoding="utf-8")
    assert "STALE" not in text and tables.problems(text) == []
    csv_path = tmp_path / "published" / key / "table.csv"
    csv_path.write_text(csv_path.read_text(encoding="utf-8").replace(
        f",{rows[0]['dice_best_mean']},", ",0.999,", 1), encoding="utf-8")
    assert any("dice at the best-validation round" in p and "table.csv gives" in p
               for p in tables.problems(text))
    _benchmark_run(store, "imaging_compare")


def test_imaging_compare_names_a_bad_strategy(bench: Loader, capsys) -> None:
    with pytest.raises(SystemExit):
        bench("imaging_compare").main(["--quick", "--strategies", "fedbn,fedbnn"])
    assert "Unknown strategy 'fedbnn'. Valid strategies: " in capsys.readouterr().err


def test_cohort_check_tabulates_every_figure_and_checks_real_dir(bench: Loader, tmp_path: Path,
                                                                capsys) -> None:
    # --real-dir runs (the published real-data block) take minutes here: not in the tests
    from fedbn_med.tasks.abide.cohort.figures_v3 import REAL_FIGURES

    module = bench("cohort_check")
    keys = [k for _, ks, _ in module.FIGURES for k in ks]
    assert sorted(keys) == sorted(REAL_FIGURES)  # each stored figure shown, once
    assert {how for _, _, how in module.FIGURES} == {"", *module.HOW}
    with pytest.raises(SystemExit):
        module.main(["--quick", "--real-dir", str(tmp_path)])
    assert "--real-dir must hold ABIDE_pcp/ (the ABIDE Preprocessed layout)" in \
        capsys.readouterr().err


def test_stopping_rule(bench: Loader, abide_release: Path, store: str, tmp_path: Path,
                       capsys) -> None:
    module = bench("stopping_rule")
    assert module.main(["--quick", "--data-dir", str(abide_release), "--groups",
                        "PITT,YALE/NYU,UM", "--out", str(tmp_path),
                        "--tracking-uri", store]) == 0
    (header, body), = _tables(capsys.readouterr().out)[:1]
    assert header[1:3] == ["A: inner-test AUC %", "A: minus default (pp) [95 % CI]"]
    rules = [r[0] for r in body]
    assert rules[0] == "best validation loss" and "fixed: round 4" in rules
    assert rules[-4:] == ["Majority class", "Motion only (mean FD)", "Ridge, pooled (site z)",
                          "Ridge, site only (site z)"]
    for row in body:
        assert all(0 <= v <= 100 for v in _numbers(row[1]) + _numbers(row[6]))
    majority = body[-4]
    assert majority[1] == "50.0" and majority[3] == "50.0" and majority[4] == "100"
    assert majority[5] == "—" and "reference" in majority[-1]
    rows = _csv(tmp_path / "table.csv")
    assert sum(r["chosen"] == "True" for r in rows) == 1
    assert not any(r["chosen"] == "True" for r in rows[-4:])
    assert {r["runs_A"] for r in rows} == {"2"}  # 1 outer fold x 2 inner folds
    _benchmark_run(store, "stopping_rule")


def test_stopping_rule_inner_data_hold_no_outer_test_subject(bench: Loader,
                                                            abide_release: Path) -> None:
    from fedbn_med.spec import RunSpec
    from fedbn_med.tasks.abide.build import site_data

    module = bench("stopping_rule")
    spec = RunSpec.for_task("abide", sites=("PITT", "YALE"), data_dir=abide_release, fold=2,
                            seed=1)
    inner = module.inner_datas(spec.sites, spec, 2, 1)
    for name in spec.sites:
        outer = site_data(name, spec)  # the outer split of the same fold and repetition
        rows = torch.cat([inner[name].train[0], inner[name].val[0], inner[name].test[0]])
        part = torch.cat([outer.train[0], outer.val[0]])
        assert rows.shape == part.shape
        # every inner row is an outer training row; no outer test row appears (exact
        # bytes: cdist's matrix-product path rounds near-equal rows to 0)
        def keys(x: torch.Tensor) -> set[bytes]:
            return {r.numpy().tobytes() for r in x}

        assert keys(rows) <= keys(part) and not keys(rows) & keys(outer.test[0])
    # the reference rows of the same inner split score inner test subjects only: none of
    # the outer test fold, a quarter of the outer training part (2 inner folds of it)
    from fedbn_med.tasks.abide.build import resolve_site_data_dir
    from fedbn_med.tasks.abide.data import load_site_features
    from fedbn_med.tasks.abide.sites import load_sites
    from fedbn_med.tasks.abide.splits import repetition_split_seed, site_splits

    for name, site in load_sites(list(spec.sites)).items():
        labels = load_site_features(resolve_site_data_dir(site, spec), site.abide_site_ids,
                                    name=name).labels
        outer = site_splits(labels, fold=2, seed=repetition_split_seed(site.split_seed, 1))
        for cell in module.inner_references(spec.sites, spec, 2, 1):
            index = cell.predictions[name].index
            assert not set(index) & set(outer.test)
            assert set(index) <= set(outer.train) | set(outer.val)
            assert 0 < index.size < outer.train.size


def test_histo_readers(bench: Loader, tmp_path: Path, capsys) -> None:
    from fedbn_med.tasks.histo.synth import write_tile

    folder = tmp_path / "MoNuSeg" / "train"
    for k in range(2):
        write_tile(folder, f"TCGA-XX-000{k}-01Z-00-DX1", size=96, stain=k, seed=k)
    out = tmp_path / "table.csv"
    assert bench("histo_readers").main(["--data-dir", str(tmp_path), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    rows = _csv(out)
    assert [r["tile"] for r in rows] == [f"TCGA-XX-000{k}-01Z-00-DX1" for k in range(2)]
    for row in rows:  # the XML's polygons, filled, are the PNG's pixels
        assert float(row["dice"]) >= 0.95 and int(row["nuclei_xml"]) >= 3
        assert f"| {row['tile']} | {row['nuclei_xml']} |" in printed
    assert "2 tiles; lowest Dice" in printed and "(target >= 0.95: met)" in printed
    with pytest.raises(SystemExit):
        bench("histo_readers").main([])
    assert "give --data-dir" in capsys.readouterr().err
