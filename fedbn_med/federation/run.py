"""Run federations over Flower from Python: the embedded default, the server, a site.

These are the library functions behind ``pipelines/abide_fedbn.py``.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from fedbn_med.evaluation.report import progress_postfix
from fedbn_med.federation.config import NodeSettings, ServerSettings, run_config
from fedbn_med.federation.events import Event, Ready, Round, SiteError, SiteRefused, UpdateRefused
from fedbn_med.federation.kept_rounds import round_file
from fedbn_med.federation.launcher import LocalFederation, TlsFiles, site_devices
from fedbn_med.federation.names import is_loopback
from fedbn_med.federation.site_console import SiteConsole
from fedbn_med.numerics.cores import usable_cores
from fedbn_med.spec import RunSpec
from fedbn_med.tasks import get_task

__all__ = ["FlowerOptions", "run_flower", "run_site", "serve"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FlowerOptions:
    """How to run the federation's processes (not what to train).

    Attributes
    ----------
    server : ServerSettings
        What the server's ServerApp is told (workdir, tracking store, timeouts, ...).
        :func:`run_flower` gives each run a folder and federation id of its own under
        its ``workdir`` and ``federation_id``.
    host, port : str, int or None
        Where the server listens (a free port when None).
    tls : TlsFiles, optional
        Serve over TLS with these files.
    node_auth : bool
        Admit only site nodes whose public key was registered.
    progress : bool
        Show a progress bar.
    """

    server: ServerSettings
    host: str = "127.0.0.1"
    port: int | None = None
    tls: TlsFiles | None = None
    node_auth: bool = False
    progress: bool = True

    @classmethod
    def local(cls, workdir: Path, tracking_uri: str, *, progress: bool = True,
              **server: Any) -> FlowerOptions:
        """Return options for federations on this host, under a fresh federation id.

        ``server`` are further :class:`ServerSettings` fields; the rest keep their
        defaults.
        """
        settings = ServerSettings(**{"workdir": workdir, "tracking_uri": tracking_uri,
                                     "federation_id": uuid.uuid4().hex[:12], **server})
        return cls(settings, progress=progress)

    @property
    def workdir(self) -> Path:
        """Return the server's workdir."""
        return self.server.workdir


def _say(text: str) -> None:
    tqdm.write(text, file=sys.stdout)
    sys.stdout.flush()


def _silent(text: str) -> None:
    return None


class _Progress:
    def __init__(self, total: int, label: str, enabled: bool) -> None:
        self.bar = tqdm(total=total, desc=label, unit="round", disable=not enabled,
                        dynamic_ncols=True)
        self.events: list[Event] = []

    def __call__(self, event: Event) -> None:
        self.events.append(event)
        if isinstance(event, Ready):
            self.bar.write(f"sites ready: {', '.join(event.sites)}")
        elif isinstance(event, Round):
            self.bar.set_postfix(progress_postfix(event.sites))
            self.bar.update(int(event.round) - self.bar.n)
        elif isinstance(event, (UpdateRefused, SiteRefused)):
            self.bar.write(f"warning: {event.site}: {event.reason}")
        elif isinstance(event, SiteError):
            self.bar.write(f"warning: {event.node}: {event.reason}")

    def note(self, text: str) -> None:
        # Shown with --quiet too (tqdm writes a line past a disabled bar): what the
        # user must act on, such as the address the sites dial.
        self.bar.write(text, file=sys.stdout)
        sys.stdout.flush()

    def close(self) -> None:
        self.bar.close()


