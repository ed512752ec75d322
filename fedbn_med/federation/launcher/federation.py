"""A federation's processes on this host: a SuperLink, its public port, site nodes, runs.

:class:`LocalFederation` says what to start and in which order; a
:class:`~fedbn_med.federation.launcher.supervisor.Supervisor` owns every process it
starts (SuperLink, gate, site host, site nodes, the ServerApp host, the ``flwr run``
client) and stops them all on exit, on error and on Ctrl-C, children included; should
this process die without doing so (SIGKILL), its watchdog
(:mod:`fedbn_med.federation.launcher.watchdog`) does.
Servers bind 127.0.0.1 unless a caller passes another host explicitly. Readiness,
progress and exits come as typed events (:mod:`fedbn_med.federation.events`): the
sites' on pipes (:mod:`.sitehost_client`), the run's in its ``progress.jsonl``
(:mod:`.progress`).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import fedbn_med.federation.launcher.flower_cli as flower_cli
from fedbn_med.federation.config import NodeSettings, seal_run_config
from fedbn_med.federation.events import Event, HostReady
from fedbn_med.federation.launcher import apphost_client, fleet_gate
from fedbn_med.federation.launcher.flower_cli import TlsFiles
from fedbn_med.federation.launcher.processes import (
    EventReader,
    FederationError,
    ForkedSite,
    SiteStatus,
    free_port,
    port_taken,
)
from fedbn_med.federation.launcher.progress import SubmittedRun, follow
from fedbn_med.federation.launcher.sitehost_client import SiteHostClient
from fedbn_med.federation.launcher.supervisor import Child, Supervisor
from fedbn_med.federation.telemetry import telemetry_off
from fedbn_med.spec import RUN_CONFIG_KEY

__all__ = ["LocalFederation"]

_SERVERS = ("site-host", "gate", "superlink")  # stopped last, in this order
#: ``off``: Flower starts its commands itself; a host's socket: share it (:mod:`.apphost`).
APPHOST_ENV_VAR = apphost_client.ENV_VAR


class LocalFederation:
    """A SuperLink, site nodes and runs, as child processes of this one.

    Parameters
    ----------
    workdir : path
        Where logs, Flower's home, checkpoints and results go.
    host : str
        Address the SuperLink binds (127.0.0.1 unless asked otherwise).
    port : int, optional
        Port of the SuperLink (free port when omitted).
    tls : TlsFiles, optional
        Serve the Fleet and Control APIs over TLS with these files.
    node_auth : bool
        Admit only site nodes whose public key was registered.
    prefix : sequence of str
        Run the server's processes (SuperLink, gate, runs, key registration) under this
        command prefix, such as ``["ip", "netns", "exec", "NS"]``.
    """

    def __init__(self, workdir: str | Path, host: str = "127.0.0.1", port: int | None = None,
                 tls: TlsFiles | None = None, node_auth: bool = False,
                 prefix: Sequence[str] = ()) -> None:
        self.workdir = Path(workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.host = host
        self.port = port or free_port(host if host != "0.0.0.0" else "127.0.0.1")
        self.tls = tls
        self.node_auth = node_auth
        self.prefix = tuple(prefix)
        self.site_status: dict[str, SiteStatus] = {}
        self._runs = 0
        self._site_host: SiteHostClient | None = None
        self._site_keys: list[Path] = []
        self.flwr_home = self.workdir / "flwr_home"
        self.flwr_home.mkdir(exist_ok=True)
        # Flower's processes start further Flower commands by name (the SuperLink runs
        # flower-superexec): they must find the ones installed with this Python.
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        # Flower's commands (SuperLink, ServerApps, SuperExec, flwr run, key registration)
        # are forked from a host that loaded their stack once (.apphost, maybe shared):
        # ours, found first, hand them to it.
        self._apphost_dir: Path | None = None  # this federation's own host's folder
        self._apphost_socket: Path | None = None
        self._flwr, self._superlink = flower_cli.flwr_tool("flwr"), None
        if os.environ.get(APPHOST_ENV_VAR, "").lower() != "off":
            try:  # under a prefix (another network namespace), from a host there
                self._apphost_dir, self._apphost_socket, shims = apphost_client.prepare(
                    self.workdir, may_share=not self.prefix)
            except ValueError as err:
                raise FederationError(str(err)) from None
            path = os.pathsep.join([str(shims), path])
            self._flwr, self._superlink = str(shims / "flwr"), str(shims / "flower-superlink")
        self.env = {**os.environ, "PATH": path, "FLWR_HOME": str(self.flwr_home),
                    "PYTHONUNBUFFERED": "1"}
        telemetry_off(self.env)  # Flower's and MLflow's usage reports (the ServerApp logs)
        (self.flwr_home / "config.toml").write_text(
            flower_cli.connection_config(self.address, self.tls))
        self.supervisor = Supervisor(self.workdir, self.env)

    @property
    def address(self) -> str:
        """Return ``HOST:PORT`` of the SuperLink."""
        return f"{self.host}:{self.port}"

    @property
    def local_address(self) -> str:
        """Return the SuperLink's address as a process on this host dials it."""
        return f"{'127.0.0.1' if self.host == '0.0.0.0' else self.host}:{self.port}"

    @property
    def processes(self) -> dict[str, Child]:
        """Return the running processes by name (``superlink``, ``site-NYU``, ...)."""
        return self.supervisor.processes

    @property
    def host_ready(self) -> HostReady | None:
        """Return what the site host said once it had loaded the stack (None before)."""
        return None if self._site_host is None else self._site_host.ready

    def log_tail(self, name: str, lines: int = 15) -> str:
        """Return the last lines of a process's log."""
        return self.supervisor.log_tail(name, lines)

    # -- the server ----------------------------------------------------------------------
    @property
    def site_states(self) -> Path:
        """Return the folder under which every local site keeps its state (per federation)."""
        return self.workdir / "sites"

    def start_superlink(self, timeout: float = 60.0) -> None:
        """Start the SuperLink and wait until it accepts connections.

        The ServerApp host (unless this process shares one) starts first; it forks the
        SuperLink once Flower is loaded, then loads the rest of its stack while the sites
        start (a run submitted sooner waits for it).
        """
        if self._apphost_dir is not None and not self.supervisor.running("serverapp-host"):
            try:
                apphost_client.start(self.supervisor, self._apphost_dir, self.prefix, timeout)
            except FederationError as err:  # Flower's own commands run instead (the shims)
                print(f"fedbn-med: {err}", file=sys.stderr)
        cmd = flower_cli.superlink_command(self.host, self.port, self.tls, self.node_auth,
                                           self._superlink)
        self.supervisor.spawn("superlink", cmd, prefix=self.prefix)
        host, _, port = self.local_address.rpartition(":")
        self.supervisor.wait_for_port("superlink", host, int(port), timeout,
                                      prefix=self.prefix, what="The SuperLink")

    def start_gate(self, host: str, port: int, *, max_body: int = 64 << 20,
                   max_body_file: Path | None = None,
                   limits: fleet_gate.GateLimits | None = None,
                   fd_limit: int | None = None, timeout: float = 60.0) -> str:
        """Open the public port: Flower's Fleet API only, forwarded to this SuperLink.

        The SuperLink must bind 127.0.0.1; ``host:port`` is what the sites dial. With node
        authentication, only the keys registered so far (:meth:`register_site_key`) pass
        the gate. ``limits`` bounds what a client may take of it; ``fd_limit`` lowers its
        descriptor limit. See :mod:`fedbn_med.federation.launcher.fleet_gate`. Returns
        ``HOST:PORT``.

        Raises
        ------
        FederationError
            When another process (an earlier server, say) holds ``host:port``, or the
            gate does not open it.
        """
        if self.host != "127.0.0.1":
            raise ValueError(f"The gate fronts a SuperLink on 127.0.0.1, not {self.host}.")
        if port_taken(host, port):
            raise FederationError(
                f"Port {host}:{port} is in use by another process (an earlier federation "
                "server that is still running?): stop it first, or choose another --listen.")
        ready = self.supervisor.logs / "gate.ready"
        ready.unlink(missing_ok=True)
        cmd = fleet_gate.command(
            f"{host}:{port}", self.address, ready_file=ready, max_body=max_body,
            max_body_file=max_body_file, tls=self.tls, limits=limits, fd_limit=fd_limit,
            allowed_keys=self._site_keys if self.node_auth else ())
        self.supervisor.spawn("gate", cmd, prefix=self.prefix)
        # Ready when *this* gate has bound the port (it writes the file), not when
        # something answers there.
        self.supervisor.wait_until(
            "gate", ready.exists, timeout, exited="The server's public port did not open",
            late=f"The server's public port {host}:{port} did not open within "
                 f"{timeout:.0f} s.")
        return f"{host}:{port}"

    def register_site_key(self, public_key: Path) -> int:
        """Register a site's public key with the SuperLink; return the node ID it gets."""
        try:
            node_id = flower_cli.register_key(public_key, env=self.env, cwd=self.workdir,
                                              prefix=list(self.prefix), flwr=self._flwr)
        except RuntimeError as err:
            raise FederationError(str(err)) from err
        self._site_keys.append(Path(public_key))
        return node_id

    # -- sites ---------------------------------------------------------------------------
    def node_command(self, site: str, state_dir: Path, data_dir: Path | None = None,
                     device: str = "auto", auth_key: Path | None = None,
                     max_wait_time: float = 60.0, superlink: str | None = None,
                     secagg: bool = False) -> list[str]:
        """Return the command that runs one site's node against this SuperLink."""
        return [sys.executable, "-m", "fedbn_med.federation.node",
                *self._node_args(site, state_dir, data_dir, device, auth_key, max_wait_time,
                                 superlink, secagg=secagg)]

    def _node_args(self, site: str, state_dir: Path, data_dir: Path | None, device: str,
                   auth_key: Path | None, max_wait_time: float, superlink: str | None,
                   share_private: bool = False, secagg: bool = False) -> list[str]:
        node = NodeSettings(site=site, state_dir=state_dir, data_dir=data_dir, device=device,
                            share_private=share_private, secagg=secagg)
        args = ["--superlink", superlink or self.local_address,
                "--node-settings", node.to_node_config()[RUN_CONFIG_KEY],
                "--max-wait-time", str(max_wait_time)]
        if self.tls is None:
            args.append("--insecure")
        else:
            args += ["--root-certificates", str(self.tls.ca_cert)]
        if auth_key is not None:
            args += ["--auth-key", str(auth_key)]
        return args

    def start_site_host(self, threads: int | None = None,
                        preload: Sequence[str] | None = None) -> None:
        """Start the site host, which loads the training stack once for every local site.

        Sites started afterwards (without a ``prefix``) are forked from it instead of
        importing torch and Flower (and an imaging task's MONAI) each on their own.
        ``preload`` names the tasks whose modules it imports too (default: every
        registered task). See
        :mod:`fedbn_med.federation.launcher.sitehost`.
        """
        if self._site_host is not None and self._site_host.running():
            return
        if preload is None:
            from fedbn_med.tasks import TASK_NAMES

            preload = TASK_NAMES
        self._site_host = SiteHostClient(self.supervisor, threads, preload)

    def start_site(self, site: str, *, data_dir: Path | None = None, device: str = "auto",
                   auth_key: Path | None = None, threads: int | None = None,
                   superlink: str | None = None, prefix: Sequence[str] = (),
                   max_wait_time: float = 60.0, share_private: bool = False,
                   secagg: bool = False) -> Child:
        """Start one site's node process (its own OS process).

        ``threads`` caps the site's CPU threads, so several sites on one host share its
        cores instead of fighting over them. ``superlink`` overrides the address the site
        dials (a relay or a proxy in front of the SuperLink). With a site host running
        (:meth:`start_site_host`) the process is forked from it, unless it must run under
        a command ``prefix`` (a network namespace, say). ``device`` is passed as given;
        spread ``auto`` over the local GPUs first with
        :func:`fedbn_med.federation.launcher.devices.site_devices`. ``share_private`` is
        the site's own policy (may its private layers leave it?), ``secagg`` too (may it
        send its update under SecAgg+?).
        """
        name = f"site-{site}"
        env = None
        if threads is not None:
            env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        args = self._node_args(site, self.site_states, data_dir, device, auth_key,
                               max_wait_time, superlink, share_private, secagg)
        if not prefix and self._site_host is not None and self._site_host.running():
            forked: ForkedSite = self._site_host.fork(name, args, env)
            self.site_status[name] = forked.status
            return forked
        read_end, write_end = os.pipe()
        try:
            proc = self.supervisor.spawn(
                name, [sys.executable, "-m", "fedbn_med.federation.node", *args,
                       "--events-fd", str(write_end)],
                extra_env=env, prefix=prefix, pass_fds=(write_end,))
        finally:
            os.close(write_end)
        status = SiteStatus()
        self.site_status[name] = status
        EventReader(os.fdopen(read_end, encoding="utf-8"), status.note, name)
        return proc

    def wait_sites_ready(self, sites: list[str], timeout: float = 120.0) -> float:
        """Wait until every site's node has connected; return the seconds it took."""
        start = time.monotonic()
        pending = set(sites)
        while pending:
            for site in list(pending):
                name = f"site-{site}"
                status = self.site_status[name]
                if status.ready.is_set():
                    pending.discard(site)
                elif self.processes[name].poll() is not None or status.failure is not None:
                    reason = status.failure or self.log_tail(name)
                    raise FederationError(f"Site {site} exited at start-up:\n{reason}")
            if time.monotonic() - start > timeout:
                raise FederationError(f"Sites {sorted(pending)} did not connect within "
                                      f"{timeout:.0f} s.")
            if pending:
                time.sleep(0.1)
        return time.monotonic() - start

    # -- runs ----------------------------------------------------------------------------
    def submit(self, run_config: Mapping[str, object], results_dir: Path | None = None
               ) -> SubmittedRun:
        """Submit a run (``flwr run --stream``) with the given run-config overrides."""
        results_dir = Path(results_dir or self.workdir)
        results_dir.mkdir(parents=True, exist_ok=True)
        # Flower sends the run config to every site: the server's settings stay here.
        run_config = seal_run_config(run_config, self.flwr_home)
        overrides = flower_cli.write_run_config(results_dir / "run_config.toml", run_config)
        self._runs += 1
        name = f"run-{self._runs}"
        # This run's events are what its ServerApp appends from now on: an earlier run's
        # (a resumed federation's workdir) are never read as this one's.
        progress = results_dir / "progress.jsonl"
        offset = progress.stat().st_size if progress.exists() else 0
        submitted = time.time()
        proc = self.supervisor.spawn(name, flower_cli.run_command(overrides, self._flwr),
                                     prefix=self.prefix)
        return SubmittedRun(proc=proc, name=name, results_dir=results_dir,
                            progress_from=offset, submitted=submitted)

    def watch(self, run: SubmittedRun, on_event: Callable[[Event], None] | None = None,
              timeout: float = 3600.0, results_dir: Path | None = None,
              until_done: bool = False) -> dict:
        """Follow the run's progress events until it ends; return its results.

        ``on_event`` gets each event of the run's ``progress.jsonl``, typed (see
        :func:`~fedbn_med.federation.launcher.progress.follow`). The run succeeded when the
        server reported :class:`~fedbn_med.federation.events.Done`. ``results_dir``, when
        given, must be the one the run was submitted with. ``until_done``: the run has
        ended once the server reported ``Done``, for a caller that stops the federation
        or submits its next run next (see
        :func:`~fedbn_med.federation.launcher.progress.follow`).
        """
        if results_dir is not None and Path(results_dir).resolve() != run.results_dir.resolve():
            raise ValueError(f"Run {run.name} writes to {run.results_dir}, not {results_dir}.")
        return follow(run, on_event=on_event, timeout=timeout,
                      server_gone=self._superlink_gone, log_tail=self.log_tail,
                      until_done=until_done)

    def _superlink_gone(self) -> str | None:
        superlink = self.processes.get("superlink")
        if superlink is not None and superlink.poll() is not None:
            return "The SuperLink stopped during the run:\n" + self.log_tail("superlink")
        return None

    # -- stopping ------------------------------------------------------------------------
    def stop_process(self, name: str, sig: int = signal.SIGTERM, grace: float = 5.0) -> None:
        """Stop one process and every process it started.

        Stopping the SuperLink stops what the ServerApp host forked for this federation
        (its ServerApps, SuperExec, ``flwr`` commands), and this federation's own host (the
        next :meth:`start_superlink` starts it again).
        """
        self.supervisor.stop(name, sig, grace)
        if name == "superlink":
            self._stop_forked(sig, grace)

    def _stop_forked(self, sig: int, grace: float) -> None:
        if self._apphost_dir is not None:  # our own host: it and all it forked
            self.supervisor.stop("serverapp-host", sig, grace)
        elif self._apphost_socket is not None:  # a shared host: what it forked for us
            try:
                apphost_client.stop_runs(self._apphost_socket, str(self.flwr_home), sig)
            except (OSError, RuntimeError) as err:  # a host in trouble: stop the rest anyway
                print(f"Could not stop this federation's Flower commands: {err}",
                      file=sys.stderr)

    def stop(self) -> None:
        """Stop every process this federation started (sites first, then the server)."""
        for name in [n for n in self.processes if n not in (*_SERVERS, "serverapp-host")]:
            self.supervisor.stop(name)
        self._stop_forked(signal.SIGTERM, 5.0)  # with them, a SuperLink it forked
        if self._site_host is not None:
            self._site_host.close()  # the host forks no more sites and ends
        self.supervisor.stop_all(last=_SERVERS)
        self.supervisor.close()
        if self._apphost_dir is not None:
            shutil.rmtree(self._apphost_dir, ignore_errors=True)

    def __enter__(self) -> LocalFederation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
