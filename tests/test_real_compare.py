"""``benchmarks/real_compare.py``: the comparison on any sites of any ABIDE data folder.

Its ``--quick`` run goes end to end on a small release the test writes in the real
layout (:func:`tests.test_determinism.write_release`), for three sites other than the
paper's four, into a real MLflow sqlite store.
"""

from __future__ import annotations

import csv
import gzip
import re
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
from mlflow.tracking import MlflowClient

from tests.test_determinism import write_release

BENCH_DIR = Path(__file__).resolve().parent.parent / "benchmarks"
SITES = {"PITT": 14, "YALE": 12, "KKI": 12}


@pytest.fixture()
def real_compare(benchmark_module: Callable[[str], ModuleType]) -> ModuleType:
    """Return the benchmark module, with the built-in data (if any) kept in ``tmp_path``."""
    return benchmark_module("real_compare")


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return a small real-shaped release holding the sites of :data:`SITES`."""
    return write_release(tmp_path_factory.mktemp("release"), SITES, seed=1)


def _table(text: str) -> tuple[list[str], list[list[str]]]:
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    end = next((i for i in range(2, len(cells)) if cells[i] and set(cells[i][0]) <= {"-"}),
               len(cells))
    return cells[0], cells[2:end]


def test_quick_run_on_other_sites(real_compare: ModuleType, release: Path, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tmp_path / "out"
    assert real_compare.main(["--quick", "--data-dir", str(release), "--sites",
                              ",".join(SITES), "--strategies", "fedavg,fedbn",
                              "--out", str(out), "--tracking-uri", store]) == 0
    printed = capsys.readouterr().out
    header, body = _table((out / "table.md").read_text(encoding="utf-8"))
    assert [*SITES, "mean"] == [h for h in header if h in (*SITES, "mean")], header
    assert [row[0] for row in body[:4]] == ["FedAvg", "FedBN", "Majority class",
                                            "Motion only (mean FD)"], body
    assert f"Sites {', '.join(SITES)} from {release}" in printed
    with open(out / "predictions.csv", newline="", encoding="utf-8") as handle:
        predictions = list(csv.DictReader(handle))
    assert {p["site"] for p in predictions} == set(SITES)
    # Each run's own predictions, before pooling: averaged over the repetitions they are
    # the pooled out-of-fold predictions above.
    with gzip.open(out / "cell_predictions.csv.gz", "rt", newline="",
                   encoding="utf-8") as handle:
        per_cell = list(csv.DictReader(handle))
    assert set(per_cell[0]) == {"strategy", "fold", "seed", "site", "subject", "label",
                                "prob_asd", "threshold"}
    pooled: dict[tuple[str, str, str], list[float]] = {}
    for r in per_cell:
        pooled.setdefault((r["strategy"], r["site"], r["subject"]), []).append(
            float(r["prob_asd"]))
    assert {(p["strategy"], p["site"], p["subject"]) for p in predictions} == set(pooled)
    for p in predictions:
        got = pooled[(p["strategy"], p["site"], p["subject"])]
        assert float(p["prob_asd"]) == pytest.approx(sum(got) / len(got), abs=2e-6)
    assert (out / "plot.png").stat().st_size > 0
    client = MlflowClient(tracking_uri=store)
    runs = client.search_runs([client.get_experiment_by_name("abide-benchmarks")
                               .experiment_id], "tags.benchmark = 'real_compare'")
    assert len(runs) == 1 and runs[0].data.params["sites"] == ",".join(SITES)


@pytest.mark.parametrize(("argv", "message"), [
    (["--sites", "PITT,YALEE"], r"--sites: Unknown site 'YALEE'\. Valid sites: .*YALE"),
    (["--sites", "PITT"], "--sites must name at least two sites for a federation, got PITT"),
    (["--strategies", "fedbn,fedx"], "unknown strategy 'fedx' in --strategies; valid "
                                     "strategies: .*fedbn"),
    (["--sites", ","], "expected comma-separated names, got ','"),
])
def test_bad_options_say_what_is_valid(real_compare: ModuleType, release: Path,
                                       tmp_path: Path, argv: list[str], message: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        real_compare.main(["--quick", "--data-dir", str(release), "--out",
                           str(tmp_path), *argv])
    assert re.search(message, capsys.readouterr().err), message


def test_every_abide_site_id_has_one_site_file() -> None:
    from fedbn_med.tasks.abide.sites import ABIDE_I_SITE_IDS, available_sites, load_sites

    owners: dict[str, list[str]] = {}
    for name, site in load_sites([s for s in available_sites() if s != "CITY"]).items():
        for site_id in site.abide_site_ids:
            owners.setdefault(site_id, []).append(name)
    assert {i: owners.get(i) for i in ABIDE_I_SITE_IDS} == {
        i: [n] for i, n in zip(ABIDE_I_SITE_IDS, [
            i.removesuffix("_1") if i in ("UM_1", "UCLA_1") else i
            for i in ABIDE_I_SITE_IDS])}


def test_tangent_features_run_and_publish_apart(real_compare: ModuleType, release: Path,
                                                tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import _published

    published = tmp_path / "published"
    monkeypatch.setattr(_published, "PUBLISHED_DIR", published)
    monkeypatch.setattr(_published, "README", tmp_path / "README.md")
    (tmp_path / "README.md").write_text("# none\n", encoding="utf-8")
    sites = ",".join(SITES)
    argv = ["--quick", "--data-dir", str(release), "--sites", sites, "--strategies", "fedbn",
            "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", "--publish"]
    assert real_compare.main([*argv, "--out", str(tmp_path / "t"), "--connectivity",
                              "tangent"]) == 0
    assert "features: whole-series tangent;" in capsys.readouterr().out
    key = "real_compare-real-PITT_YALE_KKI-tangent"
    assert sorted(p.name for p in published.iterdir()) == [key]
    meta = (published / key / "meta.json").read_text(encoding="utf-8")
    assert "--connectivity tangent" in meta
    # the default's features publish under the default's key, with other numbers
    assert real_compare.main([*argv, "--out", str(tmp_path / "c")]) == 0
    assert sorted(p.name for p in published.iterdir()) == ["real_compare-real-PITT_YALE_KKI",
                                                          key]
    tangent = (published / key / "table.csv").read_text(encoding="utf-8")
    plain = (published / "real_compare-real-PITT_YALE_KKI" / "table.csv").read_text(
        encoding="utf-8")
    assert tangent != plain
    # the linear model with its own weight decay: another key, other predictions
    assert real_compare.main([*argv, "--out", str(tmp_path / "l"), "--connectivity",
                              "tangent", "--model", "linear", "--weight-decay", "10"]) == 0
    assert "model linear; weight decay 10;" in capsys.readouterr().out
    linear = published / "real_compare-real-PITT_YALE_KKI-tangent-linear-wd10"
    assert "--model linear --weight-decay 10" in (linear / "meta.json").read_text(
        encoding="utf-8")
    assert (linear / "table.csv").read_text(encoding="utf-8") not in (tangent, plain)
    # another batch size: its own key, and the notes say the batch it ran with
    assert real_compare.main([*argv, "--out", str(tmp_path / "b"), "--batch-size", "4"]) == 0
    assert "batch 4," in capsys.readouterr().out
    small = published / "real_compare-real-PITT_YALE_KKI-b4"
    assert (small / "table.csv").read_text(encoding="utf-8") not in (tangent, plain)
    with pytest.raises(SystemExit):
        real_compare.main([*argv, "--out", str(tmp_path / "x"), "--batch-size", "1"])
    assert "--batch-size must be at least 2 (batch norm), got 1" in capsys.readouterr().err
    # whole-series correlations (the default before windows): their own key
    assert "features: correlation windows of 32 volumes every 16" in (
        published / "real_compare-real-PITT_YALE_KKI" / "report.md").read_text(encoding="utf-8")
    assert real_compare.main([*argv, "--out", str(tmp_path / "w"), "--windows", "0"]) == 0
    assert "features: whole-series correlation;" in capsys.readouterr().out
    whole = published / "real_compare-real-PITT_YALE_KKI-w0"
    assert (whole / "table.csv").read_text(encoding="utf-8") not in (tangent, plain)
    with pytest.raises(SystemExit):
        real_compare.main([*argv, "--out", str(tmp_path / "x"), "--windows", "32",
                           "--connectivity", "tangent"])
    assert "--windows 32 cuts correlation windows" in capsys.readouterr().err
    # mean FD regressed out of the features: its own key, other predictions
    assert real_compare.main([*argv, "--out", str(tmp_path / "f"), "--fd-regression"]) == 0
    assert "mean FD regressed out of every feature" in capsys.readouterr().out
    regressed = published / "real_compare-real-PITT_YALE_KKI-fdreg"
    assert "--fd-regression" in (regressed / "meta.json").read_text(encoding="utf-8")
    assert (regressed / "table.csv").read_text(encoding="utf-8") not in (tangent, plain)
