"""The ServerApp of the stock-Flower baseline: Flower's own FedAvg and its ``start`` loop.

The initial arrays are the whole state of the project's ABIDE network (stock FedAvg
averages every key, batch-norm statistics included). When the run config names a
``timing-file``, one JSON line is appended to it at each step, with ``time.time()``:
``{"event": "serverapp-start"}``, ``{"event": "nodes-ready"}``, then ``{"round": r}`` for
r = 0 (just before round 1) and after each round's training and evaluation.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from baseline_spec import run_spec, site_names
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from fedbn_med.tasks import get_task

app = ServerApp()


class _Timeline:
    """Append timestamped JSON lines to a file (nothing when no file is given)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path) if path else None

    def mark(self, **fields: object) -> None:
        if self.path is None:
            return
        with self.path.open("a") as out:
            out.write(json.dumps({**fields, "time": time.time()}) + "\n")

    def after_round(self, server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        """``evaluate_fn`` of ``FedAvg.start``: called before round 1 and after each round."""
        self.mark(round=server_round)
        return None


def _wait_for_nodes(grid: Grid, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while len(list(grid.get_node_ids())) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"Only {len(list(grid.get_node_ids()))} of {count} SuperNodes "
                               f"connected within {timeout:.0f} s.")
        time.sleep(0.5)


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Wait for every site, then run Flower's FedAvg for the configured rounds."""
    timeline = _Timeline(str(context.run_config["timing-file"]))
    timeline.mark(event="serverapp-start")
    spec = run_spec(context.run_config)
    n_sites = len(site_names(context.run_config))
    model = get_task("abide").build_server_model(spec, spec.input_shape())
    _wait_for_nodes(grid, n_sites, float(context.run_config["wait-timeout"]))
    timeline.mark(event="nodes-ready")
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=1.0, min_train_nodes=n_sites,
                      min_evaluate_nodes=n_sites, min_available_nodes=n_sites)
    strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
                   num_rounds=spec.rounds, timeout=float(context.run_config["round-timeout"]),
                   evaluate_fn=timeline.after_round)
    timeline.mark(event="done")
