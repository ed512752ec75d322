"""The host of Flower's commands: one real host process, its shims, hostile callers.

The federations of the other integration tests run every ServerApp, SuperExec, ``flwr
run`` and key registration through a host; here the host is started alone, as the
launcher starts it, and spoken to as a caller would.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from fedbn_med.federation.launcher import LocalFederation, apphost_client
from fedbn_med.federation.launcher.processes import FederationError, terminate_tree

pytestmark = pytest.mark.integration


def _start_host(folder: Path) -> subprocess.Popen:
    sock = folder / "s.sock"
    with open(folder / "host.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "fedbn_med.federation.launcher.apphost",
                                 "--socket", str(sock)], stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    deadline = time.monotonic() + 120
    while not sock.exists():
        assert proc.poll() is None, (folder / "host.log").read_text()
        assert time.monotonic() < deadline, "the host did not open its socket"
        time.sleep(0.1)
    return proc


@pytest.fixture(scope="module")
def host():
    folder = Path(tempfile.mkdtemp(prefix="fedbn-apphost-test-"))  # private, under /tmp
    proc = _start_host(folder)
    yield {"proc": proc, "socket": folder / "s.sock", "folder": folder,
           "log": folder / "host.log"}
    terminate_tree(proc.pid, signal.SIGTERM, 10.0)
    shutil.rmtree(folder, ignore_errors=True)


def _a_run_in_progress(tmp_path: Path, sock: Path, host: subprocess.Popen
                       ) -> tuple[subprocess.Popen, set[int]]:
    """Start a ServerApp whose runtime API never answers (it keeps trying); return its shim
    and the PIDs the host forked for it."""
    before = {p.pid for p in psutil.Process(host.pid).children()}
    shim = subprocess.Popen([str(_write(tmp_path, sock, "/bin/false")),
                             "--runtime-api-address", "127.0.0.1:9", "--token", "t",
                             "--insecure"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    forked: set[int] = set()
    while not forked:
        assert time.monotonic() < deadline, "the host forked nothing"
        time.sleep(0.1)
        forked = {p.pid for p in psutil.Process(host.pid).children()} - before
    return shim, forked


def _ask(sock: Path, payload: bytes, fds: list[int]) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(30)
        conn.connect(str(sock))
        if fds:
            socket.send_fds(conn, [payload], fds)
        else:
            conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)
        return conn.makefile("rb").readline()


def _framed(request: object) -> bytes:
    body = json.dumps(request).encode()
    return len(body).to_bytes(4, "big") + body


@pytest.mark.parametrize("payload, fds, reason", [
    (b"\x00\x00\x00\x02{}", 3, "tool, argv, env and cwd"),
    (b"\xff\xff\xff\xff", 3, "at most 1048576 are read"),
    (b"\x00\x00\x10\x00{", 3, "ended after 1 of 4096 bytes"),
    (_framed({"tool": "flwr", "argv": ["x"], "env": {}, "cwd": "/"}), 1,
     "expected 3 descriptors"),
    (_framed({"tool": "flwr", "argv": [1], "env": {}, "cwd": "/"}), 3,
     "argv must be a list of strings"),
    (_framed({"tool": "flwr", "argv": [], "env": {"A=B": "c"}, "cwd": "/"}), 3,
     "env must map names"),
    (_framed({"tool": "flwr", "argv": [], "env": {}, "cwd": "/no/such/folder"}), 3,
     "is not a folder"),
    (_framed({"tool": "/bin/sh", "argv": [], "env": {}, "cwd": "/"}), 3,
     "tool must be one of flower-superlink, flwr-serverapp, flower-superexec, flwr"),
    (_framed({"tool": "flwr", "argv": [], "env": {}, "cwd": "/", "more": 1}), 3,
     "tool, argv, env and cwd"),
    (_framed({"stop": "g", "signal": [15]}), 0, "one of the signals"),
    (_framed({"stop": "g", "signal": 15.0}), 0, "one of the signals"),
])
def test_a_malformed_request_is_refused_and_the_host_serves_on(host, payload, fds, reason):
    before = psutil.Process(host["proc"].pid).children()
    answer = _ask(host["socket"], payload, [0, 1, 2][:fds])
    assert answer.startswith(b"refused: ") and reason.encode() in answer, answer
    assert host["proc"].poll() is None
    assert psutil.Process(host["proc"].pid).children() == before  # nothing was forked


def _write(tmp_path: Path, sock: Path, real: str, tool: str = "flwr-serverapp") -> Path:
    folder = apphost_client.write_shims(tmp_path / "bin", sock, {tool: real})
    assert folder.stat().st_mode & 0o777 == 0o700
    return folder / tool


def _shim(tmp_path: Path, sock: Path, real: str, *args: str, tool: str = "flwr-serverapp",
          env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(_write(tmp_path, sock, real, tool)), *args], env=env,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          check=False)


def test_the_shim_hands_the_run_to_the_host_with_its_streams_and_exit_code(host, tmp_path):
    # Flower's own entry point runs in the forked process: a bad option is its usage
    # error, on the caller's stderr, with its exit code.
    done = _shim(tmp_path, host["socket"], "/bin/false", "--token", "t", "--no-such-option")
    assert done.returncode == 2, done.stderr
    assert "flwr-serverapp: error: unrecognized arguments: --no-such-option" in done.stderr
    assert "ServerApp host: forked process" in host["log"].read_text()


def test_flowers_cli_runs_in_the_host_with_the_callers_flwr_home(host, tmp_path):
    # flwr reads its connections from $FLWR_HOME/config.toml as it runs, not as the host
    # loaded it: the forked process has the caller's environment.
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text('[superlink]\ndefault = "x"\n\n[superlink.x]\n'
                                      'address = "127.0.0.1:9"\ninsecure = true\n')
    log = host["log"].read_text()
    done = _shim(tmp_path, host["socket"], "/bin/false", "config", "list", "--format",
                 "json", tool="flwr", env={**os.environ, "FLWR_HOME": str(home)})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"superlink": ["x"], "default": "x"}, done.stdout
    assert host["log"].read_text().count("forked process") == log.count("forked process") + 1
    with pytest.raises(ValueError, match="not 'flwr-clientapp'"):
        apphost_client.write_shims(tmp_path / "bin2", host["socket"], {"flwr-clientapp": "x"})


def test_a_killed_caller_takes_its_forked_process_with_it(host, tmp_path):
    shim, forked = _a_run_in_progress(tmp_path, host["socket"], host["proc"])
    time.sleep(1.0)
    assert forked <= {p.pid for p in psutil.Process(host["proc"].pid).children()}  # it runs
    shim.kill()  # SIGKILL: nothing is forwarded
    shim.wait(timeout=30)
    deadline = time.monotonic() + 30
    while forked & {p.pid for p in psutil.Process(host["proc"].pid).children()}:
        assert time.monotonic() < deadline, "the forked process outlived its caller"
        time.sleep(0.1)


def test_a_stopped_host_ends_what_it_forked_before_it_ends(tmp_path):
    folder = Path(tempfile.mkdtemp(prefix="fedbn-apphost-test-"))
    proc = _start_host(folder)
    try:
        shim, forked = _a_run_in_progress(tmp_path, folder / "s.sock", proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, (folder / "host.log").read_text()
        assert not any(psutil.pid_exists(pid) for pid in forked)  # ended and reaped
        shim.wait(timeout=30)  # the run's caller learns that it ended (or this raises)
    finally:
        terminate_tree(proc.pid, signal.SIGKILL, 5.0)
        shutil.rmtree(folder, ignore_errors=True)


def test_without_a_host_the_shim_runs_flowers_own_command(tmp_path):
    echo = tmp_path / "real"
    echo.write_text('#!/bin/sh\necho "real $*"\n')
    echo.chmod(0o700)
    done = _shim(tmp_path, tmp_path / "no-host.sock", str(echo), "--token", "t")
    assert done.returncode == 0 and done.stdout == "real --token t\n", done


def test_a_refusing_host_leaves_the_run_to_flowers_own_command(tmp_path):
    folder = tmp_path / "h"
    folder.mkdir(mode=0o700)
    sock = folder / "s.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(sock))
        server.listen(1)
        shim = subprocess.Popen([str(_write(tmp_path, sock, "/bin/echo")), "x"],
                                stdout=subprocess.PIPE, text=True)
        conn, _ = server.accept()
        with conn:
            conn.sendall(b"refused: busy\n")
        out, _ = shim.communicate(timeout=60)
    assert shim.returncode == 0 and out == "x\n"


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/python3").exists(),
                    reason="switching to another user needs root (and a system Python)")
def test_a_host_of_another_user_gets_nothing_and_flowers_own_command_runs(tmp_path):
    # The shim checks who listens before it sends its environment and streams.
    folder = Path(tempfile.mkdtemp(prefix="fedbn-apphost-test-"))
    folder.chmod(0o777)
    listen = ("import socket, sys; s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); "
              "s.listen(1); print('ready', flush=True); c, _ = s.accept(); "
              "print(len(c.recv(65536)), flush=True)")
    other = subprocess.Popen(["/usr/bin/python3", "-c", listen, str(folder / "s.sock")],
                             user=65534, group=65534, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout is not None and other.stdout.readline() == "ready\n"
        done = _shim(tmp_path, folder / "s.sock", "/bin/echo", "x")
        assert done.returncode == 0 and done.stdout == "x\n", done
        assert "the host is another user's" in done.stderr
        assert other.communicate(timeout=30)[0].strip() == "0"  # it got no byte
    finally:
        other.kill()
        shutil.rmtree(folder, ignore_errors=True)


def test_the_host_will_not_listen_in_a_folder_others_may_enter(tmp_path):
    folder = tmp_path / "open"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    done = subprocess.run([sys.executable, "-m", "fedbn_med.federation.launcher.apphost",
                           "--socket", str(folder / "s.sock")], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 2 and "must be private (mode 0700)" in done.stderr
    assert not (folder / "s.sock").exists()



def test_a_stop_request_ends_the_runs_of_its_federation_only(host, tmp_path):
    # A ServerApp whose runtime API never answers keeps trying: a run in progress.
    shim = _write(tmp_path, host["socket"], "/bin/false")
    homes = [tmp_path / "fed-a", tmp_path / "fed-b"]
    before = {p.pid for p in psutil.Process(host["proc"].pid).children()}
    runs = [subprocess.Popen([str(shim), "--runtime-api-address", "127.0.0.1:9", "--token",
                              "t", "--insecure"], env={**os.environ, "FLWR_HOME": str(h)},
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for h in homes]
    deadline = time.monotonic() + 60
    while len({p.pid for p in psutil.Process(host["proc"].pid).children()} - before) < 2:
        assert time.monotonic() < deadline, host["log"].read_text()
        time.sleep(0.1)
    with pytest.raises(RuntimeError, match="one of the signals"):
        apphost_client.stop_runs(host["socket"], str(homes[0]), sig=signal.SIGUSR1)
    assert apphost_client.stop_runs(host["socket"], str(tmp_path / "no-such-fed")) == 0
    assert apphost_client.stop_runs(host["socket"], str(homes[0]), sig=signal.SIGKILL) == 1
    assert runs[0].wait(timeout=30) != 0  # killed: no exit code came
    assert runs[1].poll() is None  # the other federation's run goes on
    assert apphost_client.stop_runs(host["socket"], str(homes[1])) == 1
    runs[1].wait(timeout=30)  # it ends (or this raises)
    assert apphost_client.stop_runs(tmp_path / "gone.sock", str(homes[1])) == 0  # no host: none


@pytest.mark.skipif(os.environ.get(apphost_client.ENV_VAR) == "off", reason="host off")
def test_this_sessions_federations_share_one_host():
    # conftest starts it for the federations of each test worker, and of the commands
    # its tests run (they inherit the variable)
    socket_path = apphost_client.shared()
    assert socket_path is not None and socket_path.is_socket()
    assert socket_path.parent.stat().st_mode & 0o777 == 0o700
    assert os.environ[apphost_client.ENV_VAR] == str(socket_path)


def test_a_host_setting_that_is_no_socket_is_refused_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv(apphost_client.ENV_VAR, str(tmp_path / "nope.sock"))
    with pytest.raises(FederationError, match=r"FEDBN_MED_SERVERAPP_HOST='.*nope\.sock': "
                                              r"expected 'off' or the socket of a running"):
        LocalFederation(tmp_path / "fed")


@pytest.mark.parametrize("change", [{"PYTHONPATH": "/elsewhere"}, {"OMP_NUM_THREADS": "7"},
                                    {"FEDBN_MED_NUMERICS": "native"}])
def test_a_run_that_would_start_otherwise_is_left_to_flowers_own_command(host, tmp_path,
                                                                        change):
    # an import path, a thread pool or a numeric code path the host did not start with:
    # only a fresh process has them
    real = tmp_path / "real"
    real.write_text('#!/bin/sh\necho "fresh $*"\n')
    real.chmod(0o700)
    shim = _write(tmp_path, host["socket"], str(real))
    done = subprocess.run([str(shim), "--token", "t"], env={**os.environ, **change},
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and done.stdout == "fresh --token t\n", done
    assert f"the run starts with other {next(iter(change))}" in done.stderr


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/python3").exists(),
                    reason="switching to another user needs root (and a system Python)")
def test_another_user_is_refused_even_where_the_folder_would_let_it_in(host):
    # The folder (0700) keeps other users out; opened up on purpose, the host still
    # answers only its own user (the socket's peer credentials).
    client = ("import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]);"
              " print(s.makefile('rb').readline().decode().strip())")
    as_nobody = {"user": 65534, "group": 65534, "capture_output": True, "text": True,
                 "timeout": 60, "check": False}
    python = "/usr/bin/python3"  # the standard library only, readable by every user
    shut_out = subprocess.run([python, "-c", client, str(host["socket"])], **as_nobody)
    assert shut_out.returncode != 0 and "Permission denied" in shut_out.stderr
    mode = host["folder"].stat().st_mode & 0o777
    try:
        host["folder"].chmod(0o711)
        host["socket"].chmod(0o666)
        let_in = subprocess.run([python, "-c", client, str(host["socket"])], **as_nobody)
    finally:
        host["folder"].chmod(mode)
        host["socket"].chmod(0o600)
    assert let_in.stdout.strip() == "refused: another user", let_in


def _listener(port: int) -> psutil.Process:
    found = [c.pid for c in psutil.net_connections(kind="tcp")
             if c.status == psutil.CONN_LISTEN and c.laddr.port == port and c.pid]
    assert len(set(found)) == 1, found
    return psutil.Process(found[0])


@pytest.mark.parametrize("shared", [True, False], ids=["shared host", "own host"])
def test_the_superlink_is_forked_from_the_host_and_stops_with_the_federation(
        tmp_path, monkeypatch, shared):
    if not shared:
        monkeypatch.delenv(apphost_client.ENV_VAR, raising=False)
    elif apphost_client.shared() is None:
        pytest.skip("no shared host in this session")
    with LocalFederation(tmp_path / "fed") as fed:
        fed.start_superlink()
        superlink = _listener(fed.port)
        assert superlink.pid != fed.processes["superlink"].pid  # that is the shim
        assert "launcher.apphost" in " ".join(superlink.parent().cmdline())
        assert ("serverapp-host" in fed.processes) is not shared
    assert not superlink.is_running() or superlink.status() == psutil.STATUS_ZOMBIE
