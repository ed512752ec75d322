"""Every command in the README and the deployment guide works as written.

The commands are read from the ``bash`` blocks of the pages themselves, so a command
changed in the code but not in the docs (or the reverse) fails here:

- every ``python pipelines/...`` command is parsed by that pipeline's real parser;
- the README's hospital-mode rehearsal runs exactly as written, from a folder of its own
  (relative paths included): the key tool, the server and both sites on 127.0.0.1, then
  the onboarding command with the run folder the server printed;
- the README's main job runs exactly as written;
- the set-up commands (``pip``, ``venv``) are what ``.ci/run`` runs on a fresh machine;
  here their extras are checked to exist.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from fedbn_med.federation.launcher.processes import terminate_tree
from fedbn_med.fl.partition import partition_model
from fedbn_med.spec import RunSpec
from fedbn_med.tasks.abide.build import build_model

ROOT = Path(__file__).resolve().parent.parent
PAGES = (ROOT / "README.md", ROOT / "docs" / "deployment.md")
_BLOCK = re.compile(r"```bash\n(.*?)```", re.DOTALL)
#: The first words of the commands the docs may show, and how each is checked.
SET_UP = ("pip install", "python3 -m venv", ". .venv/bin/activate", "mkdocs serve",
          "python -m pytest")


def commands(page: Path) -> list[str]:
    """Return the commands of a page's bash blocks: continuations joined, comments cut."""
    out = []
    for block in _BLOCK.findall(page.read_text(encoding="utf-8")):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith("#") or not line:
                continue
            out.extend(part.strip() for part in line.split("&&"))
    return out


def _parser(script: str):
    from fedbn_med.cli import keys, onboard
    from fedbn_med.cli.parser import build_parser

    tasks = {"abide_fedbn": "abide", "mri_fedbn": "mri", "xray_fedbn": "xray",
             "histo_fedbn": "histo"}
    if script in tasks:
        return build_parser(tasks[script])
    return {"onboard_site": onboard.build_parser(),
            "consortium_keys": keys.build_parser()}[script]


def _argv(command: str) -> list[str]:
    """Return a command's words, with this test's interpreter for ``python``."""
    words = shlex.split(command)
    return [sys.executable, *words[1:]] if words[0] == "python" else words


