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

This module dispatches to the mode and runs the federations; the options and the spec
they describe are :mod:`fedbn_med.cli.parser`, the multi-host modes
:mod:`fedbn_med.cli.hosts`, what is printed and logged at the end
:mod:`fedbn_med.cli.results`.
"""

from __future__ import annotations

import fedbn_med.numerics.pinned  # noqa: F401  (first: numpy reads its pin when it loads)

# isort: split
import argparse
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedbn_med.cli.hosts import serve_mode, site_mode
from fedbn_med.cli.parser import (
    COMPARE_SEEDS,
    build_parser,
    compare_list,
    server_options,
    spec_from_args,
)
from fedbn_med.cli.results import print_results
from fedbn_med.federation.telemetry import telemetry_off
from fedbn_med.numerics.cores import usable_cores
from fedbn_med.spec import RunSpec

if TYPE_CHECKING:
    from fedbn_med.api.result import FederationResult

__all__ = ["build_parser", "console_logging", "main"]


def console_logging() -> None:
    """Print warnings and errors of any logger, whatever level a library set it to.

    Flower sets its own logger to DEBUG (its SecAgg+ mod logs every stage there); a
    hospital site's console shows what the site sent, not that. A process that already
    has handlers (a test run) keeps them as they are.
    """
    root = logging.getLogger()
    own_console = not root.handlers
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if own_console:
        root.handlers[0].setLevel(logging.WARNING)


def main(argv: Sequence[str] | None = None, task: str = "abide") -> int:
    """Run a pipeline; return the process exit code."""
    telemetry_off()  # before MLflow or Flower loads here or in a process started from here
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(task).parse_args(argv)
    if args.sites_dir is not None:  # read by every process this command starts, too
        os.environ["FEDBN_MED_SITES"] = str(args.sites_dir)
    console_logging()
    # SIGTERM stops everything this command started, as Ctrl-C does: both unwind through
    # the launcher's clean-up (every child process and its session).
    try:
        previous = signal.signal(signal.SIGTERM, _interrupt)
    except ValueError:  # not the main thread: the caller handles signals
        previous = None
    try:
        usable_cores()  # a bad FEDBN_MED_CORES is refused before any data are prepared
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


def _dispatch(args: argparse.Namespace) -> int:
    from fedbn_med.paths import default_tracking_uri
    from fedbn_med.tasks import get_task

    spec = spec_from_args(args)  # validates every setting, and lists the valid values
    task = get_task(spec.task)
    if args.site is not None:
        task.check_sites([args.site])
        return site_mode(args)
    task.check_sites(spec.sites)
    tracking_uri = args.tracking_uri or default_tracking_uri()
    workdir = _workdir(args)
    started = time.monotonic()
    if args.serve:
        return serve_mode(args, spec, tracking_uri, workdir)
    if args.secagg and args.engine != "flower":
        raise ValueError(f"--secagg aggregates over Flower; got --engine {args.engine}. Use "
                         "--engine flower (or --serve), or drop --secagg.")
    compare = compare_list(args)
    if not compare and (args.folds is not None or args.seeds is not None
                        or args.workers is not None):
        raise ValueError("--folds, --seeds and --workers go with --compare; for one run, "
                         "choose its fold with --fold and its seed with --seed.")
    if compare:
        folds = range(args.folds or spec.n_folds)
        seeds = range(spec.seed, spec.seed + (args.seeds or COMPARE_SEEDS))
        specs = [spec_from_args(args, s, f).replace(seed=seed) for s in compare
                 for f in folds for seed in seeds]
    else:
        specs = [spec]
    results = _run_all(args, specs, tracking_uri, workdir)
    print_results(specs, results, compare, tracking_uri, time.monotonic() - started)
    return 0


def _workdir(args: argparse.Namespace) -> Path:
    from fedbn_med.paths import resolve_data_dir

    if args.workdir is not None:
        return args.workdir.resolve()
    return resolve_data_dir() / "runs" / f"{args.task}-{time.strftime('%Y%m%d-%H%M%S')}"


def _run_all(args: argparse.Namespace, specs: list[RunSpec], tracking_uri: str,
             workdir: Path) -> list[FederationResult]:
    """Run the command's specs through :func:`fedbn_med.run`: one run, or a comparison."""
    from fedbn_med.api.run import run

    options: dict[str, Any] = dict(engine=args.engine, tracking_uri=tracking_uri,
                                   progress=not args.quiet, server=server_options(args))
    if compare_list(args):
        return run(specs, workdir=workdir if args.engine == "flower" else None,
                   workers=args.workers, **options)
    return [run(specs[0], workdir=workdir, **options)]
