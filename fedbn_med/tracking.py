"""Experiment tracking in MLflow: the only module that imports mlflow.

Layout of a federation in the store: one experiment per pipeline; one parent run per
federation holding its parameters, the rounds each site took part in, the results
table, the convergence plot and the final shared weights; one child run per site,
tagged with the site, holding that site's metrics at ``step = round``.

Site-private tensors are never logged here: only metrics and the shared weights the
server already holds reach the store.
"""

from __future__ import annotations

import logging
import math
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
from mlflow.entities import Metric, Param
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from safetensors.torch import save_file

import mlflow
from fedbn_med.paths import default_tracking_uri, repo_root, runs_page, seed_store, sqlite_file

__all__ = ["ROUND_PREFIX", "SITES_PER_ROUND", "FederationTracker", "default_tracking_uri",
           "end_status", "read_sites_per_round", "runs_page", "tracked", "warm_up"]

logger = logging.getLogger(__name__)

_REPO = repo_root()
_BATCH = 1000  # MLflow takes at most 1000 metrics per batch
#: where the parent run's curves over rounds are (its headline is the selected round's)
ROUND_PREFIX = "by_round/"
EXPERIMENT_KIND = "mlflow.experimentKind"  #: the tag of the view MLflow 3 opens an experiment on
_TRAINING = "custom_model_development"  #: that tag's value for runs of model training
SITES_PER_ROUND = "sites_per_round.csv"  #: which sites took part in each round
#: the tables that also become the parent run's description, cut to MLflow's tag length
_HEADLINES, _NOTE_MAX = ("results.md", "compare.md", "onboarding.md"), 7000


def read_sites_per_round(tracking_uri: str, run_id: str) -> dict[int, list[str]]:
    """Return ``{round: sites}`` of a finished federation's parent run."""
    with tempfile.TemporaryDirectory() as tmp:
        text = Path(MlflowClient(tracking_uri=tracking_uri).download_artifacts(
            run_id, SITES_PER_ROUND, tmp)).read_text()
    rows = (line.partition(",") for line in text.splitlines()[1:])
    return {int(rnd): sites.split() for rnd, _, sites in rows}


def warm_up(tracking_uri: str | None = None) -> None:
    """Open the store once (creating or migrating its database) so later calls are quick."""
    uri = tracking_uri or default_tracking_uri()
    seed_store(uri)
    MlflowClient(tracking_uri=uri).search_experiments(max_results=1)


def _code_version() -> str:
    try:
        out = subprocess.run(["git", "-C", str(_REPO), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=5, check=False)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _numerics() -> str:
    """Return this process's CPU code path, e.g. ``pinned (torch AVX2, MKL_CBWR COMPATIBLE)``."""
    from fedbn_med.numerics import describe

    found = describe()
    return f"{found['mode']} (torch {found['torch_capability']}, MKL_CBWR " \
           f"{found['MKL_CBWR'] or 'unset'})"


def _finite_metrics(metrics: Mapping[str, float], step: int, ts: int) -> list[Metric]:
    return [Metric(key, float(value), ts, step) for key, value in metrics.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)]


