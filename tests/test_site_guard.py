"""What a site checks of the server's models and run spec, and what it never writes (issue 44).

The real readers, the real :class:`~fedbn_med.federation.client_app.SiteRuntime` and
trainer, on small tensors; the same rules against real processes are in
``tests/test_attacks_hostile.py`` and ``tests/test_attacks_collusion.py``.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from fedbn_med.checkpoint import load_tensors
from fedbn_med.federation.client_app import SiteRuntime
from fedbn_med.fl.model_checks import hostile_model_reason, shift_reason
from fedbn_med.fl.registry import get_strategy
from fedbn_med.fl.weighting import capped_weights, site_weights
from fedbn_med.spec import RunSpec
from fedbn_med.tasks.abide.model import AbideMLP
from fedbn_med.tasks.site_toml import site_policy
from fedbn_med.training.trainer import SiteData, SiteTrainer


def _write(folder, text):
    path = folder / "UCLA.toml"
    path.write_text('abide_site_ids = ["UCLA_1"]\n' + text)
    return path


def _runtime(tmp_path, x: torch.Tensor | None = None) -> SiteRuntime:
    torch.manual_seed(0)
    split = (torch.randn(8, 4) if x is None else x, torch.tensor([0, 1] * 4))
    trainer = SiteTrainer("UCLA", AbideMLP(4), SiteData(split, split, split),
                          get_strategy("fedbn"), device="cpu", batch_size=4)
    return SiteRuntime(trainer=trainer, state_path=tmp_path / "f" / "UCLA.safetensors")


def test_a_model_no_honest_server_sends_is_named_and_refused():
    w = {"a.weight": torch.randn(3, 4), "a.bias": torch.zeros(3)}
    assert hostile_model_reason(w) is None  # a zero bias is fine (DenseNet121 starts so)
    assert hostile_model_reason({**w, "a.weight": torch.full((3, 4), math.nan)}) == \
        "'a.weight' holds NaN or Inf"
    assert hostile_model_reason({**w, "a.weight": torch.full((3, 4), 0.5)}).startswith(
        "'a.weight' (shape (3, 4)) is constant (0.5 everywhere)")
    big = {**w, "a.bias": torch.tensor([0.0, 2e3, 0.0])}
    assert hostile_model_reason(big) == ("'a.bias' holds a value of magnitude 2e+03, above "
                                         "this site's bound max_weight_abs = 1000")
    assert hostile_model_reason(big, max_abs=1e4) is None


def test_a_model_far_from_the_site_own_update_is_no_aggregate_of_it():
    own = {"w": torch.randn(16, 16), "b": torch.randn(16)}
    honest = {k: v + 0.05 * torch.randn_like(v) for k, v in own.items()}
    assert shift_reason(honest, own) is None
    probe = {"w": 1e-3 * torch.randn(16, 16), "b": torch.full((16,), 4.0)}
    assert "'w' lies 1 times its norm from what this site sent last (at most 0.9" in \
        shift_reason(probe, own)


def test_a_round_that_gives_nan_is_refused_and_the_state_stays(tmp_path):
    rt = _runtime(tmp_path)
    weights = rt.trainer.shared_weights()
    sent, _, _ = rt.fit(weights, {"round": 1}, {})
    rt.save(1)
    before, _ = load_tensors(rt.state_path)
    # the site's own data turn NaN (a damaged file): training gives NaN everywhere
    rt.trainer.data = SiteData(*[(torch.full((8, 4), math.nan), torch.tensor([0, 1] * 4))] * 3)
    with pytest.raises(ValueError, match=r"Site UCLA: training in round 2 gave non-finite "
                                         r"values in \['net\.\d"):
        rt.fit(sent, {"round": 2}, {})
    assert rt.trainer.rounds_trained == 1
    after, meta = load_tensors(rt.state_path)
    assert meta["round"] == 1
    kept = rt.kept_state()
    for key, value in before.items():
        assert torch.equal(after[key], value) and torch.equal(kept[key], value), key


def test_the_site_file_decides_how_the_site_trains(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDBN_MED_SITES", str(tmp_path))
    spec = RunSpec(lr=1e-3, dropout=0.0, local_epochs=1)
    defaults = site_policy("UCLA").training
    assert defaults.apply(spec) == spec
    with pytest.raises(PermissionError, match=r"The site trains with lr from 1e-06 to 1 "
                                              r"\(\[training\] in its defaults\); the run "
                                              r"asks for lr = 1e-12"):
        defaults.apply(spec.replace(lr=1e-12))
    path = _write(tmp_path, '[training]\noptimizer = "adam"\nweight_decay = 1e-4\n'
                            "dropout = [0.3, 0.7]\nlocal_epochs = 2\nlr = [1e-4, 1e-2]\n")
    policy = site_policy("UCLA").training
    with pytest.raises(PermissionError, match=rf"dropout from 0.3 to 0.7 \(\[training\] in "
                                              rf"{path}\); the run asks for dropout = 0.0"):
        policy.apply(spec)
    mine = policy.apply(spec.replace(dropout=0.5, optimizer="sgd", weight_decay=0.0))
    assert (mine.lr, mine.dropout, mine.local_epochs) == (1e-3, 0.5, 2)
    assert (mine.settings.optimizer, mine.settings.weight_decay) == ("adam", 1e-4)
    assert policy.value("local_epochs", 50) == 2  # a train message's epochs: the site's


@pytest.mark.parametrize("text, message", [
    ("dp_clip = 5e-324\ndp_noise = 1.0\n", r"'dp_clip' must be from 1e-06 to 1e6"),
    ("dp_delta = 0.9999999\ndp_noise = 1.0\n", r"'dp_delta' must be above 0 and at most "
                                               r"0.001 \(well below 1/n"),
    ("[training]\nlr = [1e-2, 1e-4]\n", r"\[training\] lr must be a number from 1e-06 to 1, "
                                        r"or \[low, high\] within those"),
    ("[training]\nmomentum = 0.9\n", r"\[training\] has unknown keys \['momentum'\]"),
    ("max_model_shift = 0\n", r"'max_model_shift' must be a number above 0 and at most 2"),
])
def test_site_file_guard_values_are_range_checked(tmp_path, monkeypatch, text, message):
    from fedbn_med.tasks.abide.sites import load_site

    monkeypatch.setenv("FEDBN_MED_SITES", str(tmp_path))
    path = _write(tmp_path, text)
    with pytest.raises(ValueError, match=message) as err:
        site_policy("UCLA")
        load_site("UCLA", tmp_path)
    assert str(path) in str(err.value)


def test_colluders_weigh_at_most_their_registered_counts():
    claims = {"NYU": 10**9, "UM": 10**9, "UCLA": 100}
    # before: the cap measured against claims gave the colluders everything
    old = capped_weights(claims, 0.5)
    assert old["UCLA"] / sum(old.values()) < 1e-6
    registered = {"NYU": 50, "UM": 50, "UCLA": 100}
    new = site_weights(claims, "samples", 0.5, registered)
    assert new == {"NYU": 50, "UM": 50, "UCLA": 100}
    # a site claiming less than its registered count weighs its claim
    assert site_weights({**claims, "UCLA": 60}, "samples", None, registered)["UCLA"] == 60


def test_a_site_datalist_stays_inside_its_folder_unless_the_site_opts_out(tmp_path):
    import json

    from fedbn_med.tasks.imaging.datalist import load_datalist

    outside = tmp_path / "secret.nii.gz"
    outside.write_bytes(b"x")
    root = tmp_path / "site"
    root.mkdir()
    (root / "inside.nii.gz").write_bytes(b"x")
    (root / "link.nii.gz").symlink_to(outside)
    for bad in ("../secret.nii.gz", str(outside), "link.nii.gz"):
        path = root / "dl.json"
        path.write_text(json.dumps({"training": [{"image": "inside.nii.gz"},
                                                 {"image": bad}]}))
        with pytest.raises(ValueError, match=rf"Datalist {path}: its image .* lies outside the "
                                             rf"datalist's folder {root.resolve()} \(links "
                                             r"followed\).*datalist_outside_root = true"):
            load_datalist(path, outside_root=False)
        assert len(load_datalist(path)["training"]) + len(load_datalist(path)["test"]) >= 1


def test_a_reader_error_names_the_file_and_never_quotes_it(tmp_path, caplog):
    import logging
    import struct

    import nibabel as nib
    import numpy as np

    from fedbn_med.tasks.imaging.datalist import decode_items

    path = tmp_path / "a.nii"
    nib.save(nib.Nifti1Image(np.zeros((4, 4, 4), np.float32), np.eye(4)), path)
    raw = bytearray(path.read_bytes())
    raw[40:42] = struct.pack("<h", 9)  # dim[0] = 9: nibabel's HeaderDataError
    path.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING, logger="fedbn_med.tasks.imaging.datalist"):
        assert decode_items([{"image": str(path)}], ["image"], "X") == []
    (message,) = [r.getMessage() for r in caplog.records if r.name.endswith("datalist")]
    assert message == f"Site X: skipping {path}: unreadable file (HeaderDataError)"


def test_a_site_claims_only_its_own_abide_ids(tmp_path):
    from fedbn_med.tasks.abide.sites import load_site

    path = tmp_path / "UM.toml"
    path.write_text('abide_site_ids = ["UM_1", "UM_2"]\n')
    assert load_site("UM", tmp_path).abide_site_ids == ("UM_1", "UM_2")
    path.write_text('abide_site_ids = ["UM_1", "NYU"]\n')
    with pytest.raises(ValueError, match=rf"Site file {path}: site 'UM' claims ABIDE site ids "
                                         r"\['NYU'\], which are not its own"):
        load_site("UM", tmp_path)


def test_a_dp_delta_not_well_below_one_over_n_is_refused(tmp_path):
    from fedbn_med.federation.client_app import _check_delta
    from fedbn_med.fl.privacy import UpdatePrivacy

    rt = _runtime(tmp_path)  # 8 training examples
    rt.trainer.privacy = UpdatePrivacy(clip=1.0, noise=1.0, delta=1e-2)
    _check_delta(rt.trainer)
    rt.trainer.privacy = UpdatePrivacy(clip=1.0, noise=1.0, delta=0.05)
    with pytest.raises(PermissionError, match=r"Site UCLA refuses this run: its DP delta 0.05 "
                                              r"is not well below 1/n for its 8 training "
                                              r"examples \(it must be at most 0.013, a tenth"):
        _check_delta(rt.trainer)


def test_the_approval_command_prints_the_spec_and_the_hash_a_site_pins(tmp_path, capsys,
                                                                         monkeypatch):
    from fedbn_med.federation.approve import main

    spec = RunSpec(rounds=3, data_dir=tmp_path / "operator")
    path = tmp_path / "spec.json"
    path.write_text(spec.to_json())
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    assert '  rounds' in out and "3" in out and "operator" not in out  # the site's view
    digest = out.rsplit('approved_specs = ["', 1)[1][:64]
    # the same spec without the server's path is the same run to the site
    path.write_text(spec.replace(data_dir=None).to_json())
    main([str(path)])
    assert digest in capsys.readouterr().out
    path.write_text('{"rounds": 3, "unknown": 1}')
    assert main([str(path)]) == 2
    assert "Unknown run spec field(s) unknown" in capsys.readouterr().err
    monkeypatch.setenv("FEDBN_MED_SITES", str(tmp_path))
    _write(tmp_path, 'approved_specs = ["abc"]\n')
    with pytest.raises(ValueError, match=r"'approved_specs' must be a list of SHA-256 hashes"):
        site_policy("UCLA")
    _write(tmp_path, f'approved_specs = ["{digest}"]\n')
    assert site_policy("UCLA").approved_specs == (digest,)


def test_the_approval_command_prints_an_app_hash(tmp_path, capsys, monkeypatch):
    import hashlib

    from fedbn_med.federation.approve import main

    fab = tmp_path / "app.fab"
    fab.write_bytes(b"PK\x05\x06" + b"\0" * 18)
    assert main(["--fab", str(fab)]) == 0
    digest = hashlib.sha256(fab.read_bytes()).hexdigest()
    assert f'approved_apps = ["{digest}"]' in capsys.readouterr().out
    assert main(["--fab", str(tmp_path / "missing.fab")]) == 2
    monkeypatch.setenv("FEDBN_MED_SITES", str(tmp_path))
    _write(tmp_path, f'approved_apps = ["{digest}"]\n')
    assert site_policy("UCLA").approved_apps == (digest,)


def test_the_key_tool_registers_each_site_count(tmp_path, capsys):
    import importlib.util

    from fedbn_med.federation.consortium import read_registered_counts

    spec = importlib.util.spec_from_file_location(
        "consortium_keys", Path(__file__).parent.parent / "pipelines" / "consortium_keys.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.main(["--out", str(tmp_path / "k"), "--server-host", "127.0.0.1",
                      "--sites", "NYU,UM", "--counts", "NYU=120,UM=80"]) == 0
    assert read_registered_counts(tmp_path / "k") == {"NYU": 120, "UM": 80}
    assert tool.main(["--out", str(tmp_path / "k2"), "--server-host", "127.0.0.1",
                      "--sites", "NYU,UM", "--counts", "NYU=120"]) == 2
    assert "missing ['UM']" in capsys.readouterr().err
    (tmp_path / "k" / "counts.json").write_text('{"NYU": "root:x:0:0"}')
    with pytest.raises(ValueError, match=r"must map plain site names .* to whole numbers"):
        read_registered_counts(tmp_path / "k")
