"""User errors at the command line read like nilearn's: what was expected, given, valid."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fedbn_med.cli import main
from fedbn_med.tasks.abide.sites import load_site


def test_unknown_strategy_lists_the_valid_ones(capsys):
    assert main(["--strategy", "fedbm"]) == 2
    err = capsys.readouterr().err
    assert ("Unknown strategy 'fedbm'. Valid strategies: centralized, fedavg, fedavg_combat, "
            "fedavg_localbn, fedavg_sitez, fedbn, fedbn-scaffold, feddyn, fedprox, scaffold, "
            "silobn, singleset.") in err


@pytest.mark.parametrize("argv", [["--site", "UCLAA", "--superlink", "127.0.0.1:1"],
                                  ["--sites", "NYU,UCLAA"]])
def test_unknown_site_lists_the_valid_ones(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Unknown site 'UCLAA'. Valid sites:" in err and "NYU" in err and "UCLA" in err


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_rounds_must_be_a_positive_integer(value, capsys):
    with pytest.raises(SystemExit):
        main(["--rounds", value])
    assert "expected a positive integer" in capsys.readouterr().err


def test_server_beyond_this_host_needs_tls(capsys):
    assert main(["--serve", "--listen", "10.1.2.3:9092"]) == 2
    assert "without TLS" in capsys.readouterr().err


def test_site_needs_the_server_address(capsys):
    assert main(["--site", "UCLA"]) == 2
    assert "--site needs --superlink HOST:PORT" in capsys.readouterr().err


def test_broken_site_files_are_named(tmp_path):
    (tmp_path / "BAD.toml").write_text('name = "BAD"\nabide_site_ids = [\n')
    with pytest.raises(ValueError, match=r"BAD.toml is not valid TOML"):
        load_site("BAD", tmp_path)
    (tmp_path / "EMPTY.toml").write_text('name = "EMPTY"\nabide_site_ids = []\n')
    with pytest.raises(ValueError, match=r"'abide_site_ids' must be a non-empty list"):
        load_site("EMPTY", tmp_path)
    (tmp_path / "TYPO.toml").write_text('name = "TYPO"\nabide_site_ids = ["NYU"]\nsplit = 1\n')
    with pytest.raises(ValueError, match=r"unknown keys \['split'\]. Valid keys:"):
        load_site("TYPO", tmp_path)
    (tmp_path / "DEV.toml").write_text('abide_site_ids = ["NYU"]\ndevice = "tpu"\n')
    with pytest.raises(ValueError, match=r"'device' must be 'auto', 'cpu', 'cuda' or 'cuda:N'"):
        load_site("DEV", tmp_path)


def test_sites_dir_points_every_process_at_a_folder_of_ones_own(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDBN_MED_SITES", "unset-after-the-test")  # restored on teardown
    # an empty folder of site files: the default sites are then unknown, by name
    assert main(["--sites-dir", str(tmp_path), "--rounds", "1"]) == 2
    import os

    assert os.environ["FEDBN_MED_SITES"] == str(tmp_path)


def test_a_bad_core_count_is_refused_before_any_data_are_prepared(tmp_path, monkeypatch,
                                                                  capsys):
    monkeypatch.setenv("FEDBN_MED_CORES", "0")
    monkeypatch.setenv("FEDBN_MED_DATA", str(tmp_path / "data"))
    assert main(["--engine", "inprocess", "--rounds", "1"]) == 2
    assert "FEDBN_MED_CORES='0': expected a positive whole number" in capsys.readouterr().err
    assert not (tmp_path / "data").exists()  # no built-in cohort was made for a doomed run


def test_the_default_store_is_named_without_importing_mlflow(tmp_path, monkeypatch):
    # the CLI names the store on its main thread; MLflow loads on the tracking thread
    code = ("import sys; from fedbn_med.paths import default_tracking_uri; "
            "print(default_tracking_uri()); print('mlflow' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, check=True, timeout=120).stdout.split()
    assert out == [f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}", "False"]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///elsewhere.db")
    from fedbn_med.paths import default_tracking_uri

    assert default_tracking_uri() == "sqlite:///elsewhere.db"


def test_a_command_prints_warnings_but_not_a_librarys_debug_lines():
    # Flower's logger is at DEBUG: its SecAgg+ mod's stage lines reached a site's console
    code = ("import logging; from fedbn_med.cli import console_logging; console_logging(); "
            "flwr = logging.getLogger('flwr'); flwr.setLevel(logging.DEBUG); "
            "flwr.debug('stage 0 debug'); flwr.warning('a warning')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert "WARNING flwr: a warning" in done.stderr
    assert "stage 0 debug" not in done.stderr + done.stdout
