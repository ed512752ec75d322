"""Onboarding is one code path for every task: ``onboard_site.py --task mri`` end to end.

The MRI run holds SiteC out of a one-round FedBN and FedAvg federation of SiteA and
SiteB (built-in 16^3 volumes, 6 subjects per site, generated in the session's
``imaging_sites`` folder that the other imaging tests share) and scores every method
by the site's own objective: Dice.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from fedbn_med.onboarding import few_case_indices, table_columns
from fedbn_med.onboarding.cases import case_classes
from fedbn_med.tasks import get_task
from pipelines.onboard_site import main

METHODS = ["fedbn_local_bn_reset", "fedbn_local_bn", "fedbn_local_bn_finetune", "fedavg_as_is",
           "fedavg_local_bn", "fedavg_local_bn_finetune", "local_few_shot"]


def test_an_mri_site_is_onboarded_and_every_method_scores_dice(
        monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FEDBN_MED_DATA", str(tmp_path_factory.getbasetemp() / "imaging_sites"))
    result = main(["--task", "mri", "--site", "SiteC", "--rounds", "1", "--shots", "2",
                   "--finetune-steps", "3", "--reference-epochs", "1", "--image-size", "16",
                   "--subjects", "6", "--device", "cpu", "--no-mlflow"])
    out = capsys.readouterr().out

    assert all("federation of SiteA, SiteB (1 rounds" in s for s in result.sources)
    assert list(result.metrics) == METHODS
    for method, metrics in result.metrics.items():
        for key in ("test_dice", "test_dice_csf", "test_dice_gm", "test_dice_wm", "val_dice"):
            assert math.isfinite(metrics[key]) and 0.0 <= metrics[key] <= 1.0, (method, key)
    # the site's own BN statistics change what the FedAvg model predicts there
    assert (abs(result.metrics["fedavg_local_bn"]["test_dice"]
                - result.metrics["fedavg_as_is"]["test_dice"]) > 1e-4)
    # segmentation: two labeled cases in all (volumes), not two per class
    assert result.counts["labeled"] == 2
    assert "(c) FedBN + local BN stats + BN fine-tune (2 cases)" in out

    table = out[out.index("| method |"):].splitlines()
    assert table[0] == "| method | dice | dice_csf | dice_gm | dice_wm | runs |"
    rows = table[2:2 + len(METHODS)]
    assert len(rows) == len(METHODS)
    for row in rows:
        dice = row.split("|")[2].strip()
        assert math.isfinite(float(dice)), row  # a number, not n/a


def test_table_columns_follow_the_tasks_headline() -> None:
    assert table_columns(get_task("abide")) == ("test_accuracy", "test_auc")
    assert table_columns(get_task("mri")) == ("test_dice", "test_dice_csf", "test_dice_gm",
                                              "test_dice_wm")
    assert table_columns(get_task("xray"))[0] == "test_auc"


def test_cases_are_drawn_per_class_only_where_labels_are_classes(tmp_path: Path) -> None:
    class Items:  # a dataset's items before any transform, as MONAI keeps them
        def __init__(self, data: list[dict[str, object]]) -> None:
            self.data = data

    radiographs = Items([{"image": "a.png", "label": i % 2} for i in range(6)])
    volumes = Items([{"image": "a.nii", "label": "a_seg.nii"} for _ in range(6)])
    assert torch.equal(case_classes(radiographs), torch.tensor([0, 1, 0, 1, 0, 1]))
    assert case_classes(volumes) is None

    idx = few_case_indices(6, 2, seed=3)
    assert torch.equal(idx, few_case_indices(6, 2, seed=3)) and idx.numel() == 2
    with pytest.raises(ValueError, match=r"shots=4 labeled cases were asked for, but the "
                                         r"site's training split has only 3\. Use shots <= 3"):
        few_case_indices(3, 4, seed=0)
