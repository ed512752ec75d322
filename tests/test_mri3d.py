"""3D MRI segmentation: a 3D UNet on patches, sliding-window Dice, BN found by type in 3D.

One tiny in-process federation of two built-in sites (24^3 volumes, 16^3 patches, so
the sliding window really slides) is shared by the module's assertions; the built-in
sites are generated once per test session (``tests/test_imaging_compare.py`` uses them).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from monai.inferers import SliceInferer, SlidingWindowInferer
from torch import nn

from fedbn_med.fl.partition import partition_model
from fedbn_med.fl.registry import get_strategy
from fedbn_med.spec import RunSpec
from fedbn_med.tasks import get_task
from fedbn_med.tasks.imaging.datalist import load_datalist
from fedbn_med.tasks.imaging.datasets import cross_validation_split, make_dataset
from fedbn_med.tasks.imaging.synth import ensure_mri_site
from fedbn_med.tasks.mri.data import mri_transforms
from fedbn_med.tasks.mri.model import build_mri_model
from fedbn_med.training.inprocess import run_in_process

SITES = ("SiteA", "SiteB")
TINY = {"image_size": 24, "subjects": 6, "patch_size": 16, "patches": 2}


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's built-in imaging sites (generation is atomic and reused)."""
    return tmp_path_factory.getbasetemp() / "imaging_sites"


@pytest.fixture(scope="module")
def federation(data_root: Path) -> tuple[dict, object, RunSpec]:
    """Two rounds of FedBN over two 3D sites (built once for the module)."""
    config = RunSpec.for_task("mri", strategy="fedbn", rounds=2, batch_size=2, sites=SITES,
                              device="cpu", **TINY)
    task = get_task("mri")
    trainers = {s: task.build_site(s, config, data_root, "cpu") for s in SITES}
    history = run_in_process(trainers, config.strategy_obj(), config.rounds)
    return trainers, history, config


def _bn_modules(model: nn.Module) -> dict[str, nn.Module]:
    return {n: m for n, m in model.named_modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm)}


@pytest.mark.parametrize("mode, bn_type", [("3d", nn.BatchNorm3d), ("2d", nn.BatchNorm2d)])
def test_partition_finds_the_unets_batchnorm_by_type(mode: str, bn_type: type) -> None:
    config = RunSpec.for_task("mri", mode=mode)
    model = build_mri_model(config, config.input_shape())
    bns = _bn_modules(model)
    assert bns and all(type(m) is bn_type for m in bns.values())
    part = partition_model(model)
    # every BN tensor, and nothing else: weight, bias and the three buffers per layer
    assert len(part.private) == 5 * len(bns)
    assert {k.rsplit(".", 1)[0] for k in part.private} == set(bns)
    assert not any("bn" in k.lower() for k in part.private)  # a name rule finds none
    assert all(".adn.N." in k for k in part.private)
    conv = [k for k, v in model.state_dict().items() if v.dim() == 2 + config.settings.spatial_dims
            and k in part.shared]
    assert conv, "the convolutions are shared"
    assert get_strategy("fedbn").exchanged_keys(part) == part.shared
    silo = get_strategy("silobn").exchanged_keys(part)
    assert silo & part.private == part.private - part.statistics  # affine shared
    assert not silo & part.statistics
    assert get_strategy("fedavg").exchanged_keys(part) == part.all


def test_training_items_are_3d_patches_and_scoring_uses_whole_volumes(federation) -> None:
    trainers, _, config = federation
    trainer = trainers["SiteA"]
    assert isinstance(trainer.objective.inferer, SlidingWindowInferer)
    assert trainer.objective.inferer.roi_size == (16, 16, 16)
    patches = trainer.data.train[0]
    assert isinstance(patches, list) and len(patches) == TINY["patches"]
    for patch in patches:
        assert tuple(patch["image"].shape) == (1, 16, 16, 16)
        assert tuple(patch["label"].shape) == (1, 16, 16, 16)
        assert set(patch) >= {"image", "label"} and not any("indices" in k for k in patch)
    volume = trainer.data.test[0]
    assert tuple(volume["image"].shape) == (1, 24, 24, 24)
    assert trainer.input_shape == config.input_shape() == (1, 16, 16, 16)


def test_the_network_sees_plain_tensors_not_metatensors(federation) -> None:
    # MONAI's items are MetaTensors, whose every operation in a forward and backward pass
    # goes through __torch_function__; the batches drop the metadata (torch.as_tensor
    # returns a MetaTensor as it is)
    from monai.data import MetaTensor

    from fedbn_med.tasks.imaging.trainer import plain

    trainer = federation[0]["SiteA"]
    assert isinstance(trainer.data.train[0][0]["image"], MetaTensor)
    image, label = next(iter(trainer.objective.batches(trainer.data, 2, 1, lambda _: 0)))
    assert type(image) is torch.Tensor and type(label) is torch.Tensor
    assert type(next(iter(trainer.objective.bn_inputs(trainer.data, 2, 0)))) is torch.Tensor
    item = MetaTensor(torch.arange(6.0).reshape(2, 3))
    assert type(plain(item)) is torch.Tensor and torch.equal(plain(item), item.as_tensor())
    assert plain(item).data_ptr() == item.data_ptr()  # no copy
    assert type(plain(np.zeros(3))) is torch.Tensor


