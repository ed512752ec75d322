"""The docs' results pages are rendered from the published CSVs, and stale pages are caught."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

from fedbn_med.evaluation.comparison import RIDGE_POOLED, RIDGE_SITE

BENCH_DIR = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture()
def pages(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(BENCH_DIR))
    monkeypatch.syspath_prepend(str(BENCH_DIR / "research"))
    sys.modules.pop("results_pages", None)
    import results_pages

    return results_pages


def _publish(folder: Path) -> None:
    """A small published comparison: 3 methods x 5 folds, 2 sites."""
    folder.mkdir(parents=True)
    rows = []
    for fold in range(5):
        for method, auc in (("fedbn", 0.70), (RIDGE_POOLED, 0.60 + 0.01 * fold),
                            (RIDGE_SITE, 0.55)):
            row = {"strategy": method, "fold": fold, "seed": 0, "best_round": 3,
                   "last_round": 5}
            for at in ("best", "last"):
                for metric in ("balanced_accuracy", "auc", "accuracy"):
                    value = auc + 0.02 * fold if metric == "auc" and method == "fedbn" else auc
                    row.update({f"{metric}_{at}_A": value, f"{metric}_{at}_B": value,
                                f"{metric}_{at}_mean": value})
            rows.append(row)
    with open(folder / "table.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (folder / "report.md").write_text("cells (Nadeau-Bengio, n_test/n_train = 0.250).\n",
                                      encoding="utf-8")
    (folder / "meta.json").write_text(json.dumps({
        "command": "python benchmarks/real_compare.py ...", "commit": "abc", "date": "today",
        "wall_time_s": 1.0, "data": "made here", "protocol": "5 folds"}), encoding="utf-8")


def test_a_page_is_its_csv_and_a_stale_page_is_named(pages, tmp_path: Path, capsys) -> None:
    _publish(tmp_path / "published" / "k")
    spec = {"page": ("k", "Title")}
    docs = tmp_path / "docs"
    assert pages.main(["--check"], spec, docs, tmp_path / "published") == 1
    assert "stale:" in capsys.readouterr().out
    assert pages.main(["--write"], spec, docs, tmp_path / "published") == 0
    text = (docs / "page.md").read_text(encoding="utf-8")
    # fedbn's mean AUC over its 5 cells is 70 + 2 * mean(0..4) = 74.0 %
    assert "| fedbn | 70.0 [70.0, 70.0] | 74.0 [" in text
    assert f"fedbn − {RIDGE_POOLED}" in text and f"{RIDGE_POOLED} − {RIDGE_SITE}" in text
    assert "**fedbn against the pooled ridge, AUC: +12.0 [" in text and "fedbn ahead" in text
    assert pages.main(["--check"], spec, docs, tmp_path / "published") == 0
    (docs / "page.md").write_text(text.replace("74.0", "75.0"), encoding="utf-8")
    assert pages.main(["--check"], spec, docs, tmp_path / "published") == 1


def test_the_docs_pages_match_the_published_csvs(pages) -> None:
    assert pages.main(["--check"]) == 0  # else: python benchmarks/results_pages.py --write
