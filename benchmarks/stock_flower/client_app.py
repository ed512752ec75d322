"""The ClientApp of the stock-Flower baseline: one fedbn_med ABIDE site per SuperNode.

Flower starts a fresh process for every message, so each handler builds the site's data
and model anew through the task registry (``get_task("abide").build_site``), as a plain
Flower app would. The SuperNode's node config names the site and its data folder::

    --node-config "site='NYU' data-path='/path/holding/ABIDE_pcp'"
"""

from __future__ import annotations

from pathlib import Path

from baseline_spec import run_spec
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedbn_med.tasks import get_task
from fedbn_med.training.trainer import SiteTrainer

app = ClientApp()


def _trainer(context: Context) -> SiteTrainer:
    """Build this node's site trainer from its node config and the run config."""
    for key in ("site", "data-path"):
        if key not in context.node_config:
            raise ValueError(f"The SuperNode's --node-config lacks '{key}' (expected "
                             "\"site='NYU' data-path='/dir/with/ABIDE_pcp'\").")
    data_path = str(context.node_config["data-path"])
    trainer = get_task("abide").build_site(
        str(context.node_config["site"]), run_spec(context.run_config),
        Path(data_path) if data_path else None, "auto")
    trainer.pin_threads()  # the spec's thread count, as every engine sets it
    return trainer


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Load the global arrays, train one round, reply with the new arrays."""
    trainer = _trainer(context)
    weights = msg.content["arrays"].to_torch_state_dict()
    rnd = int(msg.content["config"]["server-round"])
    new_weights, num_examples, metrics = trainer.fit(weights, {"round": rnd})
    reply = RecordDict({
        "arrays": ArrayRecord(new_weights),
        "metrics": MetricRecord({**{k: float(v) for k, v in metrics.items()},
                                 "num-examples": int(num_examples)}),
    })
    return Message(content=reply, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Score the global arrays on the site's validation and test splits."""
    trainer = _trainer(context)
    metrics = trainer.score(msg.content["arrays"].to_torch_state_dict())
    num_val = int(trainer.data.val[0].shape[0])
    reply = RecordDict({
        "metrics": MetricRecord({**{k: float(v) for k, v in metrics.items()},
                                 "num-examples": num_val}),
    })
    return Message(content=reply, reply_to=msg)