def run_flower(configs: Iterable[RunSpec], options: FlowerOptions) -> list[dict]:
    """Run one or more federations on this host: a SuperLink and one process per site.

    The SuperLink and the site processes start once and serve every spec in turn (all of
    one task, sites, data and device); every process is stopped on return, on error and
    on Ctrl-C. With device ``"auto"`` and ``n`` visible GPUs, site ``i`` trains on
    ``cuda:(i mod n)`` (see :mod:`fedbn_med.federation.launcher.devices`). The task's
    built-in data are made first, so that local sites never race to write them.

    Each spec's result is the server's (``results.json``) with where its files are:
    ``run_dir`` (the server's folder) and ``kept_files`` (each site's private layers of
    the selected round).
    """
    # the first run's MLflow runs start when the caller began (else now)
    begun_ms = options.server.started_ms or int(time.time() * 1000)
    configs = list(configs)
    first = configs[0]
    sites = list(first.sites)
    task = get_task(first.task)
    say = _say if options.progress else _silent
    if task.prepare is not None:
        where = first.data_dir or "each site's file, else the built-in data (made on first use)"
        say(f"Preparing the data of {', '.join(sites)} from {where} ...")
        begun = time.monotonic()
        task.prepare(first)
        say(f"  data ready in {time.monotonic() - begun:.0f} s")
    results = []
    threads = max(1, usable_cores() // max(1, len(sites)))  # each site's share
    # Every site is ours, on this host: the command line that chose a strategy which
    # sends the private layers (FedAvg, FedProx) is every site's policy too.
    share_private = any(c.strategy_obj().exchanges and not c.strategy_obj().keeps_private
                        for c in configs)
    with LocalFederation(options.workdir, host=options.host, port=options.port,
                         tls=options.tls, node_auth=options.node_auth) as fed:
        started = time.monotonic()
        # Everything that can start at once does: the site host loads torch (and MONAI
        # for an imaging task) while the SuperLink comes up, and the run is submitted
        # before the sites are ready (the ServerApp waits for them), so its start
        # overlaps theirs.
        say(f"Starting the Flower SuperLink on 127.0.0.1 and {len(sites)} site processes "
            "(each loads torch and its data) ...")
        fed.start_site_host(threads=threads, preload=[first.task])
        fed.start_superlink()
        for i, config in enumerate(configs):
            run_dir = options.workdir / f"run-{i}-{config.strategy_obj().label}-f{config.fold}"
            settings = dataclasses.replace(
                options.server, workdir=run_dir,
                federation_id=f"{options.server.federation_id}-{i}",
                started_ms=begun_ms if i == 0 else int(time.time() * 1000))
            run_dir.mkdir(parents=True, exist_ok=True)
            progress = _Progress(config.rounds, config.strategy_obj().label, options.progress)
            try:
                run = fed.submit(run_config(config, settings), results_dir=run_dir)
                if i == 0:
                    # With "auto", the sites spread over the visible GPUs (site i on
                    # cuda:(i mod n)); each initialises CUDA itself, after the fork.
                    devices = site_devices(sites, first.device)
                    for site in sites:
                        # every site is ours: the server's SecAgg is their policy too
                        fed.start_site(site, data_dir=first.data_dir, device=devices[site],
                                       threads=threads, share_private=share_private,
                                       secagg=options.server.secagg)
                    fed.wait_sites_ready(sites, timeout=options.server.wait_timeout)
                    logger.info("SuperLink and %d sites up in %.1f s", len(sites),
                                time.monotonic() - started)
                # a run ends at the server's Done (its results, checkpoint, MLflow runs and
                # every site's last answer written): the next one may start while Flower
                # winds the last ServerApp down (1-2 s), and the last one is stopped next
                values = fed.watch(run, on_event=progress, results_dir=run_dir,
                                   until_done=True)
                chosen = int(values.get("selected_round", 0))
                kept = {site: round_file(NodeSettings(site=site, state_dir=fed.site_states)
                                         .state_path(settings.federation_id), chosen)
                        for site in sites}
                # where the run's files are: the server's, and each site's selected layers
                results.append({**values, "run_dir": str(run_dir), "kept_files": {
                    site: str(path) for site, path in kept.items() if path.is_file()}})
            finally:
                progress.close()
    return results


def serve(config: RunSpec, options: FlowerOptions) -> dict:
    """Run the federation server of a consortium: its public port, the SuperLink, the run.

    The SuperLink (every Flower API) binds 127.0.0.1 only; ``options.host:options.port``
    is a gate that forwards Flower's Fleet API and nothing else, and refuses request
    bodies larger than the model's payload plus a margin
    (:mod:`fedbn_med.federation.launcher.fleet_gate`). With node authentication, each
    site's public key comes from the consortium's key list (``sites.json``) and is
    registered here, so the server knows which node is which site.
    """
    from fedbn_med.federation.consortium import read_registered_counts, read_site_keys
    from fedbn_med.federation.launcher import free_port

    options.workdir.mkdir(parents=True, exist_ok=True)
    with LocalFederation(options.workdir, tls=options.tls, node_auth=options.node_auth) as fed:
        fed.start_superlink()
        node_sites: dict[str, str] = {}
        counts: dict[str, int] = {}
        if options.node_auth and options.tls is not None:
            keys = read_site_keys(options.tls.ca_cert.parent)
            counts = read_registered_counts(options.tls.ca_cert.parent)
            missing = [s for s in config.sites if s not in keys]
            if missing:
                raise ValueError(f"The consortium's key list has no key for sites "
                                 f"{', '.join(missing)}; it lists {', '.join(sorted(keys))}.")
            folder = options.workdir / "site_keys"
            folder.mkdir(exist_ok=True)
            for site in (sorted(keys) if options.server.allow_join else config.sites):
                public = folder / f"{site}.pub"
                public.write_text(keys[site] + "\n")
                node_sites[str(fed.register_site_key(public))] = site
        limit_file = options.workdir / "server" / "max_body"
        address = fed.start_gate(options.host, options.port or free_port(options.host),
                                 max_body_file=limit_file)
        progress = _Progress(config.rounds, config.strategy_obj().label, options.progress)
        progress.note(f"Federation server listening on {address} (Fleet API only); waiting "
                      f"up to {options.server.wait_timeout:.0f} s for sites "
                      f"{', '.join(config.sites)}")
        try:
            settings = dataclasses.replace(options.server, node_sites=node_sites,
                                           registered_counts=counts)
            run = fed.submit(run_config(config, settings), results_dir=options.workdir)
            return fed.watch(run, on_event=progress, results_dir=options.workdir,
                             until_done=True)
        finally:
            progress.close()


def run_site(site: str, superlink: str, *, state_dir: Path, data_dir: Path | None = None,
             device: str = "auto", root_certificates: Path | None = None,
             auth_key: Path | None = None, insecure: bool = False,
             max_wait_time: float = 60.0, share_private: bool = False,
             console: SiteConsole | None = None, keep_serving: bool = False,
             secagg: bool = False) -> None:
    """Serve one hospital's site against a federation server elsewhere (hospital mode).

    The site returns once the federation's final evaluation is answered, unless
    ``keep_serving`` (then it waits for the next federation until stopped); ``console``
    is told what the site received and what left it.

    ``share_private`` (the site's command line) or ``share_private_layers = true`` in its
    site file lets its private layers leave it; by default a run whose strategy would
    send them (FedAvg, FedProx) is refused, whatever the server asks. ``secagg`` (its
    command line) or ``secure_aggregation = true`` in its site file lets it send its update
    under SecAgg+ (the server then sees only the sum of the sites' updates).
    """
    from fedbn_med.federation.node import run_node
    from fedbn_med.tasks.site_toml import secure_aggregation, share_private_layers

    host = superlink.rsplit(":", 1)[0]
    if root_certificates is None and not insecure and not is_loopback(host):
        raise ValueError(
            f"The federation server {superlink} is not on this host, so the connection must "
            "use TLS: pass --root-certificates CA.pem (from the consortium), or --insecure to "
            "send weights in clear text on a network you trust."
        )
    node = NodeSettings(site=site, state_dir=state_dir, data_dir=data_dir, device=device,
                        share_private=share_private or share_private_layers(site),
                        secagg=secagg or secure_aggregation(site))
    run_node(superlink, node, root_certificates=root_certificates,
             private_key=auth_key, insecure=root_certificates is None,
             max_wait_time=max_wait_time, console=console, until_done=not keep_serving)

