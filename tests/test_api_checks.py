"""check_task: the built-in tasks pass the checks an outside task is held to."""

from __future__ import annotations

import dataclasses

import pytest
from torch import nn

import fedbn_med as fb
from fedbn_med import tasks

ALL = ["registered", "contract", "spec", "server_model", "build_sites", "one_round"]


def test_a_built_in_imaging_task_passes_every_check() -> None:
    assert fb.check_task("xray", subjects=8, image_size=32, batch_size=4) == ALL


def test_a_model_without_normalisation_layers_fails_by_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tasks, "_TASKS", dict(tasks._TASKS))
    plain = dataclasses.replace(fb.get_task("xray"), name="xray_plain",
                                settings="fedbn_med.tasks.xray.settings",
                                build_server_model=lambda spec, shape: nn.Linear(4, 2))
    fb.register_task(plain)
    with pytest.raises(fb.TaskCheckError, match=r"check 'server_model' failed: the model has "
                                                r"no normalisation layer a site could keep"):
        fb.check_task("xray_plain", subjects=8, image_size=32)
    with pytest.raises(fb.TaskCheckError, match=r"check 'registered' failed: .*Unknown task"):
        fb.check_task("nope")
