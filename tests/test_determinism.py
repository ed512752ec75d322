"""The same command and seed give the same numbers: on any thread count, on either engine.

Each run is the real CLI in a fresh process whose ``OMP_NUM_THREADS`` (and so torch's
default thread count, and the BLAS threads of the data stack) differs: 1 or 2.

- Centralized in-process on the built-in cohort, 1 vs 2 threads: the first run also
  generates its own copy of the cohort and computes its own features, so the whole path
  from the generator to the results table is covered.
- FedBN over a long run on a small release shaped like the real ABIDE Preprocessed one
  (:func:`write_release`): Flower on 1 thread, in-process, Flower on 2 threads. The final
  shared weights are compared bit for bit, and the run is long enough that a difference
  of one bit in one weight would have grown into a visible one (checked in-process).
  Flower once summed the sites' updates in the order their replies arrived; float sums
  depend on that order, and over tens of rounds the models drifted apart.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from .stores import sqlite_store

ROOT = Path(__file__).resolve().parents[1]
SITES = "USM,UCLA"  # the two smallest default sites: a quick cohort
#: Sites of the real-shaped release (their files are in sites/) and their subjects.
RELEASE_SITES = {"PITT": 19, "YALE": 17, "KKI": 15}
#: Rounds of the long run: enough that one bit in one weight grows (see the last test).
LONG_ROUNDS = 30
#: Rounds of the Flower runs: fewer, for the suite's time; the order of the sums, the
#: cause found on real sites, is checked over every order in test_aggregation_order.py.
#: The final weights are compared bit for bit: one ulp more in the first layer at the
#: start leaves some 80 000 of them different after 4 rounds already (in process, on
#: this release; the recorded, rounded losses stayed equal through 12 rounds).
FLOWER_ROUNDS = 6
_QC = ("qc_rater_1", "qc_anat_rater_2", "qc_func_rater_2", "qc_anat_rater_3",
       "qc_func_rater_3")


def write_release(root: Path, sites: dict[str, int], seed: int = 0) -> Path:
    """Write a small ABIDE Preprocessed release shaped like the real one; return ``root``.

    The layout, header and number format are the release's (``<FILE_ID>_rois_ho.1D``,
    ``#<label>`` header of the 111 Harvard-Oxford labels, 6 decimals, tab-separated), and
    so are its quirks: odd row counts that differ by subject and by site, unscaled series
    (each ROI its own amplitude, between 5 and 60 as in C-PAC's output), the 2-voxel
    ROI 3455 all zero in one subject of five, and a ``no_filename`` row in the table.
    """
    from fedbn_med.tasks.abide.data.atlas import HO_LABELS

    rng = np.random.default_rng(seed)
    n_rois = len(HO_LABELS)
    zero_roi = HO_LABELS.index(3455)
    series_dir = root / "ABIDE_pcp" / "cpac" / "filt_noglobal"
    series_dir.mkdir(parents=True)
    header = "\t".join(f"#{label}" for label in HO_LABELS)
    mixing = rng.normal(size=(n_rois, 6))  # networks every subject shares
    asd_rois = rng.choice(n_rois, 12, replace=False)
    rows: list[dict[str, object]] = []
    sub_id = 50000
    for k, (site, n) in enumerate(sites.items()):
        gain = rng.uniform(5.0, 60.0, n_rois)  # the site's scanner, per ROI
        for i in range(n):
            sub_id += 1
            asd = i % 2 == 0
            volumes = 117 + 34 * k + 2 * int(rng.integers(-3, 4))  # always odd
            latent = rng.normal(size=(volumes, 6))
            x = latent @ mixing.T + rng.normal(size=(volumes, n_rois)) * (1.0 + 0.3 * k)
            if asd:
                x[:, asd_rois] += 0.4 * latent[:, :1]
            x *= gain
            if i % 5 == 1:
                x[:, zero_roi] = 0.0
            file_id = f"{site}_{sub_id:07d}"
            body = "\n".join("\t".join(f"{v:.6f}" for v in row) for row in x)
            (series_dir / f"{file_id}_rois_ho.1D").write_text(f"{header}\n{body}\n",
                                                              encoding="utf-8")
            rows.append({"SUB_ID": sub_id, "SITE_ID": site, "FILE_ID": file_id,
                         "DX_GROUP": 1 if asd else 2, "AGE_AT_SCAN": 10.0 + i % 15,
                         "SEX": 1 + int(i % 4 == 0), "func_mean_fd": 0.05 + 0.01 * (i % 7),
                         **{q: "OK" for q in _QC}})
    rows.append({**rows[-1], "SUB_ID": sub_id + 1, "FILE_ID": "no_filename"})
    table = pd.DataFrame(rows)
    table.insert(0, "Unnamed: 0", np.arange(1, len(table) + 1))
    table.to_csv(root / "ABIDE_pcp" / "Phenotypic_V1_0b_preprocessed1.csv", index=True)
    return root


Outcome = tuple[dict[str, list[float]], dict[str, torch.Tensor]]


def _start(tmp: Path, tag: str, threads: int, sites: str, rounds: int, *options: str,
           data: Path) -> subprocess.Popen[str]:
    """Start the CLI in a fresh process with ``threads`` threads (see :func:`_run_together`)."""
    store = tmp / f"mlflow-{tag}.db"
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "OPENBLAS_NUM_THREADS": str(threads), "FEDBN_MED_DATA": str(data),
           "FLWR_TELEMETRY_ENABLED": "0"}
    # its output goes to files: a pipe nobody reads while another run is awaited could fill
    with open(tmp / f"stderr-{tag}.txt", "w", encoding="utf-8") as err:
        return subprocess.Popen(
            [sys.executable, str(ROOT / "pipelines" / "abide_fedbn.py"), "--sites", sites,
             "--rounds", str(rounds), "--quiet", "--tracking-uri", sqlite_store(store),
             "--workdir", str(tmp / f"work-{tag}"), *options],
            env=env, stdout=subprocess.DEVNULL, stderr=err, text=True, cwd=ROOT)


def _finish(proc: subprocess.Popen[str], tmp: Path, tag: str, sites: str,
            rounds: int) -> Outcome:
    """Wait for a run of :func:`_start`; return its per-round losses and final weights."""
    from mlflow.tracking import MlflowClient
    from safetensors.torch import load_file

    proc.wait(timeout=600)
    stderr = (tmp / f"stderr-{tag}.txt").read_text(encoding="utf-8", errors="replace")
    assert proc.returncode == 0, stderr[-3000:]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp / f'mlflow-{tag}.db'}")
    experiment = client.get_experiment_by_name("abide-fedbn")
    losses: dict[str, list[float]] = {}
    weights: dict[str, torch.Tensor] = {}
    for run in client.search_runs([experiment.experiment_id]):
        site = run.data.tags.get("site", "")
        if not site:
            if any(a.path == "model" for a in client.list_artifacts(run.info.run_id)):
                weights = load_file(client.download_artifacts(
                    run.info.run_id, "model/shared_weights.safetensors", str(tmp)))
            continue
        for key in ("train_loss", "val_loss", "test_loss"):
            history = client.get_metric_history(run.info.run_id, key)
            losses[f"{site}/{key}"] = [m.value for m in sorted(history, key=lambda m: m.step)]
    assert sorted({k.split("/")[0] for k in losses}) == sorted(sites.split(",")), losses
    assert all(len(v) == rounds for v in losses.values()), losses
    return losses, weights


def _run_together(tmp: Path, sites: str, rounds: int,
                  *runs: tuple[str, int, tuple[str, ...], Path]) -> list[Outcome]:
    """Run the CLI once per ``(tag, threads, options, data)``, the processes side by side.

    Return, per run, every per-round loss of every site and the final shared weights.
    Losses, not the printed percentages: a difference in the last bits of one weight
    shows in a loss long before it flips a test subject. Each run is a fresh process of
    its own; none waits for another.
    """
    procs = [(_start(tmp, tag, threads, sites, rounds, *options, data=data), tag)
             for tag, threads, options, data in runs]
    try:
        return [_finish(proc, tmp, tag, sites, rounds) for proc, tag in procs]
    finally:
        for proc, _ in procs:  # a run still going after another failed, or timed out
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.integration
def test_same_numbers_on_one_or_two_threads(tmp_path: Path) -> None:
    # Centralized on these two sites: with 1 vs 2 torch threads its losses differ in the
    # 7th digit (0.66715294 vs 0.66715282 for UCLA after 8 rounds, seen without the pin).
    options = ("--engine", "inprocess", "--strategy", "centralized", "--fold", "1")
    # The recorded losses are rounded as a site sends them; the final weights hold every bit.
    # Each run generates its own copy of the cohort and computes its own features on its
    # own thread count (data-1, data-2): the data stack is compared too, not only training.
    # The two processes run side by side; neither's numbers depend on the other.
    (one, weights_one), (two, weights_two) = _run_together(
        tmp_path, SITES, 8, ("one", 1, options, tmp_path / "data-1"),
        ("two", 2, options, tmp_path / "data-2"))
    assert one == two
    assert weights_one and set(weights_one) == set(weights_two)
    for key, tensor in weights_one.items():
        assert torch.equal(weights_two[key], tensor), key


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return the data folder of a small real-shaped release (see :func:`write_release`)."""
    return write_release(tmp_path_factory.mktemp("release"), RELEASE_SITES)


@pytest.mark.integration
def test_flower_matches_in_process_over_a_long_run(release: Path, tmp_path: Path) -> None:
    sites = ",".join(RELEASE_SITES)
    data = ("--data-dir", str(release), "--strategy", "fedbn")
    home = tmp_path / "data"  # nothing is generated there: the sites read the release
    # side by side: the in-process run needs no more than the Flower run's start-up time
    (flower, weights), (local, local_weights) = _run_together(
        tmp_path, sites, FLOWER_ROUNDS, ("flower", 1, (*data, "--engine", "flower"), home),
        ("inprocess", 2, (*data, "--engine", "inprocess"), home))
    # Flower on one thread, in process on two: one comparison covers the engine and the
    # thread count (test_same_numbers_on_one_or_two_threads isolates the threads).
    assert local_weights and set(weights) == set(local_weights)
    for key, tensor in local_weights.items():
        assert torch.equal(weights[key], tensor), key
    # Flower's figures leave each site rounded and its losses capped (its privacy policy,
    # fl.release.bounded); the in-process engine records the very same numbers.
    assert local == flower


def test_one_bit_grows_over_the_long_run(release: Path) -> None:
    """The long run is long enough: one bit of one initial weight changes the result."""
    from fedbn_med.spec import RunSpec
    from fedbn_med.tasks import get_task
    from fedbn_med.training.inprocess import run_in_process

    spec = RunSpec(task="abide", strategy="fedbn", sites=tuple(RELEASE_SITES),
                   rounds=LONG_ROUNDS, data_dir=release, device="cpu")
    task = get_task("abide")

    def final(nudge: bool) -> dict[str, torch.Tensor]:
        trainers = {s: task.build_site(s, spec, release, "cpu") for s in spec.sites}
        if nudge:  # one ulp up, every weight of the first layer every site starts from
            weight = next(iter(trainers.values())).model.net[0].weight
            with torch.no_grad():
                weight.copy_(torch.nextafter(weight, torch.full_like(weight, math.inf)))
        history = run_in_process(trainers, spec.strategy_obj(), spec.rounds, evaluate=False)
        return history.global_weights

    threads = torch.get_num_threads()  # the trainers pin it (spec.threads); put it back
    try:
        plain, nudged = final(False), final(True)
    finally:
        torch.set_num_threads(threads)
    start = plain["net.0.weight"]
    ulp = float((torch.nextafter(start, torch.full_like(start, math.inf)) - start).max())
    grown = max(float((plain[k] - nudged[k]).abs().max()) for k in plain)
    # seen: 64 ulps after 30 rounds; on real sites such a gap grows into different
    # predictions by round 50 (the order of the sums alone moved test accuracies 10 pp)
    assert grown > 10 * ulp, (grown, ulp)