class FederationTracker:
    """Log one federation to MLflow as a parent run with a child run per site.

    Parameters
    ----------
    experiment : str
        Experiment name (one per pipeline, e.g. ``"abide-fedbn"``).
    run_name : str
        Name of the parent run (e.g. ``"fedbn"``).
    params : mapping
        Hyper-parameters logged on the parent run.
    sites : iterable of str
        Site names; one child run each.
    tracking_uri : str, optional
        Where the store is; defaults to :func:`default_tracking_uri`.
    parent_run_id : str, optional
        Resume this parent run (and its child runs) instead of creating new ones.
    start_time : int, optional
        When the federation began (ms since the epoch), if before its runs are made.
    """

    def __init__(
        self,
        experiment: str,
        run_name: str,
        params: Mapping[str, object],
        sites: Iterable[str],
        *,
        tracking_uri: str | None = None,
        parent_run_id: str | None = None,
        tags: Mapping[str, str] | None = None,
        start_time: int | None = None,
    ) -> None:
        self.start_time = start_time  # ms since the epoch: when the run began (None: now)
        self.tracking_uri = tracking_uri or default_tracking_uri()
        seed_store(self.tracking_uri)
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        self.experiment_id = self._experiment(experiment)
        self.sites = list(sites)
        self.site_runs: dict[str, str] = {}
        self.dedupe_next = False
        if parent_run_id is not None:
            self.parent_id = parent_run_id
            self._find_children()
        else:
            run_name = _title(run_name, self.sites, params)
            run_tags = {"mlflow.runName": run_name, "code_version": _code_version(),
                        "numerics": _numerics(), "sites": ",".join(self.sites),
                        "kind": "federation", **(tags or {})}
            parent = self.client.create_run(self.experiment_id, tags=run_tags,
                                            run_name=run_name, start_time=start_time)
            self.parent_id = parent.info.run_id
            self.client.log_batch(
                self.parent_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()]
            )
        for site in self.sites:
            if site not in self.site_runs:
                self.add_site(site)

    def _experiment(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            if EXPERIMENT_KIND not in found.tags:  # a store made before the kind was set
                self.client.set_experiment_tag(found.experiment_id, EXPERIMENT_KIND, _TRAINING)
            return found.experiment_id
        location = None
        store = sqlite_file(self.tracking_uri)
        if store is not None:  # artifacts beside the db, not in cwd
            root = store.parent / "artifacts"
            root.mkdir(parents=True, exist_ok=True)
            location = root.as_uri()
        try:  # of no kind, MLflow 3 opens an experiment on its GenAI overview: ours are runs
            return self.client.create_experiment(name, artifact_location=location,
                                                 tags={EXPERIMENT_KIND: _TRAINING})
        except MlflowException:  # made meanwhile by another process (cells run in parallel)
            return self._experiment(name)

    def _find_children(self) -> None:
        runs = self.client.search_runs(
            [self.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{self.parent_id}'"
        )
        for run in runs:
            site = run.data.tags.get("site")
            if site:
                self.site_runs[site] = run.info.run_id

    def add_site(self, site: str, *, first_round: int = 1) -> str:
        """Create the child run of a site (also for a site that joins later)."""
        run = self.client.create_run(
            self.experiment_id, run_name=f"site-{site}",
            start_time=self.start_time if first_round == 1 else None,  # a late site: now
            tags={"mlflow.parentRunId": self.parent_id, "site": site,
                  "first_round": str(first_round), "kind": "site"},
        )
        self.site_runs[site] = run.info.run_id
        if site not in self.sites:
            self.sites.append(site)
        return run.info.run_id

    def log_round(self, rnd: int, site_metrics: Mapping[str, Mapping[str, float]]) -> None:
        """Log each site's metrics at ``step = rnd`` and which sites took part."""
        self.log_rounds([(rnd, site_metrics)])

    def log_rounds(self, rounds: Sequence[tuple[int, Mapping[str, Mapping[str, float]]]]
                   ) -> None:
        """Log several rounds at once: one write per run rather than one per round.

        The parent run's metrics go last: a round whose ``sites_participating`` is in the
        store is complete there (see :meth:`log_missing_rounds`).
        """
        if not rounds:
            return
        ts = int(time.time() * 1000)
        dedupe, self.dedupe_next = self.dedupe_next, False
        per_run: dict[str, list[Metric]] = {}
        parent: list[Metric] = []
        for i, (rnd, site_metrics) in enumerate(rounds):
            for site, metrics in site_metrics.items():
                run_id = self.site_runs.get(site) or self.add_site(site, first_round=rnd)
                batch = _finite_metrics(metrics, rnd, ts)
                if dedupe and i == 0:  # after a resume: never log a (metric, round) twice
                    logged = {m.key for m in batch for h in self.client.get_metric_history(
                        run_id, m.key) if h.step == rnd}
                    batch = [m for m in batch if m.key not in logged]
                per_run.setdefault(run_id, []).extend(batch)
            # the curves over rounds sit under by_round/: the parent's headline metrics
            # (mean_*) are the selected round's, logged once the run ends (log_result)
            parent += [Metric("sites_participating", float(len(site_metrics)), ts, rnd),
                       *_finite_metrics({f"{ROUND_PREFIX}{k}": v for k, v in
                                         _mean_metrics(site_metrics).items()}, rnd, ts)]
        for run_id, batch in per_run.items():
            for start in range(0, len(batch), _BATCH):
                self.client.log_batch(run_id, metrics=batch[start:start + _BATCH])
        for start in range(0, max(len(parent), 1), _BATCH):
            self.client.log_batch(self.parent_id, metrics=parent[start:start + _BATCH])

    def log_missing_rounds(self, rows: Iterable[Mapping[str, object]]) -> list[int]:
        """Log the rounds of ``rows`` that the store lacks (after a crash); return them.

        A round is complete in the store once its parent metric ``sites_participating`` is
        there (it is written last); a round cut short is completed without writing any
        (metric, round) twice.
        """
        logged = {m.step for m in self.client.get_metric_history(self.parent_id,
                                                                 "sites_participating")}
        by_round: dict[int, dict[str, dict[str, float]]] = {}
        for row in rows:
            rnd = int(row["round"])  # type: ignore[call-overload]
            metrics = {k: v for k, v in row.items() if k not in ("round", "site")}
            by_round.setdefault(rnd, {})[str(row["site"])] = metrics  # type: ignore[assignment]
        missing = sorted(set(by_round) - logged)
        for rnd in missing:
            self.dedupe_next = True
            self.log_round(rnd, by_round[rnd])
        return missing

    def log_metrics(self, metrics: Mapping[str, float]) -> None:
        """Log summary figures (the numeric ones) on the parent run, at step 0."""
        batch = _finite_metrics(metrics, 0, int(time.time() * 1000))
        for start in range(0, len(batch), _BATCH):
            self.client.log_batch(self.parent_id, metrics=batch[start:start + _BATCH])

    def log_result(self, rows: Sequence[Mapping[str, object]], selected_round: int,
                   last_round: int) -> None:
        """Log a finished run's headline on the parent run, as the console prints it.

        ``mean_<metric>`` are the site means at ``selected_round`` (the run's result, the
        console table's mean row); ``last_round.mean_<metric>`` the same at the last round;
        ``sites_per_round.csv`` says which sites took part in each round.
        """
        by_round: dict[int, dict[str, dict[str, float]]] = {}
        for r in rows:
            by_round.setdefault(int(r["round"]), {})[str(r["site"])] = {  # type: ignore[call-overload]
                k: float(v) for k, v in r.items() if k not in ("round", "site")}  # type: ignore[arg-type]
        last = {f"last_round.{k}": v for k, v in _mean_metrics(by_round[last_round]).items()}
        self.log_metrics({"selected_round": selected_round, "last_round": last_round,
                          **_mean_metrics(by_round[selected_round]), **last})
        self.log_text("round,sites\n" + "".join(f"{rnd},{' '.join(sorted(sites))}\n"
                                                for rnd, sites in sorted(by_round.items())),
                      SITES_PER_ROUND)

    def log_text(self, text: str, artifact_file: str) -> None:
        """Store a text artifact on the parent run; a headline table is its description too."""
        self.client.log_text(self.parent_id, text, artifact_file)
        if artifact_file in _HEADLINES:  # MLflow shows a run's description first on its page
            tables, end, said = text.rpartition("|\n")  # what the tables say first, then them
            text = f"{said.strip()}\n\n{tables}{end}" if tables and said.strip() else text
            # markdown: "<site>" would be taken for an HTML tag and not shown
            text = text.replace("<", "\\<")
            note = text if len(text) <= _NOTE_MAX else (
                text[:_NOTE_MAX].rsplit("\n", 1)[0] + f"\n\n(The whole table: {artifact_file}.)")
            self.client.set_tag(self.parent_id, "mlflow.note.content", note)

    def log_file(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Store a file (a plot) on the parent run."""
        self.client.log_artifact(self.parent_id, str(path), artifact_path)

    def log_shared_weights(self, weights: Mapping[str, torch.Tensor],
                           private_keys: Iterable[str] = (), artifact_path: str = "model"
                           ) -> None:
        """Store global weights as safetensors under ``artifact_path``; refuse private keys.

        ``model``: the last round's; ``model/selected``: the selected round's.
        """
        leaked = set(weights) & set(private_keys)
        if leaked:
            raise ValueError(f"Refusing to log site-private tensors: {sorted(leaked)[:5]}.")
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "shared_weights.safetensors"
            save_file({k: v.contiguous().cpu() for k, v in weights.items()}, str(path))
            self.client.log_artifact(self.parent_id, str(path), artifact_path)

    def finish(self, status: str = "FINISHED") -> None:
        """Close the parent and child runs with ``status`` (:func:`tracked` calls this)."""
        for run_id in self.site_runs.values():
            self.client.set_terminated(run_id, status)
        self.client.set_terminated(self.parent_id, status)


def end_status(error: BaseException | None) -> str:
    """Return the MLflow status a run ends with when ``error`` (None: none) ended it.

    ``FINISHED`` without an error; ``KILLED`` when it was stopped from outside (Ctrl-C's
    ``KeyboardInterrupt``, or the ``SystemExit`` a signal handler raises); ``FAILED`` on
    any other exception.
    """
    if error is None:
        return "FINISHED"
    return "KILLED" if isinstance(error, (KeyboardInterrupt, SystemExit)) else "FAILED"


@contextmanager
def tracked(
    experiment: str,
    run_name: str,
    params: Mapping[str, object],
    sites: Iterable[str] = (),
    *,
    tracking_uri: str | None = None,
    parent_run_id: str | None = None,
    tags: Mapping[str, str] | None = None,
    start_time: int | None = None,
) -> Iterator[FederationTracker]:
    """Open a :class:`FederationTracker` and close its runs however the block ends.

    The parameters are the tracker's. The runs end ``FINISHED`` when the block completes,
    ``KILLED`` when it is interrupted and ``FAILED`` on any other exception (see
    :func:`end_status`); the exception goes on. Every place in this package that starts
    runs opens them here, so that no error leaves a run ``RUNNING``.

    Example::

        with tracked("abide-fedbn", "fedbn", {"rounds": 3}, ["UCLA"]) as tracker:
            tracker.log_round(1, {"UCLA": {"test_accuracy": 0.6}})
    """
    tracker = FederationTracker(experiment, run_name, params, sites, tracking_uri=tracking_uri,
                                parent_run_id=parent_run_id, tags=tags, start_time=start_time)
    try:
        yield tracker
    except BaseException as err:
        try:
            tracker.finish(end_status(err))
        except Exception:  # the store's own failure must not hide the run's
            logger.warning("Could not mark MLflow run %s %s", tracker.parent_id,
                           end_status(err), exc_info=True)
        raise
    tracker.finish()


def _title(label: str, sites: Sequence[str], params: Mapping[str, object]) -> str:
    """Name a federation's run by what ran: ``fedbn · NYU,UM · flower · 2026-12-06 04:05``."""
    engine = params.get("engine")
    if not sites or engine is None:
        return label
    where = ",".join(sites) if len(sites) <= 4 else f"{len(sites)} sites"
    if params.get("federation_id") == "serve":
        engine = "hospital mode"
    return f"{label} · {where} · {engine} · {time.strftime('%Y-%m-%d %H:%M')}"


def _mean_metrics(site_metrics: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    out = {}
    for key in ("test_accuracy", "test_balanced_accuracy", "test_auc", "test_f1", "test_dice",
                "val_loss", "train_loss"):
        vals = [float(m[key]) for m in site_metrics.values()
                if key in m and not math.isnan(float(m[key]))]
        out.update({f"mean_{key}": round(sum(vals) / len(vals), 6)} if vals else {})  # no noise
    return out


# Keep mlflow quiet about its own housekeeping.
logging.getLogger("mlflow").setLevel(logging.WARNING)
_ = mlflow  # imported so that a missing install fails at import time, not mid-run
