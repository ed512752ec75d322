"""Onboarding a new hospital's H&E tiles: ``onboard_site.py --task histo`` end to end.

Generated tiles of three sites (their own stains); a one-round FedBN and FedAvg federation
of A and B writes its run folders, and site C, which took no part, is onboarded from them
and scored by Dice and AJI on its test tile.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import fedbn_med as fb
from fedbn_med.tasks.histo.data import site_data
from fedbn_med.tasks.histo.synth import write_synthetic, write_tile
from pipelines.onboard_site import main

TINY = {"patch_size": 16, "patches": 2, "channels": "4,8", "batch_size": 4, "rounds": 1,
        "site_rule": "datalist", "device": "cpu"}
SETS = ["--set", "site_rule=datalist", "--set", "channels=4,8", "--set", "patch_size=16",
        "--set", "patches=2"]
ROWS = ["(a) FedAvg global model as is", "(b) FedBN + local BN stats, reset scale/shift",
        "(c) FedBN + local BN stats + BN fine-tune (2 cases)",
        "(e) FedAvg + local BN stats, global scale/shift",
        "(f) FedAvg + local BN stats + BN fine-tune (2 cases)",
        "(g) local only, 2 cases labeled (SingleSet ref.)"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("histo_onboarding")
    datalist = write_synthetic(root / "tiles", ("A", "B", "C"), tiles=5, size=40)
    out = {"datalist": datalist}
    for strategy in ("fedbn", "fedavg"):
        out[strategy] = root / strategy
        fb.run("histo", sites=("A", "B"), strategy=strategy, data_dir=datalist,
               workdir=out[strategy], **TINY)
    return out


def _onboard(runs: dict[str, Path], *extra: str) -> list[str]:
    return ["--task", "histo", "--site", "C", "--data-dir", str(runs["datalist"]),
            "--run-dir", str(runs["fedbn"]), "--fedavg-run-dir", str(runs["fedavg"]),
            "--shots", "2", "--finetune-steps", "3", "--reference-epochs", "1",
            "--device", "cpu", "--no-mlflow", *SETS, *extra]


def test_a_new_hospital_is_onboarded_from_run_folders_and_scored_by_dice_and_aji(
        runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    result = main(_onboard(runs))
    out = capsys.readouterr().out

    assert list(result.ordered()) == ["fedavg_as_is", "fedbn_local_bn",
                                      "fedbn_local_bn_finetune", "fedavg_local_bn",
                                      "fedavg_local_bn_finetune", "local_few_shot"]
    assert result.counts == {"unlabeled": 3, "labeled": 2, "test": 1}
    assert any(str(runs["fedbn"]) in s for s in result.sources)
    for method, metrics in result.metrics.items():
        for key in ("test_dice", "test_aji", "val_dice"):
            assert math.isfinite(metrics[key]) and 0.0 <= metrics[key] <= 1.0, (method, key)

    table = out[out.index("| method |"):].splitlines()
    assert table[0] == "| method | dice | aji | runs |"
    rows = table[2:2 + len(ROWS)]
    assert [r.split("|")[1].strip() for r in rows] == ROWS
    for row in rows:
        assert all(math.isfinite(float(c.strip())) for c in row.split("|")[2:4]), row


def test_a_new_hospitals_own_folder_in_the_release_layout_is_one_site(
        runs: dict[str, Path], tmp_path: Path) -> None:
    folder = tmp_path / "new hospital" / "MoNuSeg 2018 Training Data"
    for k in range(5):
        write_tile(folder, f"TCGA-ZZ-{k:04d}-01Z-00-DX1", size=40, stain=7, seed=k)
    result = main([*_onboard(runs), "--site", "NEW", "--data-dir", str(folder.parent),
                   "--set", "site_rule=single"])
    assert result.site == "NEW" and result.counts == {"unlabeled": 3, "labeled": 2, "test": 1}
    assert all(0.0 <= m["test_aji"] <= 1.0 for m in result.metrics.values())
    spec = fb.RunSpec.for_task("histo", site_rule="single", data_dir=folder.parent,
                               sites=("A", "B"))
    with pytest.raises(ValueError, match=r"site_rule 'single' makes one site of every tile "
                                         r"of .*; a run of 2 sites needs 'hospital', 'organ' "
                                         r"or 'datalist'\."):
        site_data("A", spec)


def test_bad_onboarding_input_says_what_was_expected(
        runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match=r"Unknown site 'D' under site_rule 'datalist'\. "
                                         r"Valid sites: A, B, C\."):
        main([*_onboard(runs), "--site", "D"])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=r"No tile under .*empty: expected images"):
        main([*_onboard(runs), "--data-dir", str(empty)])
    with pytest.raises(ValueError, match=r"Run folder .* holds no global weights: expected "
                                         r"one of shared\.selected\.safetensors"):
        main([*_onboard(runs), "--run-dir", str(empty)])
    with pytest.raises(ValueError, match=r"Weight '.*' from checkpoint .* has shape .* but "
                                         r"the model has shape"):
        main([*_onboard(runs), "--set", "channels=6,8"])
    with pytest.raises(SystemExit):
        main([*_onboard(runs), "--task", "pathology"])
    assert "argument --task: invalid choice: 'pathology' (choose from" in capsys.readouterr().err