def test_fedbn_keeps_batchnorm3d_home_and_scores_dice_per_class(federation) -> None:
    trainers, history, _ = federation
    a, b = (trainers[s] for s in SITES)
    state_a, state_b = a.model.state_dict(), b.model.state_dict()
    assert set(history.global_weights) == set(a.partition.shared)
    for key in a.partition.shared:
        assert torch.equal(state_a[key], state_b[key]), key
    means = [k for k in a.partition.private if k.endswith("running_mean")]
    assert any(not torch.equal(state_a[k], state_b[k]) for k in means)
    for site, metrics in history.final().items():
        for split in ("val", "test"):
            dice = [metrics[f"{split}_dice_{c}"] for c in ("csf", "gm", "wm")]
            assert all(0.0 <= d <= 1.0 for d in dice), (site, dice)
            # each figure recorded at the precision a site sends it (fl.release.bounded)
            assert metrics[f"{split}_dice"] == pytest.approx(np.mean(dice), abs=1e-4)
            assert np.isfinite(metrics[f"{split}_loss"])


def test_own_site_bn_statistics_are_used_for_scoring_and_put_back(federation, data_root
                                                                  ) -> None:
    _, _, config = federation
    spec = config.replace(strategy="fedavg_localbn", rounds=1)
    trainer = get_task("mri").build_site("SiteA", spec, data_root, "cpu")
    trainer.fit({}, {"round": 1})
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    own = trainer.score({})
    after = trainer.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # statistics put back
    trainer.strategy = get_strategy("fedavg")  # the same model, scored with its own BN
    shared = trainer.score({})
    assert own["test_loss"] != shared["test_loss"]


def test_the_2d_slice_mode_stays_an_option(data_root: Path) -> None:
    spec = RunSpec.for_task("mri", mode="2d", strategy="fedbn", rounds=1, batch_size=2,
                            sites=("SiteA",), device="cpu", image_size=24, subjects=6,
                            slices=2)
    trainer = get_task("mri").build_site("SiteA", spec, data_root, "cpu")
    assert isinstance(trainer.objective.inferer, SliceInferer)
    assert tuple(trainer.data.train[0][0]["image"].shape) == (1, 24, 24)
    trainer.fit({}, {"round": 1})
    scores = trainer.score({})
    assert 0.0 <= scores["test_dice"] <= 1.0
    assert all(isinstance(m, nn.BatchNorm2d) for m in _bn_modules(trainer.model).values())


def test_folds_partition_each_site_and_repetitions_redraw() -> None:
    items = [{"image": f"s{i}.nii.gz", "label": i % 2} for i in range(11)]
    splits = [cross_validation_split(items, fold=f, n_folds=5, seed=3, stratify="label")
              for f in range(5)]
    tests = [sorted(i["image"] for i in s["test"]) for s in splits]
    assert sorted(sum(tests, [])) == sorted(i["image"] for i in items)  # a partition
    assert tests[0] != tests[1]
    for s in splits:
        names = {k: {i["image"] for i in s[k]} for k in s}
        assert not names["test"] & names["validation"]
        assert not (names["test"] | names["validation"]) & names["training"]
        assert len(names["training"]) >= 6
        assert {i["label"] for i in s["test"]} == {0, 1}  # stratified
    again = cross_validation_split(items, fold=0, n_folds=5, seed=4, stratify="label")
    assert sorted(i["image"] for i in again["test"]) != tests[0]
    with pytest.raises(ValueError, match="3 items cannot fill 5 folds; expected at least 5"):
        cross_validation_split(items[:3], fold=0, n_folds=5, seed=0)


def test_disk_cache_keeps_preprocessed_volumes_as_files(federation, data_root: Path,
                                                       tmp_path: Path) -> None:
    trainers, _, config = federation
    assert all(isinstance(i["image"], np.ndarray) for i in trainers["SiteA"].data.val.data)
    datalist = ensure_mri_site("SiteA", size=24, subjects=6, data_dir=data_root)
    split = load_datalist(datalist)["test"]
    settings = config.replace(cache=False, cache_dir=str(tmp_path)).settings
    chain = mri_transforms(settings, train=False)
    disk = make_dataset(split, ("image", "label"), chain, cache="disk",
                        cache_dir=tmp_path / "cache")
    memory = make_dataset(split, ("image", "label"), chain, cache="memory")
    assert torch.equal(torch.as_tensor(disk[0]["image"]), torch.as_tensor(memory[0]["image"]))
    assert len(list((tmp_path / "cache").glob("*.pt"))) == 1  # written on first read


@pytest.mark.parametrize("changes, message", [
    ({"mode": "4d"}, "mode must be one of 3d, 2d, got '4d'"),
    ({"patch_size": 20}, "patch_size must be a multiple of 8 and at least 16, got 20"),
    ({"patches": 0}, "patches must be a positive integer, got 0"),
    ({"cache_dir": "/tmp/x"}, "cache_dir='/tmp/x' is the on-disk cache of cache=false"),
    ({"data_seed": -1}, "data_seed must be a non-negative integer, got -1"),
])
def test_bad_mri_settings_say_what_is_valid(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RunSpec.for_task("mri", **changes)
