"""Public layouts to MONAI datalists, on tiny trees fabricated in each layout."""

from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pandas as pd
import pytest
from PIL import Image

from fedbn_med.tasks.imaging import dicom_io
from fedbn_med.tasks.imaging.datalist import load_datalist
from fedbn_med.tasks.imaging.layouts import convert, write_datalists
from fedbn_med.tasks.imaging.readers import read_image
from pipelines.image_datalists import main

FINDINGS = ["No Finding", "Enlarged Cardiomediastinum", "Cardiomegaly", "Lung Opacity",
            "Lung Lesion", "Edema", "Consolidation", "Pneumonia", "Atelectasis",
            "Pneumothorax", "Pleural Effusion", "Pleural Other", "Fracture", "Support Devices"]


def _jpeg(path: Path, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 255, (12, 10), dtype=np.uint8)
    Image.fromarray(pixels).save(path, format="JPEG")


def _chexpert(root: Path) -> Path:
    data = root / "CheXpert-v1.0-small"
    effusion = {"train": ["1", "-1", "", "0", "1.0"], "valid": ["0", "1"]}
    for split, values in effusion.items():
        rows = []
        for i, value in enumerate(values):
            rel = f"CheXpert-v1.0-small/{split}/patient{i:05d}/study1/view1_frontal.jpg"
            _jpeg(root / rel, i)
            row = dict.fromkeys(FINDINGS, "")
            row.update({"Path": rel, "Sex": "Female" if i % 2 else "Male", "Age": "60",
                        "Frontal/Lateral": "Frontal", "AP/PA": "AP",
                        "Pleural Effusion": value})
            rows.append(row)
        rows.append({**rows[0], "Frontal/Lateral": "Lateral",
                     "Path": rows[0]["Path"].replace("frontal", "lateral")})
        pd.DataFrame(rows).to_csv(data / f"{split}.csv", index=False)
    return data


@pytest.mark.parametrize(("policy", "labels"), [("zeros", [1, 0, 0, 0, 1]),
                                                ("ones", [1, 1, 0, 0, 1]),
                                                ("ignore", [1, 0, 0, 1])])
def test_chexpert_uncertain_policy_and_frontal_views(tmp_path: Path, policy: str,
                                                     labels: list[int]) -> None:
    data = _chexpert(tmp_path)
    lists = convert("chexpert", str(data), uncertain=policy)
    assert list(lists) == ["CheXpert"]
    assert [it["label"] for it in lists["CheXpert"]["training"]] == labels
    assert [it["label"] for it in lists["CheXpert"]["validation"]] == [0, 1]
    first = lists["CheXpert"]["training"][0]["image"]
    assert first.endswith("train/patient00000/study1/view1_frontal.jpg")
    assert read_image(first).shape == (12, 10)  # JPEG read by content


