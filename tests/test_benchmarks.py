"""The benchmark scripts in ``benchmarks/``: each ``--quick`` run end to end, and their errors.

Every script runs in this process through its ``main(argv)`` with ``--out tmp_path``, a
real MLflow sqlite store in a temporary folder and ``$FEDBN_MED_DATA`` pointing at one folder
per session, so the built-in cohort is generated once (once more at site effect 0 for
the heterogeneity benchmark); the ``bench``, ``bench_data`` and ``store`` fixtures are
conftest's, shared with tests/test_benchmark_quick.py.
"""

from __future__ import annotations

import csv
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient

from fedbn_med.training.trainer import SiteData

BENCH_DIR = Path(__file__).resolve().parent.parent / "benchmarks"
EXPERIMENT = "abide-benchmarks"
SITES = ["NYU", "USM", "UM", "UCLA"]

REFERENCE_ROWS = ["Majority class", "Motion only (mean FD)", "Ridge, pooled (site z)",
                  "Ridge, site only (site z)"]

# script: (header cells that must appear, first cells of the body rows in order)
EXPECTED = {
    "paper_table": ([*SITES, "mean"],
                    ["SingleSet", "FedAvg", "FedProx", "FedBN", "Centralized",
                     *REFERENCE_ROWS]),
    "convergence": (["FedBN loss", "FedAvg loss", "FedProx loss", "FedBN acc (%)",
                     "FedAvg acc (%)", "FedProx acc (%)"], ["1", "2", "4"]),
    "local_epochs": (["rounds", "FedBN (%)", "FedAvg (%)", "FedProx (%)",
                      "FedBN - FedAvg (pp)"], ["1", "4"]),
    "data_size": (["FedBN (%)", "SingleSet (%)", "FedBN - SingleSet (pp)"], ["100", "10"]),
    "heterogeneity": (["FedBN (%)", "FedAvg (%)", "FedBN - FedAvg (pp) [95 % CI]"], ["0", "1"]),
    "rounds_to_target": (["FedBN rounds", "FedAvg rounds", "FedAvg - FedBN (rounds, paired)"],
                         ["55", "60", "65", "70"]),
    "privacy_utility": (["target epsilon", "sigma", "epsilon spent (max site)", "mean",
                         "mean AUC"],
                        ["FedBN"] * 4 + ["FedAvg"] * 4
                        + REFERENCE_ROWS),
}

#: The scripts whose tables give mean [corrected 95 % CI] over the cells (_sweep).
CORRECTED = ("convergence", "local_epochs", "data_size", "heterogeneity", "privacy_utility")


