"""The README's results tables are generated from ``benchmarks/published/`` and match it.

The first test reads the repository's own README and published folders. The others
publish a ``--quick`` run of ``benchmarks/real_compare.py`` (on a small release in the
real layout that :func:`tests.test_determinism.write_release` writes) into a temporary
README and published folder, then damage them in the ways a hand edit would.
"""

from __future__ import annotations

import csv
import importlib
import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from tests.test_determinism import write_release

ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = ROOT / "benchmarks"
SITES = {"PITT": 12, "YALE": 12}
KEY = "real_compare-real-PITT_YALE"


@pytest.fixture()
def modules(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
            benchmark_module: Callable[[str], ModuleType]) -> dict[str, ModuleType]:
    """Return the benchmark modules, publishing into ``tmp_path`` instead of the repo."""
    published = benchmark_module("_published")
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\nbefore\n<!-- results:{KEY} -->\nold numbers\n"
                      f"<!-- /results:{KEY} -->\nafter\n", encoding="utf-8")
    monkeypatch.setattr(published, "PUBLISHED_DIR", tmp_path / "published")
    monkeypatch.setattr(published, "README", readme)
    monkeypatch.setattr(published, "RESULTS_DIR", tmp_path / "no-docs")
    tables = benchmark_module("readme_tables")
    monkeypatch.setattr(tables, "PUBLISHED_DIR", tmp_path / "published")
    # rewrite_readme's default argument was bound at import: pass the README explicitly.
    monkeypatch.setattr(published, "rewrite_readme",
                        lambda key=None, readme=readme, _f=published.rewrite_readme:
                        _f(key, readme))
    return {"published": published, "tables": tables,
            "real_compare": benchmark_module("real_compare"),
            "subject_tests": benchmark_module("subject_tests")}


def test_the_readme_matches_the_published_results() -> None:
    import sys

    sys.path.insert(0, str(BENCH_DIR))
    try:
        tables = importlib.import_module("readme_tables")
        assert tables.problems(tables.pages_text()) == []  # README.md and docs/
        text = (ROOT / "README.md").read_text(encoding="utf-8")
        assert len(tables.blocks(text)) >= 1, "the README has no generated results table"
    finally:
        sys.path.remove(str(BENCH_DIR))


