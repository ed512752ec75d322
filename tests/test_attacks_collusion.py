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

from fedbn_med.federation.events import Trained
from fedbn_med.federation.server.rounds import HOSPITAL_MAX_SHARE
from fedbn_med.fl.weighting import capped_weights, site_weights

pytestmark = pytest.mark.integration

SITES = ("NYU", "UM", "UCLA")
#: Registered with the keys: the colluders 30 each; UCLA more than it will claim.
REGISTERED = {"NYU": 30, "UM": 30, "UCLA": 1000}
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
    (trained,) = [e for e in colluded["events"] if isinstance(e, Trained)]
    shares = trained.shares
    assert set(shares) == set(SITES), trained
    ucla = int(next(r["num_examples"] for r in colluded["results"]["rows"]
                    if r["site"] == "UCLA"))
    assert 0 < ucla < REGISTERED["UCLA"]
    # exactly the shares of honest claims (the colluders' registered 30 each) under the
    # same rules, the hospital cap included; before issue 44: 0.5, 0.5 and UCLA about 0
    honest = site_weights({"NYU": 30, "UM": 30, "UCLA": ucla}, "samples", HOSPITAL_MAX_SHARE)
    total = sum(honest.values())
    for site in SITES:
        assert shares[site] == pytest.approx(honest[site] / total), (site, shares)
    before = capped_weights({"NYU": CLAIM, "UM": CLAIM, "UCLA": ucla}, HOSPITAL_MAX_SHARE)
    assert before["UCLA"] / sum(before.values()) < 1e-6
    print(f"shares with registered counts {shares}; colluders' combined share "
          f"{shares['NYU'] + shares['UM']:.3f}; before issue 44 UCLA got "
          f"{before['UCLA'] / sum(before.values()):.1e}")

if __name__ == "__main__":
    from keyed import preload_task  # this file's folder, tests/, is on sys.path

    from fedbn_med.federation import client_app
    from fedbn_med.federation.node import main

    preload_task()
    client_app.app = _colluding(client_app.app)
    main(sys.argv[1:])