def _run_env(tmp: Path) -> dict[str, str]:
    return {**os.environ, "FEDBN_MED_DATA": str(tmp / "data"), "OMP_NUM_THREADS": "1",
            "MLFLOW_TRACKING_URI": f"sqlite:///{tmp / 'mlflow.db'}", "COLUMNS": "100"}


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One user's folder for the README's commands, as a user runs them one after another.

    ``pipelines/`` is the checkout's; the built-in data (``FEDBN_MED_DATA``) and the MLflow
    store are the folder's own, so the first command that needs the data generates it and
    the next ones find it, as on a user's machine.
    """
    folder = tmp_path_factory.mktemp("readme_user")
    (folder / "pipelines").symlink_to(ROOT / "pipelines")
    return folder


def test_every_docs_command_is_known_and_parses() -> None:
    seen = 0
    for page in PAGES:
        for command in commands(page):
            if command.startswith(SET_UP):
                continue
            words = shlex.split(command)
            assert words[:2] and words[0] == "python" and words[1].startswith("pipelines/"), \
                f"{page.name}: a command no test checks: {command}"
            script = Path(words[1]).stem
            assert (ROOT / words[1]).is_file(), f"{page.name}: no such pipeline: {command}"
            try:
                _parser(script).parse_args(words[2:])
            except SystemExit as stop:  # --help exits 0; a bad option exits 2
                assert stop.code == 0, f"{page.name}: the parser refuses: {command}"
            seen += 1
    assert seen >= 15


def test_the_set_up_commands_name_extras_that_exist() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    for page in PAGES:
        for command in commands(page):
            for extra in re.findall(r'"\.\[(\w+)\]"', command):
                assert extra in extras, f"{page.name}: no extra [{extra}]: {command}"
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install -q -e ".[test]" && python -m pytest' in ci
    assert 'pip install -e ".[test]" && python -m pytest' in (ROOT / "README.md").read_text()


def _readme(prefix: str) -> list[str]:
    found = [c for c in commands(ROOT / "README.md") if c.startswith(prefix)]
    assert found, f"the README has no command starting {prefix!r}"
    return found


@pytest.mark.integration
def test_the_readme_hospital_rehearsal_runs_as_written(home: Path) -> None:
    """Keys, a server, two sites and onboarding: the README's own commands, in order."""
    env = _run_env(home)
    keys = _readme("python pipelines/consortium_keys.py")[0]
    done = subprocess.run(_argv(keys), cwd=home, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (home / "keys" / ".gitignore").is_file()

    server_cmd = next(c for c in _readme("python pipelines/abide_fedbn.py --serve"))
    site_cmds = _readme("python pipelines/abide_fedbn.py --site")
    assert len(site_cmds) == 2
    logs = {name: open(home / f"{name}.log", "wb")  # noqa: SIM115 - closed below
            for name in ("server", "site0", "site1")}
    server = subprocess.Popen(_argv(server_cmd), cwd=home, env=env,
                              stdout=logs["server"], stderr=subprocess.STDOUT,
                              start_new_session=True)
    sites = [subprocess.Popen(_argv(cmd), cwd=home, env=env,
                              stdout=logs[f"site{i}"], stderr=subprocess.STDOUT,
                              start_new_session=True) for i, cmd in enumerate(site_cmds)]
    try:
        assert server.wait(timeout=500) == 0, (home / "server.log").read_text()[-3000:]
        for i, proc in enumerate(sites):  # each site exits 0 once the federation ends
            assert proc.wait(timeout=60) == 0, (home / f"site{i}.log").read_text()
    finally:
        for proc in [*sites, server]:
            terminate_tree(proc.pid, signal.SIGTERM, 10.0)
        for handle in logs.values():
            handle.close()
    said = (home / "server.log").read_text()
    run_folder = re.search(r"^Run folder: +(\S+)$", said, re.MULTILINE)
    assert run_folder, said[-2000:]
    assert "then open http://127.0.0.1:5000/#/experiments/" in said
    assert (Path(run_folder.group(1)) / "server" / "global.safetensors").is_file()
    private = partition_model(build_model(16, RunSpec.for_task("abide"))).private
    for i, site in enumerate(("NYU", "UM")):
        log = (home / f"site{i}.log").read_text()
        assert f"[{site}] joined the federation at 127.0.0.1:9092" in log
        assert re.search(rf"\[{site}\] round 1: trained; sent \d+ tensors \([\d.]+ KiB\)", log)
        assert f"[{site}] the federation has ended" in log
        sent = [line.split("tensors sent: ", 1)[1].split(", ")
                for line in log.splitlines() if "tensors sent: " in line]
        assert sent and not set(sent[0]) & set(private), "a BN layer was announced as sent"
        # each site keeps its state in its own folder by default
        assert list((home / "data" / "site_state" / site).rglob(f"{site}*.safetensors"))

    onboard = _readme("python pipelines/onboard_site.py")[0].replace(
        "RUN_FOLDER", run_folder.group(1))
    done = subprocess.run(_argv(onboard), cwd=home, env=env, capture_output=True,
                          text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| (")]
    assert [row[2:5] for row in rows[:2]] == ["(b)", "(c)"], done.stdout[-2000:]


@pytest.mark.integration
def test_the_readme_main_job_runs_as_written(home: Path) -> None:
    command = next(c for c in _readme("python pipelines/abide_fedbn.py") if c ==
                   "python pipelines/abide_fedbn.py")
    done = subprocess.run(_argv(command), cwd=home, env=_run_env(home),
                          capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Preparing the data of NYU, UM, USM, UCLA" in done.stdout
    assert re.search(r"^fedbn: round \d+ of 100, selected on validation", done.stdout,
                     re.MULTILINE), done.stdout[-2000:]
    assert "| mean |" in done.stdout and "then open http://127.0.0.1:5000/" in done.stdout


def test_a_command_the_docs_would_show_wrongly_is_caught(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```bash\npython pipelines/abide_fedbn.py --roundz 5 \\\n  --sites NYU\n```\n")
    (command,) = commands(page)
    assert command == "python pipelines/abide_fedbn.py --roundz 5    --sites NYU"
    with pytest.raises(SystemExit):
        _parser("abide_fedbn").parse_args(shlex.split(command)[2:])