def _markdown_table(text: str) -> tuple[list[str], list[list[str]]]:
    """Return the header and body of the first markdown table in ``text``."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")),
               len(lines))
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[start:end]]
    return cells[0], cells[2:]


@pytest.mark.parametrize("name", list(EXPECTED))
def test_quick_run_writes_table_plot_and_mlflow_run(name, bench, store, tmp_path, capsys):
    out = tmp_path / "out"
    assert bench(name).main(["--quick", "--out", str(out), "--tracking-uri", store]) == 0

    header, body = _markdown_table((out / "table.md").read_text())
    columns, first_cells = EXPECTED[name]
    assert set(columns) <= set(header)
    assert [row[0] for row in body] == first_cells
    assert all(len(row) == len(header) for row in body)
    with open(out / "table.csv", newline="") as fh:
        assert len(list(csv.DictReader(fh))) > 0
    assert (out / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "| " + " | ".join(header) + " |" in printed
    assert "s wall time" in printed
    if name == "privacy_utility":  # the reference rows have their means too
        # replacing a patient costs more epsilon than adding or removing one
        spent, replaced = header.index("epsilon spent (max site)"), header.index(
            "replace-one epsilon (max site)")
        private = [row for row in body if row[1] not in ("inf (no DP)", "n/a")]
        assert private and all(float(r[replaced]) > float(r[spent]) for r in private)
        assert body[-4][-2:] == ["50.0", "50.0"], body[-4]  # the majority class
    if name == "convergence":  # the reference rows, on the validation subjects it reads
        assert re.search(r"Reference rows on the same cells \(validation accuracy, site "
                         r"mean\): Majority class \d+\.\d.*; Motion only \(mean FD\) "
                         r"\d+\.\d", printed)
    if name == "rounds_to_target":  # balanced accuracy: the majority class is at 50 %
        assert header[0] == "target val_balanced_accuracy (%)"
        assert ("Reference rows on the same cells (validation balanced accuracy, site mean): "
                "Majority class 50.0") in printed
    if name == "heterogeneity":  # the reference rows' columns, majority at 50 %
        assert header[-4:] == ["majority class (%)", "motion only (%)", "ridge, pooled (%)",
                               "ridge, site only (%)"]
        assert all(row[-4].startswith("50.0") for row in body)
    if name in CORRECTED:  # one cell: the one convention's words for no interval
        assert "1 run, no interval" in printed or "corrected 95 % CI" in printed
    if name == "paper_table":  # the verdict the team reads on the held-out sites
        report = (out / "table.md").read_text()
        assert "| FedBN site-mean accuracy (%) |" in report and "| 68.7 |" in report
        assert re.search(r"\| FedBN \(cell, site\) results predicting one class only \| "
                         r"\d+ of 4 \|", report)

    client = MlflowClient(tracking_uri=store)
    exp = client.get_experiment_by_name(EXPERIMENT)
    runs = client.search_runs([exp.experiment_id], f"tags.benchmark = '{name}'")
    assert len(runs) == 1  # one parent run per invocation
    assert not client.search_runs(
        [exp.experiment_id], f"tags.mlflow.parentRunId = '{runs[0].info.run_id}'")
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.tags["benchmark"] == name and run.data.tags["mode"] == "quick"
    assert run.data.params["quick"] == "True"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"table.md", "table.csv", "plot.png"} <= artifacts


def test_sweep_table_shows_the_corrected_interval_of_its_cells(bench, store, tmp_path):
    from fedbn_med.evaluation.intervals import corrected_t_interval, naive_t_interval

    out = tmp_path / "out"  # two cells, the fewest that have an interval (of 2 rounds each)
    assert bench("local_epochs").main(["--quick", "--epochs", "1", "--seeds", "2", "--rounds",
                                       "2", "--out", str(out), "--tracking-uri", store]) == 0
    text = (out / "table.md").read_text()
    assert "mean [corrected 95 % CI] over 2 (fold, seed) cells" in text
    # the reference rows on the same cells: the majority class ranks nobody, 50 % balanced
    assert ("Reference rows on the same cells (test balanced accuracy, site mean): Majority "
            "class 50.0 [50.0, 50.0] %; Motion only (mean FD) ") in text
    header, body = _markdown_table(text)
    with open(out / "table.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    widths = []
    for label in ("FedBN", "FedAvg", "FedProx"):
        cells = [float(r["test_balanced_accuracy"]) for r in rows if r["strategy"] == label]
        assert len(cells) == 2
        mean, low, high = (float(v) for v in re.findall(
            r"-?\d+\.\d", body[0][header.index(f"{label} (%)")]))
        corrected = corrected_t_interval(cells, 0.25)  # n_test/n_train = 1/4 for 5 folds
        expected = [100 * v for v in corrected]  # the table clips bounds to 0..100 %
        expected[1:] = [min(100.0, max(0.0, v)) for v in expected[1:]]
        assert [mean, low, high] == pytest.approx(expected, abs=0.06)
        naive = naive_t_interval(cells)  # narrower by sqrt(0.5 / 0.75) when cells differ
        widths.append((high - low, 100 * (naive[2] - naive[1])))
    assert any(ours - theirs > 0.5 for ours, theirs in widths), widths


@pytest.mark.parametrize(("name", "argv", "message"), [
    ("paper_table", ["--folds", "7"], "--folds must be at most 5"),
    ("paper_table", ["--rounds", "0"], "expected a positive integer, got 0"),
    ("paper_table", ["--strategies", "fedbn,fedsgd"], "expected strategies among singleset,"),
    ("local_epochs", ["--epochs", "1,0"], "expected positive integers such as 1,4,8,16"),
    ("local_epochs", ["--epochs", "1,16", "--rounds", "8"],
     "every E in --epochs must be at most the epoch budget --rounds 8"),
    ("data_size", ["--fractions", "1,0"], "expected fractions in (0, 1]"),
    ("heterogeneity", ["--site-effects", "0,-1"], "expected non-negative site effects"),
    ("rounds_to_target", ["--targets", "60"], "expected accuracies in (0, 1]"),
    ("rounds_to_target", ["--window", "0"], "--window must be a positive integer, got 0"),
    ("privacy_utility", ["--epsilons", "8,-1"], "expected positive epsilons (inf: no DP)"),
    ("privacy_utility", ["--delta", "0"], "--delta must be in (0, 1), got 0.0"),
    ("drift", ["--target-acc", "60"], "expected a score in (0, 1], got '60'"),
])
def test_bad_options_say_what_is_valid(name, argv, message, bench, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        bench(name).main([*argv, "--out", str(tmp_path)])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_data_dir_must_hold_abide_pcp(bench, tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench("paper_table").main(["--data-dir", str(tmp_path)])
    assert f"--data-dir must hold ABIDE_pcp/ (the ABIDE Preprocessed layout); {tmp_path}" \
        in capsys.readouterr().err


def test_heterogeneity_refuses_site_effects_on_real_data(bench, tmp_path, capsys):
    (tmp_path / "ABIDE_pcp").mkdir()
    with pytest.raises(SystemExit):
        bench("heterogeneity").main(["--data-dir", str(tmp_path), "--site-effects", "0,1"])
    assert "real ABIDE has one fixed site effect" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench("heterogeneity").main(["--groups", "PITT,YALE/NYU,UM"])
    assert "--groups needs --data-dir" in capsys.readouterr().err


def test_heterogeneity_real_federations(bench, abide_release, store, tmp_path, capsys):
    """Real-data version: one row per federation, its measured shift and the gap."""
    assert bench("heterogeneity").main(
        ["--quick", "--data-dir", str(abide_release), "--groups", "PITT,YALE/NYU,UM,USM",
         "--out", str(tmp_path), "--tracking-uri", store]) == 0
    printed = capsys.readouterr().out
    body = [line for line in printed.splitlines() if line.startswith("| A |")
            or line.startswith("| B |")]
    assert [line.split("|")[2].strip() for line in body] == ["PITT, YALE", "NYU, UM, USM"]
    rows = list(csv.DictReader(open(tmp_path / "table.csv", encoding="utf-8")))
    assert {r["federation"] for r in rows} == {"A", "B"}
    for r in rows:  # measured, finite, non-negative site effects
        assert float(r["location_effect"]) >= 0 and float(r["scale_effect"]) >= 0
    assert {r["strategy"] for r in rows} >= {"fedbn", "fedavg", "Majority class",
                                             "Motion only (mean FD)"}
    header = next(line for line in printed.splitlines() if line.startswith("| federation"))
    assert header.rstrip(" |").endswith("majority class (%) | motion only (%) | ridge, pooled "
                                        "(%) | ridge, site only (%)")
    # the majority class predicts one class at every site: balanced accuracy 50 %
    assert all(line.split("|")[-5].strip().startswith("50.0") for line in body)


def _site_data(labels: list[int]) -> SiteData:
    y = torch.tensor(labels)
    x = torch.arange(len(labels), dtype=torch.float32)[:, None]
    empty = (x[:0], y[:0])
    return SiteData(train=(x, y), val=empty, test=empty)


def test_privacy_utility_repeats_with_seeded_noise_only(bench, store, tmp_path):
    """The same command gives the same DP table; --fresh-noise says it will not."""
    def table(tag: str, *extra: str) -> str:
        out = tmp_path / tag
        # one private epsilon: its seeded noise is what must repeat
        argv = ["--quick", "--epsilons", "1", "--out", str(out), "--tracking-uri", store]
        assert bench("privacy_utility").main([*argv, *extra]) == 0
        return (out / "table.csv").read_text(encoding="utf-8")

    seeded = table("a")
    assert table("b") == seeded
    assert "not private" in (tmp_path / "b" / "table.md").read_text(encoding="utf-8")
    table("c", "--fresh-noise")  # the noise a private run draws: said under the table
    assert "a rerun gives other figures" in (tmp_path / "c" / "table.md").read_text(
        encoding="utf-8")


def test_subsample_is_stratified_and_keeps_two_examples(bench):
    subsample = bench("data_size").subsample
    data = _site_data([0] * 60 + [1] * 40)
    assert subsample(data, 1.0, seed=0) is data
    half = subsample(data, 0.5, seed=0)
    assert half.num_train == 50 and int(half.train[1].sum()) == 20
    tiny = subsample(data, 0.01, seed=0)
    assert tiny.num_train == 2 and sorted(tiny.train[1].tolist()) == [0, 1]
    rows = tiny.train[0][:, 0].long()  # the kept examples are the site's own
    assert torch.equal(data.train[1][rows], tiny.train[1])
    lone = subsample(_site_data([0] * 9 + [1]), 0.2, seed=0)  # one positive: no stratify
    assert lone.num_train == 2


def test_subsample_draws_subjects_with_all_their_windows(bench):
    # 20 subjects (8 ASD), 3 to 5 windows each, as sliding windows give
    mod = bench("data_size")
    per = [3 + s % 3 for s in range(20)]
    groups = torch.repeat_interleave(torch.arange(20), torch.tensor(per))
    labels = [int(s < 8) for s in range(20) for _ in range(per[s])]
    data = replace(_site_data(labels), train_groups=groups,
                   val_groups=torch.arange(2), test_groups=torch.arange(2))
    half = mod.subsample(data, 0.5, seed=3)
    kept = torch.unique(half.train_groups)
    assert mod.n_subjects(half) == kept.numel() == 10 and mod.n_subjects(data) == 20
    # every window of a kept subject, none of another's; stratified by subject: 4 ASD
    assert half.num_train == sum(per[int(s)] for s in kept)
    assert torch.equal(half.train_groups, groups[torch.isin(groups, kept)])
    assert int((kept < 8).sum()) == 4
    assert half.val_groups is data.val_groups and half.test_groups is data.test_groups


def test_rounds_to_target_counts_first_smoothed_round(bench):
    mod = bench("rounds_to_target")
    values = np.array([0.5, 0.7, 0.5, 0.7, 0.7, 0.7])
    assert mod.rounds_to(values, 0.7) == 2
    smooth = mod.smoothed(values, 3)
    assert np.isnan(smooth[:2]).all()  # no full window yet: a lucky first round never counts
    assert np.allclose(smooth[2:4], [0.5666666, 0.6333333])
    assert mod.rounds_to(smooth, 0.7) == 6
    assert mod.rounds_to(smooth, 0.9) is None
    assert mod.rounds_to(mod.smoothed(np.array([0.9, 0.5, 0.5, 0.5]), 3), 0.8) is None


def test_script_runs_from_the_command_line():
    # a research study, run as a script, finds the shared plumbing one folder up
    script = BENCH_DIR / "research" / "rounds_to_target.py"
    done = subprocess.run([sys.executable, str(script), "--help"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "--tracking-uri" in done.stdout and "--quick" in done.stdout


def test_every_script_is_listed_where_it_lives():
    """docs/benchmarks.md lists each user script under benchmarks/, each study under research/."""
    page = (BENCH_DIR.parent / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    users, research = page.split("## Research studies: `benchmarks/research/`")
    listed = {part: set(re.findall(r"`(\w+\.py)`", text))
              for part, text in (("", users), ("research", research))}
    for part, names in listed.items():
        here = {p.name for p in (BENCH_DIR / part).glob("*.py") if not p.name.startswith("_")}
        assert here == names, (part or "benchmarks/", here ^ names)


def _sampled(sampler, what, after: float = 0.0, within: float = 30.0) -> None:
    """Wait until the sampler has taken a sample, later than ``after``, that has ``what``."""
    deadline = time.monotonic() + within
    while not any(t > after and what(snap) for t, snap in list(sampler.samples)):
        assert time.monotonic() < deadline, "the sampler took no such sample"
        time.sleep(0.02)


def test_secagg_overhead_takes_the_superlinks_cpu_between_two_times(bench):
    # a child named like the SuperLink, spinning for 1.5 s of CPU once told to go
    code = ("import sys, time\nsys.stdin.readline()\nend = time.process_time() + 1.5\n"
            "while time.process_time() < end: pass\nprint('spun', flush=True)\ntime.sleep(60)")
    with bench("secagg_overhead").CpuSampler(every=0.05) as sampler:
        child = subprocess.Popen([sys.executable, "-c", code, "flower-superlink"],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert child.stdin is not None and child.stdout is not None
        try:
            _sampled(sampler, lambda snap: "SuperLink" in {r for r, _ in snap.values()})
            start = time.time()  # sampled before it spins
            child.stdin.write("go\n")
            child.stdin.flush()
            assert child.stdout.readline() == "spun\n"
            spun = time.time()
            _sampled(sampler, lambda snap: True, after=spun)
            end = time.time()  # sampled after
        finally:
            child.kill()
            child.wait(timeout=60)
    spent = sampler.between(start, end)["SuperLink"]
    assert 1.0 < spent < 1.8, spent
    # no sample after its end: nothing of it counted there
    assert sampler.between(end + 10, end + 20).get("SuperLink", 0.0) == 0.0
