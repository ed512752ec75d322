"""Two colluding sites claim 10^9 training examples each (issue 44).

Before, the 0.5 share cap was measured against the other sites' *claimed* counts: NYU
and UM both claimed 10^9 and took shares 0.5 and 0.5, the honest UCLA 0. Now each site's
count is registered with its key (``pipelines/consortium_keys.py --counts``), the server
reads the consortium's ``counts.json``, and a site weighs at most its registered count.

One keyed federation, one round: NYU and UM are real node processes holding their own
registered keys, which train honestly and then claim 10^9 examples; UCLA is honest.

Run as a script (``python tests/test_attacks_collusion.py NODE-ARGS...``), this file is a
colluding node (the real node with its ClientApp wrapped here, in the test suite).
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SITES = ("NYU", "UM", "UCLA")
#: Registered with the keys: the colluders 10 each; UCLA more than it will claim.
REGISTERED = {"NYU": 10, "UM": 10, "UCLA": 1000}
CLAIM = 10**9


def _colluding(honest):  # noqa: ANN001, ANN202 - a ClientApp
    from fedbn_med.federation.records import RECORD

    def app(message, context):  # noqa: ANN001, ANN202
        reply = honest(message=message, context=context)
        if message.metadata.message_type == "train" and not reply.has_error():
            reply.content.config_records[RECORD]["metrics/num-examples"] = float(CLAIM)
        return reply

    return app


@pytest.fixture(scope="module")
def colluded(small_cohort, tmp_path_factory):
    """One keyed federation with registered counts, two colluders, one round."""
    from fedbn_med.spec import RunSpec

    from .keyed import keyed_federation, run_federation, start_honest, start_wrapped, stop_nodes

    root = tmp_path_factory.mktemp("collusion")
    with keyed_federation(root, SITES, counts=REGISTERED) as c:
        wrapped = [start_wrapped(c, Path(__file__), site, small_cohort)
                   for site in ("NYU", "UM")]
        try:
            start_honest(c, ("UCLA",), small_cohort)
            c.fed.wait_sites_ready(["UCLA"], timeout=180)
            spec = RunSpec(strategy="fedbn", rounds=1, sites=SITES, data_dir=small_cohort,
                           device="cpu")
            results, events, _ = run_federation(c, "colluded", spec, timeout=400,
                                                wait_timeout=180.0)
            yield {"results": results, "events": events, "root": root}
        finally:
            stop_nodes(wrapped)
            for proc in wrapped:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)


def test_colluders_weigh_at_most_their_registered_counts(colluded):
    assert "error" not in colluded["results"], colluded["results"]
    (trained,) = [e for e in colluded["events"] if e["event"] == "trained"]
    shares = trained["shares"]
    assert set(shares) == set(SITES), trained
    ucla = next(r["num_examples"] for r in colluded["results"]["rows"] if r["site"] == "UCLA")
    assert 20 < ucla < REGISTERED["UCLA"]
    # each colluder weighs its registered 10, the honest UCLA its own count
    assert shares["NYU"] == pytest.approx(10 / (20 + ucla))
    assert shares["UM"] == pytest.approx(10 / (20 + ucla))
    assert shares["UCLA"] == pytest.approx(ucla / (20 + ucla))
    print(f"colluders' combined share {shares['NYU'] + shares['UM']:.3f} "
          f"(registered share {20 / (20 + ucla):.3f}; before issue 44: 1.0)")


if __name__ == "__main__":
    from keyed import preload_task  # this file's folder, tests/, is on sys.path

    from fedbn_med.federation import client_app
    from fedbn_med.federation.node import main

    preload_task()
    client_app.app = _colluding(client_app.app)
    main(sys.argv[1:])
