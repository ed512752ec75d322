"""The checks on a round's replies, and the packing of tensors into Flower records."""

from __future__ import annotations

import pytest
import torch
from flwr.app import RecordDict

from fedbn_med.federation.records import pack, unpack
from fedbn_med.fl.reply_checks import check_reply

EXPECTED = {"w": torch.zeros(3, 2), "b": torch.zeros(2)}


def test_sound_update_passes():
    assert check_reply({"w": torch.ones(3, 2), "b": torch.ones(2)}, EXPECTED, ()) is None


@pytest.mark.parametrize("update, reason", [
    ({"w": torch.full((3, 2), float("nan")), "b": torch.ones(2)}, "'w' holds NaN or Inf"),
    ({"w": torch.full((3, 2), float("inf")), "b": torch.ones(2)}, "'w' holds NaN or Inf"),
    ({"w": torch.ones(2, 3), "b": torch.ones(2)}, r"'w' has shape \(2, 3\), expected \(3, 2\)"),
    ({"w": torch.ones(3, 2)}, r"missing \['b'\]"),
    ({"w": torch.ones(3, 2), "b": torch.ones(2), "x": torch.ones(1)}, r"unexpected \['x'\]"),
    ({"w": torch.ones(3, 2), "b": torch.ones(2), "bn.running_mean": torch.ones(2)},
     "site-private keys"),
])
def test_bad_updates_are_refused_with_a_reason(update, reason):
    got = check_reply(update, EXPECTED, {"bn.running_mean"})
    assert got is not None
    import re
    assert re.search(reason, got), got


def test_pack_round_trip_keeps_names_shapes_dtypes_and_sections():
    tensors = {"conv.weight": torch.randn(4, 1, 3, 3), "fc.bias": torch.randn(7),
               "bn.num_batches_tracked": torch.tensor(12), "scalar": torch.tensor(1.5)}
    content = pack(tensors, config={"round": 3, "evaluate-first": True},
                   metrics={"train_loss": 0.25})
    # One record, so Flower moves three objects per message (message, dict, record).
    assert list(content.keys()) == ["payload"]
    assert len(content.array_records) == 0 and len(content.metric_records) == 0
    payload = unpack(content)
    assert set(payload.tensors) == set(tensors)
    for key, value in tensors.items():
        assert payload.tensors[key].shape == value.shape
        assert torch.equal(payload.tensors[key].to(value.dtype), value)
    assert payload.section("config") == {"round": 3, "evaluate-first": True}
    assert payload.floats("metrics") == {"train_loss": 0.25}
    assert payload.section("absent") == {}
    assert unpack(pack()).tensors == {}


def test_packed_tensor_bytes_are_the_plain_float32_bytes():
    # The privacy test looks for a tensor's bytes in the traffic: they must appear as is.
    w = torch.randn(5)
    blob = pack({"w": w}).config_records["payload"]["tensors/float"]
    assert w.numpy().astype("<f4").tobytes() in blob


def test_unpack_refuses_a_layout_that_does_not_fit():
    content = pack({"w": torch.randn(6)})
    content["payload"]["tensors/dims"] = [7]
    with pytest.raises(ValueError, match="carries 6 float values but its layout describes 7"):
        unpack(content)
    content["payload"]["tensors/float"] = b"abc"
    with pytest.raises(ValueError, match="malformed"):
        unpack(content)
    with pytest.raises(ValueError, match="no 'payload' record"):
        unpack(RecordDict())


@pytest.mark.parametrize("meta, message", [
    ({"round": "abc"}, "'round' must be the number of rounds completed, a whole number "
                       "from 0, got 'abc'"),
    ({"round": -2}, "got -2"),
    ({}, "got None"),
    ({"round": 3, "norm_reference": float("nan")}, "'norm_reference' must be a finite number"),
])
def test_a_damaged_checkpoint_names_itself_and_the_value(tmp_path, meta, message):
    from fedbn_med.federation.server.recorder import resume_point

    path = tmp_path / "global.safetensors"
    with pytest.raises(ValueError, match="Checkpoint .*global.safetensors") as err:
        resume_point(meta, path)
    assert message in str(err.value)
    assert resume_point({"round": 3, "norm_reference": 0.01}, path) == (3, 0.01)
