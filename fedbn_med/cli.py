"""Command line of the ABIDE pipeline: ``python pipelines/abide_fedbn.py``.

Three modes:

- default: the whole federation on this host (a Flower SuperLink on 127.0.0.1 and one
  process per site), on the built-in cohort unless ``--data-dir`` is given;
- ``--serve``: the federation server of a multi-host consortium, waiting for sites;
- ``--site NAME --superlink HOST:PORT``: one hospital's site joining that server.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from fedbn_med.argtypes import positive_int
from fedbn_med.experiment import ExperimentConfig
from fedbn_med.paths import resolve_data_dir
from fedbn_med.strategies import STRATEGIES

__all__ = ["build_parser", "main"]

COMPARE_ORDER = ("singleset", "fedavg", "fedprox", "fedbn", "centralized")


def _sites(text: str) -> tuple[str, ...]:
    sites = tuple(s.strip() for s in text.split(",") if s.strip())
    if not sites:
        raise argparse.ArgumentTypeError("expected site names such as NYU,UM,USM,UCLA")
    return sites


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the ABIDE pipeline."""
    p = argparse.ArgumentParser(
        prog="abide_fedbn.py",
        description="FedBN on ABIDE I connectivity across hospital sites, over Flower.",
    )
    p.add_argument("--strategy", default="fedbn", type=str.lower,
                   help=f"one of {', '.join(sorted(STRATEGIES))} (default fedbn)")
    p.add_argument("--mu", type=float, default=None, help="proximal weight (FedProx, FedBN+prox)")
    p.add_argument("--compare", action="store_true",
                   help="run every strategy and print the paper-style table")
    p.add_argument("--folds", type=positive_int, default=1,
                   help="with --compare: folds to average over (the paper uses 5)")
    p.add_argument("--rounds", type=positive_int, default=30)
    p.add_argument("--local-epochs", type=positive_int, default=1)
    p.add_argument("--batch-size", type=positive_int, default=32)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fold", type=int, default=0)
    p.add_argument("--sites", type=_sites, default=("NYU", "UM", "USM", "UCLA"))
    p.add_argument("--data-dir", type=Path, default=None,
                   help="folder holding ABIDE_pcp/ (default: the built-in cohort)")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda:N")
    p.add_argument("--engine", choices=("flower", "inprocess"), default="flower",
                   help="flower: one process per site over Flower; inprocess: the reference "
                        "driver in this process")
    p.add_argument("--tracking-uri", default=None,
                   help="MLflow store (default: $MLFLOW_TRACKING_URI, else mlflow/ here)")
    p.add_argument("--workdir", type=Path, default=None,
                   help="logs, checkpoints and results (default: <data dir>/runs/<time>)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    hosp = p.add_argument_group("multi-host consortium")
    hosp.add_argument("--serve", action="store_true",
                      help="run the federation server and wait for the sites")
    hosp.add_argument("--listen", default="127.0.0.1:9092",
                      help="with --serve: HOST:PORT to bind (default 127.0.0.1:9092)")
    hosp.add_argument("--site", default=None, help="run only this hospital's site")
    hosp.add_argument("--superlink", default=None, help="with --site: the server's HOST:PORT")
    hosp.add_argument("--state-dir", type=Path, default=None,
                      help="with --site: where the site keeps its private state")
    hosp.add_argument("--min-sites", type=int, default=0,
                      help="rounds go on with at least this many sites (default: all)")
    hosp.add_argument("--wait-timeout", type=float, default=300.0,
                      help="seconds to wait for sites before giving up")
    hosp.add_argument("--resume", action="store_true",
                      help="with --serve: continue from the last global checkpoint")
    hosp.add_argument("--allow-join", action="store_true",
                      help="with --serve: let new sites join the running federation")
    hosp.add_argument("--root-certificates", type=Path, default=None,
                      help="with --site: the consortium CA certificate (TLS)")
    hosp.add_argument("--auth-key", type=Path, default=None,
                      help="with --site: this site's private key (node authentication)")
    hosp.add_argument("--insecure", action="store_true",
                      help="allow a connection without TLS to or from another host")
    hosp.add_argument("--tls-dir", type=Path, default=None,
                      help="with --serve: the folder made by pipelines/consortium_keys.py "
                           "(TLS, and only the sites whose .pub is there may join)")
    return p


def _config(args: argparse.Namespace, strategy: str | None = None, fold: int | None = None
            ) -> ExperimentConfig:
    return ExperimentConfig(
        strategy=strategy or args.strategy, mu=args.mu, rounds=args.rounds,
        local_epochs=args.local_epochs, batch_size=args.batch_size, lr=args.lr,
        seed=args.seed, fold=args.fold if fold is None else fold, sites=args.sites,
        data_dir=args.data_dir, device=args.device,
    )


def _in_process(config: ExperimentConfig, tracking_uri: str, quiet: bool) -> dict:
    from tqdm.auto import tqdm

    from fedbn_med.experiment import run_experiment
    from fedbn_med.report import site_table
    from fedbn_med.tracking import FederationTracker

    tracker = FederationTracker("abide-fedbn", config.strategy_obj().label,
                                {**config.params(), "engine": "inprocess"}, config.sites,
                                tracking_uri=tracking_uri)
    bar = tqdm(total=config.rounds, desc=config.strategy_obj().label, unit="round",
               disable=quiet, dynamic_ncols=True)

    def on_round(rnd: int, metrics: dict) -> None:
        tracker.log_round(rnd, metrics)
        bar.update(1)

    try:
        history = run_experiment(config, on_round=on_round)
    except BaseException:
        tracker.finish("FAILED")
        raise
    finally:
        bar.close()
    table = site_table(history.final())
    tracker.log_text(table + "\n", "results.md")
    tracker.finish()
    return {"strategy": history.strategy, "final": history.final(), "table": table,
            "rows": history.rows, "parent_run_id": tracker.parent_id}


def _workdir(args: argparse.Namespace) -> Path:
    if args.workdir is not None:
        return args.workdir.resolve()
    return resolve_data_dir() / "runs" / time.strftime("%Y%m%d-%H%M%S")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ABIDE pipeline; return the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return _dispatch(args)
    except KeyboardInterrupt:
        print("\ninterrupted: every process this command started has been stopped",
              file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError, ConnectionError, TimeoutError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def _dispatch(args: argparse.Namespace) -> int:
    from fedbn_med.sites import load_sites
    from fedbn_med.strategies import get_strategy
    from fedbn_med.tracking import default_tracking_uri

    get_strategy(args.strategy, args.mu)  # an unknown strategy lists the valid ones
    if args.site is not None:
        return _site_mode(args)
    load_sites(list(args.sites))  # an unknown site lists the valid ones
    tracking_uri = args.tracking_uri or default_tracking_uri()
    workdir = _workdir(args)
    started = time.monotonic()
    if args.serve:
        return _serve_mode(args, tracking_uri, workdir)
    strategies = COMPARE_ORDER if args.compare else (args.strategy,)
    folds = range(args.folds) if args.compare else (args.fold,)
    configs = [_config(args, s, f) for s in strategies for f in folds]
    results = _run_all(args, configs, tracking_uri, workdir)
    _print_results(args, configs, results, tracking_uri, time.monotonic() - started)
    return 0


def _run_all(args: argparse.Namespace, configs: list[ExperimentConfig], tracking_uri: str,
             workdir: Path) -> list[dict]:
    from fedbn_med.federation.run import FlowerOptions, prepare_builtin, run_flower

    pooled = [c for c in configs if c.strategy_obj().pooled or args.engine == "inprocess"]
    federated = [c for c in configs if c not in pooled]
    by_config: dict[int, dict] = {}
    if federated:
        prepare_builtin(federated[0])
        options = FlowerOptions(workdir=workdir, tracking_uri=tracking_uri,
                                min_sites=args.min_sites, wait_timeout=args.wait_timeout,
                                progress=not args.quiet)
        for config, result in zip(federated, run_flower(federated, options,
                                                         device=args.device)):
            by_config[id(config)] = result
    for config in pooled:
        by_config[id(config)] = _in_process(config, tracking_uri, args.quiet)
    return [by_config[id(c)] for c in configs]


def _print_results(args: argparse.Namespace, configs: list[ExperimentConfig],
                   results: list[dict], tracking_uri: str, seconds: float) -> None:
    from fedbn_med.report import paper_table

    if args.compare:
        for metric in ("accuracy", "auc"):
            table: dict[str, dict[str, list[float]]] = {}
            for config, result in zip(configs, results):
                per_site = table.setdefault(config.strategy_obj().label, {})
                for site, metrics in result["final"].items():
                    per_site.setdefault(site, []).append(float(metrics[f"test_{metric}"]))
            print(paper_table(table, list(args.sites), metric=metric) + "\n")
    else:
        print(f"\n{results[0]['strategy']} after {args.rounds} rounds (test split, fold "
              f"{args.fold}), % per site:\n")
        print(results[0]["table"])
    print(f"\nwall time {seconds:.1f} s; MLflow: mlflow ui --backend-store-uri {tracking_uri}")


def _serve_mode(args: argparse.Namespace, tracking_uri: str, workdir: Path) -> int:
    from fedbn_med.federation.run import FlowerOptions, serve

    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--listen expects HOST:PORT such as 127.0.0.1:9092, got "
                         f"'{args.listen}'.")
    tls = None
    loopback = host in ("127.0.0.1", "localhost", "::1")
    if args.tls_dir is not None:
        from fedbn_med.federation.launcher import TlsFiles

        tls = TlsFiles(args.tls_dir / "ca.pem", args.tls_dir / "server.pem",
                       args.tls_dir / "server.key")
        missing = [str(p) for p in (tls.ca_cert, tls.server_cert, tls.server_key)
                   if not p.is_file()]
        if missing:
            raise FileNotFoundError(f"--tls-dir lacks {', '.join(missing)} (make them with "
                                    "pipelines/consortium_keys.py).")
    elif not loopback and not args.insecure:
        raise ValueError(
            f"The server would listen on {host}, beyond this host, without TLS. Pass "
            "--tls-dir (see pipelines/consortium_keys.py), or --insecure on a network you "
            "trust.")
    options = FlowerOptions(workdir=workdir, tracking_uri=tracking_uri, host=host,
                            port=int(port), min_sites=args.min_sites, tls=tls,
                            node_auth=tls is not None,
                            wait_timeout=args.wait_timeout, resume=args.resume,
                            allow_join=args.allow_join, federation_id="serve",
                            progress=not args.quiet)
    result = serve(_config(args), options)
    print(result["table"])
    return 0


def _site_mode(args: argparse.Namespace) -> int:
    from fedbn_med.federation.run import run_site

    if not args.superlink:
        raise ValueError("--site needs --superlink HOST:PORT of the federation server.")
    state_dir = args.state_dir or resolve_data_dir() / "site_state"
    run_site(args.site, args.superlink, state_dir=state_dir, data_dir=args.data_dir,
             device=args.device, root_certificates=args.root_certificates,
             auth_key=args.auth_key, insecure=args.insecure,
             max_wait_time=args.wait_timeout)
    return 0

