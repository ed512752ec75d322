"""The multi-host modes: ``--serve`` (the consortium's server) and ``--site`` (one hospital).

Both run one side of a federation whose other side is on other hosts; the server refuses
to listen beyond this host without TLS unless told ``--insecure``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fedbn_med.cli.parser import server_options
from fedbn_med.federation.config import ServerSettings
from fedbn_med.federation.names import is_loopback
from fedbn_med.spec import RunSpec

__all__ = ["serve_mode", "site_mode"]


def serve_mode(args: argparse.Namespace, spec: RunSpec, tracking_uri: str,
               workdir: Path) -> int:
    """Run the federation server on ``--listen`` and wait for the sites; return 0."""
    from fedbn_med.federation.run import FlowerOptions, serve

    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--listen expects HOST:PORT such as 127.0.0.1:9092, got "
                         f"'{args.listen}'.")
    tls = None
    if args.tls_dir is not None:
        from fedbn_med.federation.launcher import TlsFiles

        tls_dir = args.tls_dir.expanduser().resolve()  # the SuperLink runs elsewhere
        tls = TlsFiles(tls_dir / "ca.pem", tls_dir / "server.pem", tls_dir / "server.key")
        missing = [str(p) for p in (tls.ca_cert, tls.server_cert, tls.server_key)
                   if not p.is_file()]
        if missing:
            raise FileNotFoundError(f"--tls-dir lacks {', '.join(missing)} (make them with "
                                    "pipelines/consortium_keys.py).")
    elif not is_loopback(host) and not args.insecure:
        raise ValueError(
            f"The server would listen on {host}, beyond this host, without TLS. Pass "
            "--tls-dir (see pipelines/consortium_keys.py), or --insecure on a network you "
            "trust.")
    settings = ServerSettings(workdir=workdir, tracking_uri=tracking_uri,
                              federation_id="serve", resume=args.resume,
                              allow_join=args.allow_join, **server_options(args))
    options = FlowerOptions(settings, host=host, port=int(port), tls=tls,
                            node_auth=tls is not None, progress=not args.quiet)
    print(f"Run folder: {workdir}", flush=True)
    result = serve(spec, options)
    print(result["table"])
    print(serve_summary(spec, workdir, result))
    return 0


def serve_summary(spec: RunSpec, workdir: Path, result: dict) -> str:
    """Return what a server operator needs after a federation: where everything went."""
    checkpoint = workdir / "server" / "global.safetensors"
    uri = str(result.get("tracking_uri") or "")
    lines = [f"\nRun folder:     {workdir}",
             f"Global weights: {checkpoint}"]
    if uri:
        from fedbn_med.paths import runs_page

        lines.append(f"MLflow:         {uri} (parent run {result.get('parent_run_id')})")
        lines.append("  " + runs_page(uri, result.get("parent_run_id")))
    others = ",".join(spec.sites)
    task = "" if spec.task == "abide" else f" --task {spec.task}"
    lines.append("Onboard a new site onto these weights (at that site, with its data):")
    lines.append(f"  python pipelines/onboard_site.py{task} --site NEWSITE --sites {others} "
                 f"--checkpoint {checkpoint} --data-dir DATA_DIR")
    return "\n".join(lines)


def site_mode(args: argparse.Namespace) -> int:
    """Run one hospital's site (``--site``) against the server at ``--superlink``; return 0."""
    from fedbn_med.federation.run import run_site
    from fedbn_med.federation.site_console import SiteConsole
    from fedbn_med.paths import resolve_data_dir

    if not args.superlink:
        raise ValueError("--site needs --superlink HOST:PORT of the federation server.")
    for option in ("root_certificates", "auth_key"):
        path = getattr(args, option)
        if path is not None and not path.is_file():
            raise FileNotFoundError(f"--{option.replace('_', '-')} {path}: no such file "
                                    "(the consortium's key tool writes it; see the "
                                    "deployment guide).")
    # each site its own folder, so two sites on one machine never share state
    state_dir = args.state_dir or resolve_data_dir() / "site_state" / args.site
    data = args.data_dir or "its site file's data_dir, else the built-in data"
    print(f"[{args.site}] data: {data}; private state: {state_dir}", flush=True)
    run_site(args.site, args.superlink, state_dir=state_dir, data_dir=args.data_dir,
             device=args.device or "auto", root_certificates=args.root_certificates,
             auth_key=args.auth_key, insecure=args.insecure,
             max_wait_time=args.wait_timeout or ServerSettings.wait_timeout,
             share_private=args.share_private_layers, secagg=bool(args.secagg),
             console=SiteConsole(args.site, lambda line: print(line, flush=True)),
             keep_serving=args.keep_serving)
    return 0
