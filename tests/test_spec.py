"""The run spec: defaults in one place, validated once, carried as one JSON value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedbn_med.cli import build_parser
from fedbn_med.cli.parser import spec_from_args
from fedbn_med.federation.config import NodeSettings, ServerSettings, read_run_config, run_config
from fedbn_med.spec import RUN_CONFIG_KEY, RunSpec
from tests.fresh import modules_after


@pytest.mark.parametrize("task", ["abide", "mri", "xray"])
def test_round_trip_through_json_and_the_run_config(task, tmp_path):
    spec = RunSpec.for_task(task, rounds=7, strategy="fedprox", mu=0.05, seed=3,
                            data_dir=tmp_path)
    assert RunSpec.from_json(spec.to_json()) == spec
    server = ServerSettings(workdir=tmp_path, min_sites=2, federation_id="f-1")
    cfg = run_config(spec, server)
    assert list(cfg) == [RUN_CONFIG_KEY]
    assert read_run_config(cfg) == (spec, server)


def test_task_defaults_come_from_the_task():
    mri = RunSpec.for_task("mri")
    assert mri.sites == ("SiteA", "SiteB", "SiteC") and mri.lr == 1e-3
    assert mri.input_shape() == (1, 32, 32, 32)  # a 3D patch
    assert RunSpec.for_task("mri", image_size=16).input_shape() == (1, 16, 16, 16)
    assert RunSpec.for_task("mri", mode="2d", image_size=32).input_shape() == (1, 32, 32)
    assert RunSpec() == RunSpec.for_task("abide")
    assert RunSpec().input_shape() == (6105,)


def test_the_command_line_has_no_defaults_of_its_own():
    args = build_parser("abide").parse_args([])
    assert spec_from_args(args) == RunSpec()
    args = build_parser("xray").parse_args(["--rounds", "2",
                                            "--set", "subjects=12"])
    spec = spec_from_args(args)
    assert spec.rounds == 2 and spec.settings.subjects == 12 and spec.batch_size == 8


@pytest.mark.parametrize("changes, message", [
    ({"rounds": 0}, "rounds must be a positive integer, got 0"),
    ({"lr": float("nan")}, "lr must be a positive number"),
    ({"fold": 5}, r"fold must be in 0..4, got 5"),
    ({"strategy": "fedbm"}, "Unknown strategy 'fedbm'"),
    ({"sites": ("NYU", "NYU")}, "sites name a site twice"),
    ({"site_effect": -1.0}, "site_effect must be a finite number >= 0"),
    ({"cohort_scale": 0}, r"cohort_scale must lie in \(0, 5\], got 0"),
    ({"roundz": 3}, r"Unknown setting\(s\) roundz for task 'abide'"),
])
def test_bad_settings_are_refused_with_what_was_expected(changes, message):
    with pytest.raises(ValueError, match=message):
        RunSpec.for_task("abide", **changes)


def test_bad_json_is_refused_clearly(tmp_path):
    with pytest.raises(ValueError, match="not valid JSON"):
        RunSpec.from_json("{rounds: 3")
    with pytest.raises(ValueError, match=r"Unknown run spec field\(s\) extra"):
        RunSpec.from_json(json.dumps({**RunSpec().to_dict(), "extra": "x=1"}))
    with pytest.raises(ValueError, match="Unknown task 'ct'"):
        RunSpec.from_json(json.dumps({"task": "ct"}))
    with pytest.raises(ValueError, match=r"Unknown setting\(s\) image_size for task 'abide'"):
        RunSpec.from_json(json.dumps({"settings": {"image_size": 64}}))
    with pytest.raises(ValueError, match=f"no '{RUN_CONFIG_KEY}' entry"):
        read_run_config({"rounds": 3})
    with pytest.raises(ValueError, match=r"federation_id must be 1 to 64 letters, digits, "
                       r"'-' or '_' \(it names a folder at every site\), got '/etc/passwd'"):
        ServerSettings(workdir=tmp_path, federation_id="/etc/passwd")


def test_node_settings_round_trip(tmp_path):
    node = NodeSettings(site="UCLA", state_dir=tmp_path, data_dir=tmp_path / "d", device="cpu")
    assert NodeSettings.from_node_config(node.to_node_config()) == node
    with pytest.raises(ValueError, match=r"Unknown node setting field\(s\) colour"):
        NodeSettings.from_node_config({RUN_CONFIG_KEY: json.dumps(
            {"site": "UCLA", "state_dir": "x", "colour": "red"})})
    assert isinstance(node.state_dir, Path) and isinstance(node.data_dir, Path)


# -- the spec is light ---------------------------------------------------------------------
#: What a light module must not pull in (torch alone costs seconds to import).
HEAVY = ("torch", "monai", "flwr", "mlflow", "opacus")


@pytest.mark.parametrize("code", [
    "import fedbn_med.spec",
    "import fedbn_med.cli.argtypes",
    "from fedbn_med.spec import RunSpec\n"
    "for task in ('abide', 'mri', 'xray'):\n"
    "    RunSpec.for_task(task, strategy='fedprox').label",
])
def test_the_spec_and_the_argument_types_import_no_torch(code):
    assert modules_after(code, HEAVY) == []


def test_the_lightness_check_sees_torch_when_it_is_imported():
    assert modules_after("import fedbn_med.spec\nimport torch", HEAVY) == ["torch"]
