"""The one command line of every pipeline: ``python pipelines/<task>_fedbn.py``.

``--task`` picks the task (``abide``, ``mri``, ``xray``; each pipeline script fixes its
own). Three modes:

- default: the whole federation on this host, over Flower (a SuperLink on 127.0.0.1
  and one process per site) or in this process (``--engine inprocess``), on the built-in
  data unless ``--data-dir`` is given;
- ``--serve``: the federation server of a multi-host consortium, waiting for sites;
- ``--site NAME --superlink HOST:PORT``: one hospital's site joining that server.

Options left out take the run spec's defaults (:mod:`fedbn_med.spec` and the task's
``settings.py``); the command line holds no default of its own for a training setting.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedbn_med.cli.argtypes import positive_int
from fedbn_med.federation.config import ServerSettings
from fedbn_med.fl.rounds import WEIGHTINGS
from fedbn_med.fl.strategies import STRATEGIES
from fedbn_med.spec import BN_INITS, TASK_NAMES, RunSpec, settings_module, task_defaults
from fedbn_med.tasks.site_toml import SITE_NAME

if TYPE_CHECKING:
    from fedbn_med.evaluation.comparison import Comparison

__all__ = ["build_parser", "main"]

_SPEC_OPTIONS = ("strategy", "mu", "rounds", "local_epochs", "batch_size", "lr", "dropout",
                 "seed", "fold", "sites", "data_dir", "device", "dp_clip", "dp_noise", "dp_delta",
                 "dp_seeded_noise", "weighting", "bn_init", "threads")
#: --compare's seeds per fold unless --seeds says otherwise (it runs every fold).
COMPARE_SEEDS = 3


def _sites(text: str) -> tuple[str, ...]:
    sites = tuple(s.strip() for s in text.split(",") if s.strip())
    if not sites:
        raise argparse.ArgumentTypeError("expected site names such as NYU,UM,USM,UCLA")
    for site in sites:
        _site_name(site)
    return sites


def _site_name(text: str) -> str:
    if not SITE_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(f"a site's name is letters, digits, '-' or '_' (it "
                                         f"names its file in sites/), got '{text}'")
    return text


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got '{text}'")
    return value


def build_parser(task: str = "abide") -> argparse.ArgumentParser:
    """Return the argument parser; ``task`` sets the defaults shown in ``--help``."""
    d = task_defaults(task)
    own = d["settings"]
    p = argparse.ArgumentParser(
        prog=f"{task}_fedbn.py",
        description=f"FedBN on the {task} task across hospital sites (fedbn-med).",
    )
    p.add_argument("--task", choices=TASK_NAMES, default=task,
                   help=f"what to train (default {task})")
    p.add_argument("--strategy", type=str.lower, default=None,
                   help=f"one of {', '.join(sorted(STRATEGIES))} (default fedbn)")
    p.add_argument("--mu", type=float, default=None, help="proximal weight (FedProx, FedBN+prox)")
    p.add_argument("--compare", nargs="?", default=None, const="",
                   help="run several strategies (comma-separated; alone: "
                        f"{','.join(settings_module(task).COMPARE)}) and print one table")
    p.add_argument("--folds", type=positive_int, default=None,
                   help=f"with --compare: test folds 0..N-1 (default all "
                        f"{RunSpec.n_folds})")
    p.add_argument("--seeds", type=positive_int, default=None,
                   help=f"with --compare: seeds per fold, from --seed on (default "
                        f"{COMPARE_SEEDS}); methods are compared cell by cell")
    p.add_argument("--rounds", type=positive_int, default=None,
                   help=f"communication rounds (default {d.get('rounds', 30)})")
    p.add_argument("--local-epochs", type=positive_int, default=None)
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help=f"examples per batch (default {d.get('batch_size', 32)})")
    p.add_argument("--lr", type=float, default=None,
                   help=f"SGD learning rate (default {d.get('lr', 1e-2):g})")
    p.add_argument("--dropout", type=float, default=None,
                   help=f"dropout of the ABIDE network (default {d.get('dropout', 0.0):g})")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--weighting", choices=WEIGHTINGS, default=None,
                   help="how the server averages shared weights: by training examples "
                        "(default) or every site alike (the FedBN paper's code)")
    p.add_argument("--bn-init", choices=BN_INITS, default=None,
                   help="where BN running statistics start: the site's own training data "
                        "(default) or PyTorch's 0 and 1")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch threads per site on the CPU (default 1); part of a result's "
                        "identity, as float sums round differently across threads")
    p.add_argument("--fold", type=int, default=None)
    p.add_argument("--sites", type=_sites, default=None,
                   help=f"comma-separated sites (default {','.join(d['sites'])})")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="the data root (default: each site's file, else the built-in data)")
    p.add_argument("--device", default=None,
                   help="auto (each site's setting, else a local GPU), cpu, cuda:N")
    dp = p.add_argument_group("client-level differential privacy (each site's own file "
                              "may demand more noise)")
    dp.add_argument("--dp-clip", type=float, default=None, metavar="C",
                    help="clip every site's update to L2 norm C")
    dp.add_argument("--dp-noise", type=float, default=None, metavar="SIGMA",
                    help="add Gaussian noise of std SIGMA*C to every clipped update")
    dp.add_argument("--dp-delta", type=float, default=None, metavar="DELTA",
                    help="delta of the reported (epsilon, delta) (default 1e-5)")
    dp.add_argument("--dp-seeded-noise", action="store_const", const=True, default=None,
                    help="draw the noise from the run's seed so that an experiment "
                         "repeats: NOT private, for experiments only")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a task setting: " + ", ".join(
                       f"{f}={getattr(own, f)!r}" for f in own.__dataclass_fields__))
    if hasattr(own, "image_size"):
        p.add_argument("--image-size", type=positive_int, default=None,
                       help=f"image edge (default {own.image_size})")
        p.add_argument("--subjects", type=positive_int, default=None,
                       help=f"subjects per built-in site (default {own.subjects})")
    p.add_argument("--engine", choices=("flower", "inprocess"),
                   default=settings_module(task).ENGINE,
                   help="flower: one process per site over Flower; inprocess: the reference "
                        f"driver in this process (default {settings_module(task).ENGINE})")
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
    hosp.add_argument("--site", type=_site_name, default=None,
                      help="run only this hospital's site")
    hosp.add_argument("--superlink", default=None, help="with --site: the server's HOST:PORT")
    hosp.add_argument("--state-dir", type=Path, default=None,
                      help="with --site: where the site keeps its private state")
    hosp.add_argument("--min-sites", type=int, default=None,
                      help="rounds go on with at least this many sites' accepted updates "
                           "(default: a majority of the sites)")
    hosp.add_argument("--wait-timeout", type=_seconds, default=None,
                      help="seconds to wait for sites before giving up (default "
                           f"{ServerSettings.wait_timeout:g})")
    hosp.add_argument("--round-timeout", type=_seconds, default=None,
                      help="seconds a round waits for a site's reply (default "
                           f"{ServerSettings.round_timeout:g})")
    hosp.add_argument("--share-private-layers", action="store_true",
                      help="with --site: let this site's private (BN) layers leave it when "
                           "the run's strategy sends them (default: refuse such runs)")
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


def _task_settings(args: argparse.Namespace) -> dict[str, Any]:
    own = task_defaults(args.task)["settings"]
    out: dict[str, Any] = {}
    for item in args.set:
        key, sep, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in own.__dataclass_fields__:
            raise ValueError(f"--set expects KEY=VALUE with KEY one of "
                             f"{', '.join(own.__dataclass_fields__)}; got '{item}'.")
        default = getattr(own, key)
        if isinstance(default, bool):
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"--set {key} expects true or false, got '{raw}'.")
            out[key] = raw.lower() in ("true", "1")
        else:
            try:
                out[key] = type(default)(raw)
            except ValueError:
                raise ValueError(f"--set {key} expects a {type(default).__name__}, got "
                                 f"'{raw}'.") from None
    for key in ("image_size", "subjects"):
        if getattr(args, key, None) is not None:
            out[key] = getattr(args, key)
    return out


def spec_from_args(args: argparse.Namespace, strategy: str | None = None,
                   fold: int | None = None) -> RunSpec:
    """Return the validated run spec the options describe (the only place they meet)."""
    given = {k: getattr(args, k) for k in _SPEC_OPTIONS if getattr(args, k) is not None}
    if strategy is not None:
        given["strategy"] = strategy
    if fold is not None:
        given["fold"] = fold
    return RunSpec.for_task(args.task, **given, **_task_settings(args))


def main(argv: Sequence[str] | None = None, task: str = "abide") -> int:
    """Run a pipeline; return the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = task
    if "--task" in argv[:-1]:
        chosen = argv[argv.index("--task") + 1]
    parser = build_parser(chosen if chosen in TASK_NAMES else task)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # SIGTERM stops everything this command started, as Ctrl-C does: both unwind through
    # the launcher's clean-up (every child process and its session).
    try:
        previous = signal.signal(signal.SIGTERM, _interrupt)
    except ValueError:  # not the main thread: the caller handles signals
        previous = None
    try:
        return _dispatch(args)
    except KeyboardInterrupt:
        print("\ninterrupted: every process this command started has been stopped",
              file=sys.stderr)
        return 130
    except (ValueError, TypeError, FileNotFoundError, ConnectionError, TimeoutError,
            RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one clean-up, not one per signal
    raise KeyboardInterrupt


def _server_options(args: argparse.Namespace) -> dict[str, Any]:
    """Return the server settings the user gave; the rest keep ServerSettings' defaults."""
    names = ("min_sites", "wait_timeout", "round_timeout")
    return {k: getattr(args, k) for k in names if getattr(args, k) is not None}


def _compare_list(args: argparse.Namespace) -> tuple[str, ...]:
    if args.compare is None:
        return ()
    names = tuple(s.strip().lower() for s in args.compare.split(",") if s.strip())
    return names or tuple(settings_module(args.task).COMPARE)


def _dispatch(args: argparse.Namespace) -> int:
    from fedbn_med.tasks import get_task
    from fedbn_med.tracking import default_tracking_uri

    spec = spec_from_args(args)  # validates every setting, and lists the valid values
    task = get_task(spec.task)
    if args.site is not None:
        task.check_sites([args.site])
        return _site_mode(args)
    task.check_sites(spec.sites)
    tracking_uri = args.tracking_uri or default_tracking_uri()
    workdir = _workdir(args)
    started = time.monotonic()
    if args.serve:
        return _serve_mode(args, spec, tracking_uri, workdir)
    compare = _compare_list(args)
    if not compare and (args.folds is not None or args.seeds is not None):
        raise ValueError("--folds and --seeds go with --compare; for one run, choose its "
                         "fold with --fold and its seed with --seed.")
    if compare:
        folds = range(args.folds or spec.n_folds)
        seeds = range(spec.seed, spec.seed + (args.seeds or COMPARE_SEEDS))
        specs = [spec_from_args(args, s, f).replace(seed=seed) for s in compare
                 for f in folds for seed in seeds]
    else:
        specs = [spec]
    results = _run_all(args, specs, tracking_uri, workdir)
    _print_results(specs, results, compare, tracking_uri, time.monotonic() - started)
    return 0


def _workdir(args: argparse.Namespace) -> Path:
    from fedbn_med.paths import resolve_data_dir

    if args.workdir is not None:
        return args.workdir.resolve()
    return resolve_data_dir() / "runs" / f"{args.task}-{time.strftime('%Y%m%d-%H%M%S')}"


def _run_all(args: argparse.Namespace, specs: list[RunSpec], tracking_uri: str,
             workdir: Path) -> list[dict]:
    from fedbn_med.federation.run import FlowerOptions, run_flower
    from fedbn_med.training.tracked_run import run_tracked

    local = [s for s in specs if s.strategy_obj().pooled or args.engine == "inprocess"]
    federated = [s for s in specs if s not in local]
    by_spec: dict[int, dict] = {}
    if federated:
        options = FlowerOptions(workdir=workdir, tracking_uri=tracking_uri,
                                **_server_options(args),
                                progress=not args.quiet)
        for spec, result in zip(federated, run_flower(federated, options)):
            by_spec[id(spec)] = result
    for spec in local:
        by_spec[id(spec)] = run_tracked(spec, tracking_uri=tracking_uri,
                                        progress=not args.quiet)
    return [by_spec[id(s)] for s in specs]


def _print_results(specs: list[RunSpec], results: list[dict], compare: tuple[str, ...],
                   tracking_uri: str, seconds: float) -> None:
    if compare:
        comparison = _comparison(specs, results)
        print("\n" + comparison.report())
        run_id = _log_comparison(specs, comparison, tracking_uri)
        print(f"\nMLflow: the comparison is run {run_id}, each strategy's runs beside it")
    else:
        spec = specs[0]
        print(f"\n{results[0]['strategy']} after {spec.rounds} rounds (test split, fold "
              f"{spec.fold}), % per site:\n")
        print(results[0]["table"])
    print(f"\nwall time {seconds:.1f} s; MLflow: mlflow ui --backend-store-uri {tracking_uri}")


def _comparison(specs: list[RunSpec], results: list[dict]) -> Comparison:
    from fedbn_med.evaluation.comparison import METRICS, Cell, Comparison

    # the task's scores (MRI: Dice), else the protocol's (balanced accuracy, AUC, ...)
    metrics = tuple(getattr(settings_module(specs[0].task), "METRICS", METRICS))
    comparison = Comparison(sites=tuple(specs[0].sites), n_folds=specs[0].n_folds,
                            metric_names=metrics)
    for spec, result in zip(specs, results):
        comparison.add(Cell.from_rows(spec.label, spec.fold, spec.seed, result["rows"],
                                      metrics=metrics))
    if specs[0].task == "abide":  # the majority-class and motion-only rows
        from fedbn_med.evaluation.comparison import add_reference_rows

        add_reference_rows(comparison, specs[0], dict.fromkeys((s.fold, s.seed)
                                                               for s in specs))
    return comparison


def _log_comparison(specs: list[RunSpec], comparison: Comparison, tracking_uri: str) -> str:
    """Log the comparison's tables and figures as one MLflow run; return its id."""
    from fedbn_med.evaluation.report import csv_text
    from fedbn_med.tasks import get_task
    from fedbn_med.tracking import FederationTracker

    first = specs[0]
    params = {**first.params(), "strategy": ",".join(comparison.strategies),
              "folds": len({s.fold for s in specs}), "seeds": len({s.seed for s in specs}),
              "seed": ",".join(str(s) for s in sorted({s.seed for s in specs})),
              "fold": "all", "strategy_label": "compare"}
    tracker = FederationTracker(get_task(first.task).experiment, "compare", params, sites=(),
                                tracking_uri=tracking_uri,
                                tags={"task": first.task, "kind": "compare"})
    try:
        tracker.log_metrics(comparison.metrics())
        tracker.log_text(comparison.report() + "\n", "compare.md")
        tracker.log_text(csv_text(comparison.rows()), "cells.csv")
    except BaseException:
        tracker.finish("FAILED")
        raise
    tracker.finish()
    return tracker.parent_id


def _serve_mode(args: argparse.Namespace, spec: RunSpec, tracking_uri: str,
                workdir: Path) -> int:
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
                            port=int(port), tls=tls, **_server_options(args),
                            node_auth=tls is not None,
                            resume=args.resume,
                            allow_join=args.allow_join, federation_id="serve",
                            progress=not args.quiet)
    result = serve(spec, options)
    print(result["table"])
    return 0


def _site_mode(args: argparse.Namespace) -> int:
    from fedbn_med.federation.run import run_site
    from fedbn_med.paths import resolve_data_dir

    if not args.superlink:
        raise ValueError("--site needs --superlink HOST:PORT of the federation server.")
    state_dir = args.state_dir or resolve_data_dir() / "site_state"
    run_site(args.site, args.superlink, state_dir=state_dir, data_dir=args.data_dir,
             device=args.device or "auto", root_certificates=args.root_certificates,
             auth_key=args.auth_key, insecure=args.insecure,
             max_wait_time=args.wait_timeout or ServerSettings.wait_timeout,
             share_private=args.share_private_layers)
    return 0