def test_publish_writes_the_block_and_a_hand_edit_is_caught(
        modules: dict[str, ModuleType], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    release = write_release(tmp_path / "release", SITES, seed=3)
    published, tables = modules["published"], modules["tables"]
    assert modules["real_compare"].main(
        ["--quick", "--data-dir", str(release), "--sites", ",".join(SITES),
         "--strategies", "fedavg,fedbn", "--out", str(tmp_path / "out"),
         "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", "--publish"]) == 0
    readme = published.README
    text = readme.read_text(encoding="utf-8")
    assert "old numbers" not in text and text.startswith("# x\n\nbefore\n")
    assert text.rstrip().endswith("after")
    meta = json.loads((published.PUBLISHED_DIR / KEY / "meta.json").read_text())
    assert meta["command"].startswith("python benchmarks/real_compare.py --quick "
                                      "--data-dir DATA_DIR --sites PITT,YALE")
    assert str(release) not in text, "the local data path leaked into the README"
    assert "shared sites PITT, YALE" in meta["data"] and "Nadeau-Bengio" in meta["protocol"]
    # what the numbers were computed with (the numeric stack decides their last digits)
    import numpy as np

    assert meta["environment"]["packages"]["numpy"] == np.__version__
    assert meta["environment"]["cpu_capability"]
    assert meta["environment"]["cpu_model"] and meta["environment"]["cpu_flags_sha256"]
    from fedbn_med.numerics import describe

    assert meta["environment"]["numerics"] == describe()
    assert tables.problems(text) == []

    # Every run's own predictions are published beside the table, hashed like it, with
    # no time stamp in the gzip header.
    cells_path = published.PUBLISHED_DIR / KEY / "cell_predictions.csv.gz"
    assert meta["sha256"]["cell_predictions.csv.gz"] == published._sha256(cells_path)
    assert cells_path.read_bytes() == (tmp_path / "out" / "cell_predictions.csv.gz"
                                       ).read_bytes()
    assert cells_path.read_bytes()[4:8] == b"\0\0\0\0"
    cells_path.write_bytes(cells_path.read_bytes()[:-4] + b"\0\0\0\0")
    assert any("cell_predictions.csv.gz: changed since its benchmark published it" in p
               for p in tables.problems(text))
    cells_path.write_bytes((tmp_path / "out" / "cell_predictions.csv.gz").read_bytes())
    # ... and they are enough: the subject-level table recomputed from them is the one
    # the benchmark published, to the digit (benchmarks/research/subject_tests.py).
    subject_tests = modules["subject_tests"]
    monkeypatch.setattr(subject_tests, "PUBLISHED_DIR", published.PUBLISHED_DIR)
    assert subject_tests.main(["--key", KEY]) == 0
    report_before = (published.PUBLISHED_DIR / KEY / "report.md").read_bytes()
    for bad in ("../escape.txt", "name.gz\n", "meta.json"):
        with pytest.raises(ValueError, match="plain file name"):
            published.publish(KEY, name="real_compare", argv=[], report="r",
                              csv_text="a\n", data="d", protocol="p", wall_time_s=0.0,
                              files={bad: b"x"})
    # refused before anything was written
    assert (published.PUBLISHED_DIR / KEY / "report.md").read_bytes() == report_before
    assert not (published.PUBLISHED_DIR / "escape.txt").exists()
    # a file the benchmark did not publish is named
    stray = published.PUBLISHED_DIR / KEY / "notes.txt"
    stray.write_text("typed by hand")
    assert any("notes.txt: not published by its benchmark" in p
               for p in tables.problems(text))
    stray.unlink()

    # A number typed into the README by hand.
    body = tables.blocks(text)[KEY]
    row = next(ln for ln in body.splitlines() if ln.startswith("| FedBN |"))
    cells = row.split("|")
    cells[2] = " 99.9 "
    assert any(f"'{KEY}' differs" in p
               for p in tables.problems(text.replace(row, "|".join(cells), 1)))

    # The CSV changed after publishing: the hash and the recomputed means both say so.
    csv_path = published.PUBLISHED_DIR / KEY / "table.csv"
    with open(csv_path, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    for r in rows:
        if r["strategy"] == "FedBN":
            r["balanced_accuracy_best_mean"] = "0.123"
    with open(csv_path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    found = tables.problems(text)
    assert any("changed since its benchmark published it" in p for p in found), found
    assert any("FedBN mean: shows" in p and "table.csv gives 12.30" in p for p in found), found


def test_an_orphan_or_missing_published_folder_is_named(modules: dict[str, ModuleType],
                                                        tmp_path: Path) -> None:
    tables = modules["tables"]
    text = modules["published"].README.read_text(encoding="utf-8")
    assert any(f"no published results for README block '{KEY}'" in p
               for p in tables.problems(text))
    (tmp_path / "published" / "lonely").mkdir(parents=True)
    assert any("benchmarks/published/lonely/ has no README block" in p
               for p in tables.problems(text))


def test_republishing_removes_the_files_of_an_earlier_publication(
        modules: dict[str, ModuleType]) -> None:
    published = modules["published"]
    common = {"name": "real_compare", "argv": [], "report": "r", "csv_text": "a\n",
              "data": "d", "protocol": "p", "wall_time_s": 0.0}
    folder = published.publish(KEY, files={"cell_predictions.csv.gz": b"x"}, **common)
    assert (folder / "cell_predictions.csv.gz").read_bytes() == b"x"
    published.publish(KEY, files={}, **common)  # e.g. a run that kept no predictions
    assert not (folder / "cell_predictions.csv.gz").exists()
    assert published.check_hashes(KEY) == []
