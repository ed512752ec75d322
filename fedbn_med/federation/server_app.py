"""The ServerApp that ``flwr run`` starts: reads the run config, runs the federation.

The federation server itself is :class:`fedbn_med.federation.server.FederationServer`
(site discovery, rounds, checkpoints, results).
"""

from __future__ import annotations

import logging

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedbn_med.federation.config import read_run_config
from fedbn_med.federation.events import RunFailed, append_event, shorten
from fedbn_med.federation.server import FastGrid, FederationServer

__all__ = ["app", "main"]

logger = logging.getLogger("fedbn_med.server")

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the federation described by the run config."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    try:
        config, settings = read_run_config(context.run_config)
    except (TypeError, ValueError) as err:
        logger.error("The run config is not usable: %s", err)
        raise
    try:
        FederationServer(FastGrid(grid), config, settings).run()
    except Exception as err:
        # The launcher reads this typed event to say why the run stopped.
        append_event(settings.workdir / "progress.jsonl", RunFailed(reason=shorten(str(err))))
        raise