def test_chexpert_through_the_command_and_site_field(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    data = _chexpert(tmp_path)
    main(["chexpert", str(data), "--out", str(tmp_path / "dl"), "--uncertain", "ones",
          "--site-field", "Sex"])
    out = capsys.readouterr().out
    assert "Female:" in out and "Male:" in out
    splits = load_datalist(tmp_path / "dl" / "Male.json")
    assert [it["label"] for it in splits["training"]] == [1, 0, 1]
    with pytest.raises(ValueError, match="Unknown finding 'Effusion' for CheXpert. Valid "
                                         "findings: No Finding"):
        convert("chexpert", str(data), finding="Effusion")
    with pytest.raises(ValueError, match=r"Unknown layout 'chexpart'. Valid layouts: chexpert"):
        convert("chexpart", str(data))


def test_chestxray14_png_16_bit_and_official_test_list(tmp_path: Path) -> None:
    root = tmp_path / "nih"
    names = [f"0000000{i}_000.png" for i in range(4)]
    for i, name in enumerate(names):
        folder = root / f"images_00{1 + i // 2}" / "images"
        folder.mkdir(parents=True, exist_ok=True)
        pixels = (np.arange(20, dtype=np.uint16).reshape(4, 5) * 3000 + i)
        Image.fromarray(pixels).save(folder / name)  # 16-bit greyscale PNG
    pd.DataFrame({"Image Index": [*names, "00000009_000.png"],
                  "Finding Labels": ["Effusion|Mass", "No Finding", "Cardiomegaly",
                                     "Effusion", "Effusion"],
                  "Patient ID": ["1", "2", "3", "4", "9"],
                  "View Position": ["PA", "AP", "PA", "PA", "PA"]}).to_csv(
        root / "Data_Entry_2017.csv", index=False)
    (root / "test_list.txt").write_text(names[3] + "\n")
    lists = convert("chestxray14", str(root))["ChestX-ray14"]
    assert [it["label"] for it in lists["training"]] == [1, 0, 0]  # the absent file left out
    assert [Path(it["image"]).name for it in lists["test"]] == [names[3]]
    image = read_image(lists["training"][0]["image"])
    assert image.shape == (4, 5) and image.max() == 19 * 3000  # 16 bits kept
    by_view = convert("chestxray14", str(root), site_field="View Position")
    assert sorted(by_view) == ["AP", "PA"]


def test_mimic_cxr_jpg_metadata_labeller_and_split(tmp_path: Path) -> None:
    root = tmp_path / "mimic"
    meta, labels, split = [], [], []
    for i, (view, value, part) in enumerate([("PA", "1.0", "train"), ("AP", "-1.0", "train"),
                                             ("LATERAL", "1.0", "train"),
                                             ("PA", "", "validate"), ("PA", "0.0", "test")]):
        subject, study, dicom = f"1{i:07d}", f"5{i:07d}", f"d{i:03d}"
        _jpeg(root / "files" / f"p{subject[:2]}" / f"p{subject}" / f"s{study}" /
              f"{dicom}.jpg", i)
        meta.append({"dicom_id": dicom, "subject_id": subject, "study_id": study,
                     "ViewPosition": view})
        labels.append({"subject_id": subject, "study_id": study,
                       **dict.fromkeys(FINDINGS, ""), "Pleural Effusion": value})
        split.append({"dicom_id": dicom, "study_id": study, "subject_id": subject,
                      "split": part})
    pd.DataFrame(meta).to_csv(root / "mimic-cxr-2.0.0-metadata.csv.gz", index=False)
    pd.DataFrame(labels).to_csv(root / "mimic-cxr-2.0.0-chexpert.csv.gz", index=False)
    pd.DataFrame(split).to_csv(root / "mimic-cxr-2.0.0-split.csv", index=False)
    lists = convert("mimic-cxr", str(root), uncertain="ignore")["MIMIC-CXR"]
    assert {k: [it["label"] for it in v] for k, v in lists.items()} == {
        "training": [1], "validation": [0], "test": [0]}
    assert read_image(lists["training"][0]["image"]).shape == (12, 10)


def _ixi(root: Path) -> Path:
    sample = root / "7kd5wj7v7p-3" / "IXI_sample"
    for name in ("IXI002-Guys-0828", "IXI012-HH-1211", "IXI013-HH-1212", "IXI035-IOP-0873"):
        for kind, suffix in (("T1", "image"), ("label", "label")):
            folder = sample / name / kind
            folder.mkdir(parents=True)
            data = np.ones((4, 5, 6), dtype=np.float32 if kind == "T1" else np.uint8)
            nib.save(nib.Nifti1Image(data, np.eye(4)), str(folder / f"{name}_{suffix}.nii.gz"))
    return root


def test_fed_ixi_sites_are_the_hospitals(tmp_path: Path) -> None:
    root = _ixi(tmp_path / "fed_ixi")
    (tmp_path / "metadata_tiny.csv").write_text(
        "Patient ID,Center,Split\n2,0,train\n12,1,train\n13,1,test\n35,2,train\n")
    lists = convert("fed-ixi", str(root), metadata=tmp_path / "metadata_tiny.csv")
    assert sorted(lists) == ["Guys", "HH", "IOP"]
    assert [it["subject"] for it in lists["HH"]["training"]] == ["IXI012-HH-1211"]
    assert [it["subject"] for it in lists["HH"]["test"]] == ["IXI013-HH-1212"]
    item = lists["Guys"]["training"][0]
    assert item["image"].endswith("T1/IXI002-Guys-0828_image.nii.gz")
    assert item["label"].endswith("label/IXI002-Guys-0828_label.nii.gz")
    paths = write_datalists(lists, tmp_path / "dl")
    assert json.loads(paths["IOP"].read_text())["training"][0]["subject"] == "IXI035-IOP-0873"
    (root / "7kd5wj7v7p-3" / "IXI_sample" / "IXI099-XYZ-0001").mkdir()
    with pytest.raises(ValueError, match=r"IXI099-XYZ-0001: expected a subject folder "
                                         r"IXI<nnn>-<hospital>-<nnnn> with hospital one of "
                                         "Guys, HH, IOP"):
        convert("fed-ixi", str(root))


def test_pacs_export_gives_one_item_per_series_read_by_its_uid(tmp_path: Path) -> None:
    export = tmp_path / "export"
    for seed, n in (("a", 4), ("b", 3)):
        volume = np.random.default_rng(len(seed)).uniform(0, 100, (6, 7, n))
        dicom_io.write_series(export / "ALL", volume, spacing=(1.0, 1.0, 2.0),
                              patient_id="P-1", uid_seed=seed)
        for f in (export / "ALL").glob("IM*.dcm"):  # PACS names: no extension
            f.rename(f.with_name(f"{seed}{f.stem[2:]}"))
    (export / "README.txt").write_text("not an image")
    lists = convert("pacs", str(export), modality="MR")["PACS"]["training"]
    assert [it["files"] for it in lists] == [4, 3]
    for item in lists:
        assert read_image(item["image"], series=item["image_series"]).shape[2] == item["files"]
    with pytest.raises(ValueError, match="no DICOM series of modality CT"):
        convert("pacs", str(export), modality="CT")
