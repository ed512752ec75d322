"""Run federations over Flower from Python: the embedded default, the server, a site.

These are the library functions behind ``pipelines/abide_fedbn.py``.
"""

from __future__ import annotations

import logging
import math
import os
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from fedbn_med.experiment import ExperimentConfig, resolve_site_data_dir
from fedbn_med.federation.config import run_config_from_experiment
from fedbn_med.federation.launcher import LocalFederation, TlsFiles
from fedbn_med.sites import load_sites

__all__ = ["FlowerOptions", "prepare_builtin", "run_flower", "run_site", "serve"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FlowerOptions:
    """How to run the federation's processes (not what to train)."""

    workdir: Path
    tracking_uri: str
    task: str = "abide"
    host: str = "127.0.0.1"
    port: int | None = None
    min_sites: int = 0
    wait_timeout: float = 120.0
    round_timeout: float = 600.0
    resume: bool = False
    allow_join: bool = False
    input_shape: tuple[int, ...] = ()
    federation_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    tls: TlsFiles | None = None
    node_auth: bool = False
    progress: bool = True


def prepare_builtin(config: ExperimentConfig) -> None:
    """Generate the built-in cohort and cache every site's features before sites start.

    Sites then start in about the time it takes to import torch, and several local site
    processes never race to write the same files.
    """
    from fedbn_med.experiment import prepare_site_data

    for site in load_sites(list(config.sites)).values():
        resolve_site_data_dir(site, config)
        prepare_site_data(site, config)


class _Progress:
    def __init__(self, total: int, label: str, enabled: bool) -> None:
        self.bar = tqdm(total=total, desc=label, unit="round", disable=not enabled,
                        dynamic_ncols=True)
        self.events: list[dict] = []

    def __call__(self, event: dict) -> None:
        self.events.append(event)
        kind = event.get("event")
        if kind == "ready":
            self.bar.write(f"sites ready: {', '.join(event['sites'])}")
        elif kind == "round":
            sites = event["sites"]
            accs = [m.get("test_accuracy", math.nan) for m in sites.values()]
            accs = [a for a in accs if not math.isnan(a)]
            if accs:
                self.bar.set_postfix(test_acc=f"{100 * sum(accs) / len(accs):.1f}%",
                                     sites=len(sites))
            self.bar.update(int(event["round"]) - self.bar.n)
        elif kind in ("update-refused", "site-refused", "site-error"):
            self.bar.write(f"warning: {event.get('site', event.get('node'))}: "
                           f"{event.get('reason')}")

    def close(self) -> None:
        self.bar.close()


def _run_config(config: ExperimentConfig, options: FlowerOptions) -> dict[str, object]:
    return {**run_config_from_experiment(config), "task": options.task,
            "workdir": str(options.workdir), "tracking-uri": options.tracking_uri,
            "federation-id": options.federation_id, "min-sites": options.min_sites,
            "wait-timeout": options.wait_timeout, "round-timeout": options.round_timeout,
            "resume": options.resume, "allow-join": options.allow_join,
            "input-shape": ",".join(str(d) for d in options.input_shape)}


def run_flower(configs: Iterable[ExperimentConfig], options: FlowerOptions,
               data_dirs: dict[str, Path] | None = None, device: str = "auto") -> list[dict]:
    """Run one or more federations on this host: a SuperLink and one process per site.

    The SuperLink and the site processes start once and serve every configuration in
    turn; every process is stopped on return, on error and on Ctrl-C.
    """
    configs = list(configs)
    sites = list(configs[0].sites)
    results = []
    threads = max(1, (os.cpu_count() or 1) // max(1, len(sites)))
    with LocalFederation(options.workdir, host=options.host, port=options.port,
                         tls=options.tls, node_auth=options.node_auth) as fed:
        started = time.monotonic()
        # Everything that can start at once does: the site host loads torch and MONAI
        # while the SuperLink comes up, and the run is submitted before the sites are
        # ready (the ServerApp waits for them), so its start overlaps theirs.
        fed.start_site_host(threads=threads)
        fed.start_superlink()
        for i, config in enumerate(configs):
            run_dir = options.workdir / f"run-{i}-{config.strategy_obj().label}-f{config.fold}"
            run_opts = FlowerOptions(**{**options.__dict__, "workdir": run_dir,
                                        "federation_id": f"{options.federation_id}-{i}"})
            run_dir.mkdir(parents=True, exist_ok=True)
            progress = _Progress(config.rounds, config.strategy_obj().label, options.progress)
            try:
                run = fed.submit(_run_config(config, run_opts), results_dir=run_dir)
                if i == 0:
                    for site in sites:
                        fed.start_site(site, data_dir=(data_dirs or {}).get(site),
                                       device=device, threads=threads)
                    fed.wait_sites_ready(sites, timeout=options.wait_timeout)
                    logger.info("SuperLink and %d sites up in %.1f s", len(sites),
                                time.monotonic() - started)
                results.append(fed.watch(run, on_event=progress, results_dir=run_dir))
            finally:
                progress.close()
    return results


def serve(config: ExperimentConfig, options: FlowerOptions) -> dict:
    """Start the SuperLink on ``options.host``, submit the run and wait for the sites."""
    with LocalFederation(options.workdir, host=options.host, port=options.port,
                         tls=options.tls, node_auth=options.node_auth) as fed:
        fed.start_superlink()
        if options.node_auth and options.tls is not None:
            for site in config.sites:
                public = options.tls.ca_cert.parent / f"{site}.pub"
                if not public.is_file():
                    raise FileNotFoundError(f"No public key {public} for site {site}.")
                fed.register_site_key(public)
        print(f"Federation server listening on {fed.address}; waiting up to "
              f"{options.wait_timeout:.0f} s for sites {', '.join(config.sites)}", flush=True)
        progress = _Progress(config.rounds, config.strategy_obj().label, options.progress)
        try:
            run = fed.submit(_run_config(config, options), results_dir=options.workdir)
            return fed.watch(run, on_event=progress, results_dir=options.workdir)
        finally:
            progress.close()


def run_site(site: str, superlink: str, *, state_dir: Path, data_dir: Path | None = None,
             device: str = "auto", root_certificates: Path | None = None,
             auth_key: Path | None = None, insecure: bool = False,
             max_wait_time: float = 60.0) -> None:
    """Serve one hospital's site against a federation server elsewhere (hospital mode)."""
    from fedbn_med.federation.node import run_node

    load_sites([site])  # an unknown site fails here, listing the valid ones
    host = superlink.rsplit(":", 1)[0]
    loopback = host in ("127.0.0.1", "localhost", "::1", "[::1]")
    if root_certificates is None and not insecure and not loopback:
        raise ValueError(
            f"The federation server {superlink} is not on this host, so the connection must "
            "use TLS: pass --root-certificates CA.pem (from the consortium), or --insecure to "
            "send weights in clear text on a network you trust."
        )
    node_config: dict[str, object] = {"site": site, "state-dir": str(state_dir),
                                      "device": device}
    if data_dir is not None:
        node_config["data-dir"] = str(data_dir)
    run_node(superlink, node_config, root_certificates=root_certificates,
             private_key=auth_key, insecure=root_certificates is None,
             max_wait_time=max_wait_time)

