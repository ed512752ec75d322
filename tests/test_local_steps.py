"""``benchmarks/research/local_steps.py``: each site's training split and local steps per round."""

from __future__ import annotations

import csv

import pytest


@pytest.mark.parametrize(("n", "batch", "epochs", "steps"), [
    (32, 32, 1, 1), (35, 32, 1, 1),  # a last batch of 1 to 3 joins the one before
    (36, 32, 1, 2), (10, 32, 1, 1), (10, 32, 3, 3), (111, 32, 1, 4), (1, 32, 1, 0),
    (3, 32, 1, 1), (26, 8, 1, 3), (28, 8, 1, 4),
])
def test_steps_per_round_counts_the_trainers_batches(bench, n, batch, epochs, steps):
    import torch

    from fedbn_med.training.objective import BinaryClassification
    from fedbn_med.training.trainer import SiteData

    assert bench("local_steps").steps_per_round(n, batch, epochs) == steps
    x, y = torch.zeros(n, 1), torch.zeros(n, dtype=torch.long)
    data = SiteData(train=(x, y), val=(x[:0], y[:0]), test=(x[:0], y[:0]))
    batches = BinaryClassification().batches(data, batch, epochs, lambda *_: 0)
    assert len(list(batches)) == steps  # what the trainer does


def test_every_cell_is_read_and_one_batch_sites_are_named(bench, abide_release, store,
                                                         tmp_path, capsys):
    out = tmp_path / "out"
    sites = "PITT,YALE"  # 16 subjects each in the test release
    argv = ["--data-dir", str(abide_release), "--sites", sites, "--folds", "2", "--seeds",
            "2", "--tracking-uri", store]
    assert bench("local_steps").main([*argv, "--windows", "0", "--out", str(out)]) == 0
    with open(out / "table.csv", newline="", encoding="utf-8") as handle:
        rows = {r["site"]: r for r in csv.DictReader(handle)}
    assert list(rows) == ["PITT", "YALE"]
    for row in rows.values():
        # 16 subjects a site: far below one batch of 32, so one step and an idle term
        assert row["cells"] == "4" and int(row["train_max"]) < 16
        assert row["steps_min"] == row["steps_max"] == "1"
        assert row["proximal_term_acts"] == "False"
    printed = capsys.readouterr().out
    assert "One step per round at every site in every cell: 2 of 2 sites" in printed
    # the default windows: one example per window, several steps, an acting term
    windowed = tmp_path / "windowed"
    assert bench("local_steps").main([*argv, "--out", str(windowed)]) == 0
    with open(windowed / "table.csv", newline="", encoding="utf-8") as handle:
        rows = {r["site"]: r for r in csv.DictReader(handle)}
    for row in rows.values():
        assert int(row["train_min"]) > 32 and int(row["steps_min"]) >= 2
        assert row["proximal_term_acts"] == "True"
    printed = capsys.readouterr().out
    assert "One step per round at every site in every cell: 0 of 2 sites" in printed
    assert "training windows" in printed
