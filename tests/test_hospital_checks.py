"""What the server refuses from a site, without processes: the rules the attack tests rely on."""

from __future__ import annotations

import math

import pytest
import torch

from fedbn_med.federation.config import ServerSettings
from fedbn_med.federation.server.checks import metrics_reason
from fedbn_med.fl.registry import get_strategy
from fedbn_med.fl.reply_checks import num_examples_reason
from fedbn_med.fl.rounds import Reply, close_round


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, -5, 0, 2.5, 10**12, "7"])
def test_bad_example_counts_are_refused(value):
    assert "num-examples" in num_examples_reason(value)


def test_metric_names_mlflow_refuses_are_refused():
    assert metrics_reason({"eval": {"test_accuracy": 0.5, "val_loss": 1.0}}) is None
    assert "names a metric" in metrics_reason({"eval": {"bad name!": 1.0}})
    assert "names a metric" in metrics_reason({"metrics": {"x" * 300: 1.0}})


def test_with_two_sites_a_huge_update_is_refused_every_round():
    weights = {"w": torch.zeros(10)}
    strategy = get_strategy("fedavg")
    for _ in range(5):
        honest = {"w": weights["w"] + 0.02}
        bad = {"w": weights["w"] + 10.0}  # 500x the honest update's norm
        for replies in ([Reply("NYU", honest, 10), Reply("UCLA", bad, 10)],
                        [Reply("UCLA", bad, 10), Reply("NYU", honest, 10)]):
            outcome = close_round(strategy, weights, replies)
            assert outcome.accepted == ["NYU"] and "UCLA" in outcome.refused
        weights = outcome.global_weights


def test_by_default_a_round_needs_a_majority_of_the_sites():
    settings = ServerSettings(workdir="w")
    assert [settings.needed(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]
    assert ServerSettings(workdir="w", min_sites=1).needed(4) == 1


def test_site_names_are_plain_and_match_their_file(tmp_path, monkeypatch):
    from fedbn_med.tasks.abide.sites import load_site

    (tmp_path / "UCLA.toml").write_text('name = "NYU"\nabide_site_ids = ["UCLA_1"]\n')
    with pytest.raises(ValueError, match="must match"):
        load_site("UCLA", tmp_path)
    with pytest.raises(ValueError, match="letters, digits"):
        load_site("../elsewhere/evil", tmp_path)


def test_private_keys_are_never_readable_by_others(tmp_path):
    import os

    from fedbn_med.federation.consortium import create_consortium

    old = os.umask(0)  # the most permissive umask: the files must still be 0600
    try:
        files = create_consortium(tmp_path / "keys", ["fl.example"], ["NYU"])
    finally:
        os.umask(old)
    for path in (files.ca_key, files.server_key, files.site_keys["NYU"][0]):
        assert path.stat().st_mode & 0o777 == 0o600


def test_the_server_settings_take_a_start_time_and_refuse_a_bad_one(tmp_path) -> None:
    from fedbn_med.federation.config import ServerSettings

    settings = ServerSettings(workdir=tmp_path, started_ms=1_700_000_000_000)
    assert ServerSettings.from_dict(settings.to_dict()).started_ms == 1_700_000_000_000
    for bad in (-1, 1.5, True, "now"):
        with pytest.raises(ValueError, match=r"started_ms must be a whole number >= 0 "
                                             r"\(milliseconds since the epoch\)"):
            ServerSettings(workdir=tmp_path, started_ms=bad)
