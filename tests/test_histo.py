"""The histopathology task: readers of the release as distributed, AJI, site rules, a run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fedbn_med as fb
from fedbn_med.tasks.histo.metrics import aggregated_jaccard, dice
from fedbn_med.tasks.histo.readers import (
    find_tiles,
    read_imagescope_xml,
    read_instances,
    read_mask_png,
    read_tile,
)
from fedbn_med.tasks.histo.sites import TSS, assign_sites, tss_code
from fedbn_med.tasks.histo.synth import write_synthetic, write_tile


@pytest.fixture
def tile(tmp_path: Path) -> tuple[Path, Path, Path]:
    return write_tile(tmp_path / "release" / "MoNuSeg 2018 Training Data",
                      "TCGA-B0-0001-01Z-00-DX1", size=64, stain=0,
                      seed=1, nuclei=12)


def test_the_xml_reader_reproduces_the_mask_and_counts_the_nuclei(tile) -> None:
    tif, xml, png = tile
    rgb = read_tile(tif)
    assert rgb.shape == (3, 64, 64) and rgb.dtype == np.uint8
    inst = read_imagescope_xml(xml, rgb.shape[1:])
    assert inst.max() == 12  # one label per <Region>
    assert dice(inst > 0, read_mask_png(png) > 0) >= 0.95


def test_the_png_fallback_and_the_layout_are_found(tile, tmp_path: Path) -> None:
    tif, xml, png = tile
    xml.unlink()
    (found,) = find_tiles(tmp_path / "release")
    assert found.tile_id == "TCGA-B0-0001-01Z-00-DX1" and found.xml is None
    assert found.mask == png
    inst = read_instances(found, (64, 64))
    assert inst.max() >= 1 and (inst > 0).sum() == (np.asarray(Image.open(png)) > 0).sum()


def test_a_datalist_names_sites_and_both_annotations(tmp_path: Path) -> None:
    path = write_synthetic(tmp_path, ("A", "B"), tiles=2, size=32)
    tiles = find_tiles(path)
    assert [t.site for t in tiles] == ["A", "A", "B", "B"]
    assert [t.xml is not None for t in tiles] == [True, False, True, False]


def test_bad_input_is_named(tmp_path: Path, tile) -> None:
    bad = tmp_path / "bad.xml"
    bad.write_text("<Annotations><Regions>")
    with pytest.raises(ValueError, match=r"Cannot read ImageScope XML .*bad.xml"):
        read_imagescope_xml(bad, (8, 8))
    bad.write_text("<Annotations/>")
    with pytest.raises(ValueError, match=r"holds no <Region>; expected one per nucleus"):
        read_imagescope_xml(bad, (8, 8))
    listed = tmp_path / "list.json"
    listed.write_text(json.dumps({"tiles": [{"image": "nope.tif", "label": "nope.png"}]}))
    with pytest.raises(ValueError, match=r"list.json, tile 0: no file .*nope.tif"):
        find_tiles(listed)
    with pytest.raises(FileNotFoundError, match=r"No tiles at .*missing"):
        find_tiles(tmp_path / "missing")
    with pytest.raises(ValueError, match=r"Tile 'scan1' is not named by a TCGA barcode"):
        tss_code("scan1")


def test_aji_follows_its_definition() -> None:
    truth = np.zeros((6, 8), int)
    truth[1:3, 1:3] = 1  # 4 px
    truth[1:3, 5:7] = 2  # 4 px
    assert aggregated_jaccard(truth, truth) == 1.0
    # the two nuclei predicted as one: C = 4 + 4; U = (4 + 12 - 4) + (4 + 12 - 4)
    merged = np.zeros_like(truth)
    merged[1:3, 1:7] = 1
    assert aggregated_jaccard(truth, merged) == pytest.approx(8 / 24)
    # a false detection adds its area to the union only
    extra = truth.copy()
    extra[4:6, 0:2] = 3
    assert aggregated_jaccard(truth, extra) == pytest.approx(8 / 12)
    # a missed nucleus adds its area to the union only
    assert aggregated_jaccard(truth, np.where(truth == 2, 0, truth)) == pytest.approx(4 / 8)
    assert aggregated_jaccard(np.zeros((3, 3)), np.zeros((3, 3))) == 1.0
    assert dice(merged, truth) == pytest.approx(16 / 20)
    with pytest.raises(ValueError, match=r"one shape, got \(6, 8\) and \(3, 3\)"):
        aggregated_jaccard(truth, np.zeros((3, 3)))


def test_the_site_rules_keep_hospitals_whole_and_group_small_organs() -> None:
    # tiles per TSS code as in the MoNuSeg 2018 training release (30 tiles)
    counts = {"18": 1, "21": 2, "38": 1, "49": 1, "50": 1, "A7": 2, "AR": 2, "AY": 1, "B0": 3,
              "CH": 1, "DK": 1, "E2": 2, "G2": 1, "G9": 5, "HE": 3, "KB": 1, "NH": 1, "RD": 1}
    assert set(counts) == set(TSS)
    ids = [f"TCGA-{code}-{i:04d}-01Z-00-DX1" for code, n in counts.items() for i in range(n)]
    hospital = assign_sites(ids, "hospital")
    assert sorted(hospital) == ["H1", "H2", "H3", "H4"]
    where = {TSS[tss_code(t)].institution: name for name, ts in hospital.items() for t in ts}
    for name, tiles in hospital.items():  # no institution spans two sites
        assert all(where[TSS[tss_code(t)].institution] == name for t in tiles)
    organ = assign_sites(ids, "organ")
    assert {name: len(t) for name, t in organ.items()} == {
        "breast": 6, "kidney": 6, "lung": 6, "other": 6, "prostate": 6}
    assert sorted(len(t) for t in hospital.values()) == [7, 7, 8, 8]
    assert {TSS[tss_code(t)].organ for t in organ["other"]} == {"bladder", "colon", "stomach"}
    with pytest.raises(ValueError, match=r"Unknown site rule 'scanner'. Valid rules: hospital"):
        assign_sites(ids, "scanner")
    with pytest.raises(ValueError, match=r"TSS code 'ZZ' is not in the table"):
        assign_sites(["TCGA-ZZ-0001-01Z-00-DX1"], "organ")


def test_the_task_passes_its_checks_and_runs_on_a_release_by_organ(tmp_path: Path) -> None:
    small = {"synthetic_size": 48, "synthetic_tiles": 4, "patch_size": 16, "batch_size": 4,
             "n_folds": 4, "channels": "4,8"}
    assert fb.check_task("histo", **small)[-1] == "one_round"
    # a release in the MoNuSeg layout, sites by organ (breast: A7, AR; kidney: B0, HE)
    root = tmp_path / "release" / "MoNuSeg 2018 Training Data"
    for i, code in enumerate(("A7", "AR", "E2", "A7", "B0", "HE", "B0", "HE")):
        write_tile(root, f"TCGA-{code}-{i:04d}-01Z-00-DX1", size=48, stain=i // 4, seed=i)
    spec = fb.RunSpec.for_task("histo", **small, data_dir=tmp_path / "release",
                               site_rule="organ", sites=("breast", "kidney"), rounds=1)
    result = fb.run(spec, workdir=tmp_path / "run")
    assert result.sites == ("breast", "kidney")
    assert all(0.0 <= m["test_aji"] <= 1.0 and 0.0 <= m["test_dice"] <= 1.0
               for m in result.selected.values())
    with pytest.raises(ValueError, match=r"Unknown site 'lung' under site_rule 'organ'. "
                                         r"Valid sites: breast, kidney"):
        fb.run(spec.replace(sites=("breast", "lung")))


def test_the_settings_name_what_they_expect() -> None:
    from fedbn_med.tasks.histo.settings import Settings

    assert Settings(channels="8,16,32").levels == (8, 16, 32)
    with pytest.raises(ValueError, match=r"stain must be one of none, macenko, got 'reinhard'"):
        Settings(stain="reinhard")
    with pytest.raises(ValueError, match=r"channels must name at least two positive channel "
                                         r"counts, comma-separated \('16,32,64'\), got '8'"):
        Settings(channels="8")
    with pytest.raises(ValueError, match=r"site_rule must be one of hospital, organ, datalist"):
        Settings(site_rule="scanner")
