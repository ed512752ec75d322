"""The command line's options: the parser, and the run spec and settings they describe.

Options left out take the run spec's defaults (:mod:`fedbn_med.spec` and the task's
``settings.py``); the parser holds no default of its own for a training setting.
:func:`spec_from_args` is the only place the options meet the spec. Nothing heavy is
imported here, so that ``--help`` answers at once.
"""

from __future__ import annotations

import argparse
from typing import Any

from fedbn_med.cli.argtypes import absolute_path, positive_int
from fedbn_med.federation.config import ServerSettings
from fedbn_med.federation.names import NAME_RULE, is_plain_name
from fedbn_med.fl.registry import STRATEGIES
from fedbn_med.fl.weighting import WEIGHTINGS
from fedbn_med.spec import BN_INITS, RunSpec, settings_module, task_defaults

__all__ = ["COMPARE_SEEDS", "build_parser", "compare_list", "server_options", "spec_from_args",
           "task_settings"]

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
    if not is_plain_name(text):
        raise argparse.ArgumentTypeError(f"a site's name is {NAME_RULE} (it names its file "
                                         f"in sites/), got '{text}'")
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
    """Return the argument parser of one task's pipeline; ``task`` sets the defaults shown.

    The options come in groups (data, training, federation, privacy, hospital mode,
    tracking and output), and every one says what it does and its default.
    """
    d = task_defaults(task)
    own = d["settings"]
    engine = settings_module(task).ENGINE
    p = argparse.ArgumentParser(
        prog=f"{task}_fedbn.py", allow_abbrev=False,
        description=f"FedBN on the {task} task across hospital sites (fedbn-med). Without "
                    "--serve or --site, the whole federation runs on this host.",
    )
    p.set_defaults(task=task)

    data = p.add_argument_group("data")
    data.add_argument("--sites", type=_sites, default=None,
                      help=f"comma-separated sites, each a file in sites/ (default "
                           f"{','.join(d['sites'])})")
    data.add_argument("--data-dir", type=absolute_path, default=None,
                      help="every site's data root (default: each site's file, else the "
                           "built-in data, made on first use)")
    data.add_argument("--sites-dir", type=absolute_path, default=None,
                      help="a folder of your own site files (default: $FEDBN_MED_SITES, else "
                           "the files the package ships)")
    data.add_argument("--fold", type=int, default=None,
                      help=f"the test fold of each site's split, 0 to {RunSpec.n_folds - 1} "
                           "(default 0)")
    data.add_argument("--seed", type=int, default=None,
                      help="seed of the run: the model's start and, from 1 on, a re-drawn "
                           "split (a repetition) (default 0)")
    if hasattr(own, "image_size"):
        data.add_argument("--image-size", type=positive_int, default=None,
                          help=f"image edge of the built-in sites (default {own.image_size})")
        data.add_argument("--subjects", type=positive_int, default=None,
                          help=f"subjects per built-in site (default {own.subjects})")

    train = p.add_argument_group("training")
    train.add_argument("--strategy", type=str.lower, default=None,
                       help=f"one of {', '.join(sorted(STRATEGIES))} (default fedbn)")
    train.add_argument("--rounds", type=positive_int, default=None,
                       help=f"communication rounds (default {d.get('rounds', 30)})")
    train.add_argument("--local-epochs", type=positive_int, default=None,
                       help=f"epochs each site trains per round (default "
                            f"{d.get('local_epochs', 1)})")
    train.add_argument("--batch-size", type=positive_int, default=None,
                       help=f"examples per batch (default {d.get('batch_size', 32)})")
    train.add_argument("--lr", type=float, default=None,
                       help=f"learning rate (default {d.get('lr', 1e-2):g})")
    train.add_argument("--dropout", type=float, default=None,
                       help=f"dropout of the task's network (default {d.get('dropout', 0.0):g})")
    train.add_argument("--mu", type=float, default=None,
                       help="proximal weight of FedProx and FedBN+prox")
    train.add_argument("--bn-init", choices=BN_INITS, default=None,
                       help="where BN running statistics start: the site's own training "
                            "data (default) or PyTorch's 0 and 1")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="a task setting: " + ", ".join(
                           f"{f}={getattr(own, f)!r}" for f in own.__dataclass_fields__))
    train.add_argument("--device", default=None,
                       help="auto (each site's setting, else a local GPU), cpu, cuda:N")
    train.add_argument("--threads", type=positive_int, default=None,
                       help="torch threads per site on the CPU (default 1); part of a "
                            "result's identity, as float sums round differently across threads")
    train.add_argument("--compare", nargs="?", default=None, const="",
                       help="run several strategies (comma-separated; alone: "
                            f"{','.join(settings_module(task).COMPARE)}) on every (fold, seed) "
                            "cell and print one table")
    train.add_argument("--folds", type=positive_int, default=None,
                       help=f"with --compare: test folds 0..N-1 (default all {RunSpec.n_folds})")
    train.add_argument("--seeds", type=positive_int, default=None,
                       help=f"with --compare: seeds per fold, from --seed on (default "
                            f"{COMPARE_SEEDS}); methods are compared cell by cell")
    train.add_argument("--workers", type=positive_int, default=None,
                       help="with --compare --engine inprocess (ABIDE): processes that run "
                            "the (fold, seed) cells at once (default: the cores, at most the "
                            "cells); the numbers do not depend on it")

    fed = p.add_argument_group("federation")
    fed.add_argument("--engine", choices=("flower", "inprocess"), default=engine,
                     help="flower: one process per site over Flower; inprocess: the reference "
                          f"driver in this process (default {engine})")
    fed.add_argument("--weighting", choices=WEIGHTINGS, default=None,
                     help="how the server averages shared weights: by training examples "
                          "(default) or every site alike (the FedBN paper's code)")
    fed.add_argument("--min-sites", type=int, default=None,
                     help="rounds go on with at least this many sites' accepted updates "
                          "(default: a majority of the sites)")
    fed.add_argument("--wait-timeout", type=_seconds, default=None,
                     help="seconds to wait for sites (or, at a site, for the server) before "
                          f"giving up (default {ServerSettings.wait_timeout:g})")
    fed.add_argument("--round-timeout", type=_seconds, default=None,
                     help="seconds a round waits for a site's reply (default "
                          f"{ServerSettings.round_timeout:g})")
    fed.add_argument("--secagg", action="store_const", const=True, default=None,
                     help="secure aggregation (SecAgg+): the server sees only the sum of the "
                          "sites' updates (FedBN: BN stays home). With --site: this site "
                          "accepts it (or secure_aggregation = true in its site file)")

    dp = p.add_argument_group("privacy: client-level differential privacy (each site's own "
                              "file may demand more noise)")
    dp.add_argument("--dp-clip", type=float, default=None, metavar="C",
                    help="clip every site's update to L2 norm C")
    dp.add_argument("--dp-noise", type=float, default=None, metavar="SIGMA",
                    help="add Gaussian noise of std SIGMA*C to every clipped update")
    dp.add_argument("--dp-delta", type=float, default=None, metavar="DELTA",
                    help="delta of the reported (epsilon, delta) (default 1e-5)")
    dp.add_argument("--dp-seeded-noise", action="store_const", const=True, default=None,
                    help="draw the noise from the run's seed so that an experiment "
                         "repeats: NOT private, for experiments only")

    hosp = p.add_argument_group("hospital mode: one server, each site on its own host")
    hosp.add_argument("--serve", action="store_true",
                      help="run the federation server and wait for the sites")
    hosp.add_argument("--listen", default="127.0.0.1:9092",
                      help="with --serve: HOST:PORT to bind (default 127.0.0.1:9092)")
    hosp.add_argument("--tls-dir", type=absolute_path, default=None,
                      help="with --serve: the folder made by pipelines/consortium_keys.py "
                           "(TLS, and only the sites whose key is listed there may join)")
    hosp.add_argument("--resume", action="store_true",
                      help="with --serve: continue from the last global checkpoint")
    hosp.add_argument("--allow-join", action="store_true",
                      help="with --serve: let new sites join the running federation")
    hosp.add_argument("--site", type=_site_name, default=None,
                      help="run only this hospital's site")
    hosp.add_argument("--superlink", default=None, help="with --site: the server's HOST:PORT")
    hosp.add_argument("--root-certificates", type=absolute_path, default=None,
                      help="with --site: the consortium CA certificate, ca.pem (TLS)")
    hosp.add_argument("--auth-key", type=absolute_path, default=None,
                      help="with --site: this site's private key (node authentication)")
    hosp.add_argument("--state-dir", type=absolute_path, default=None,
                      help="with --site: where the site keeps its private state (default "
                           "<data dir>/site_state/<SITE>)")
    hosp.add_argument("--keep-serving", action="store_true",
                      help="with --site: after a federation ends, wait for the next one "
                           "(default: the site exits 0 when its federation ends)")
    hosp.add_argument("--share-private-layers", action="store_true",
                      help="with --site: let this site's private (BN) layers leave it when "
                           "the run's strategy sends them (default: refuse such runs)")
    hosp.add_argument("--insecure", action="store_true",
                      help="allow a connection without TLS to or from another host")

    out = p.add_argument_group("tracking and output")
    out.add_argument("--tracking-uri", default=None,
                     help="MLflow store (default: $MLFLOW_TRACKING_URI, else "
                          "./mlflow/mlflow.db)")
    out.add_argument("--workdir", type=absolute_path, default=None,
                     help="logs, checkpoints and results (default: <data dir>/runs/<time>)")
    out.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def task_settings(args: argparse.Namespace) -> dict[str, Any]:
    """Return the task settings that ``--set KEY=VALUE`` (and the imaging options) give."""
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
    return RunSpec.for_task(args.task, **given, **task_settings(args))


def server_options(args: argparse.Namespace) -> dict[str, Any]:
    """Return the server settings the user gave; the rest keep ServerSettings' defaults."""
    names = ("min_sites", "wait_timeout", "round_timeout", "secagg")
    return {k: getattr(args, k) for k in names if getattr(args, k) is not None}


def compare_list(args: argparse.Namespace) -> tuple[str, ...]:
    """Return the strategies ``--compare`` names (alone: the task's ``COMPARE``), or none."""
    if args.compare is None:
        return ()
    names = tuple(s.strip().lower() for s in args.compare.split(",") if s.strip())
    return names or tuple(settings_module(args.task).COMPARE)
