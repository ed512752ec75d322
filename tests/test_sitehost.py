"""The site host forks real, separate site processes and reports how they end, as events."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from fedbn_med.federation.launcher import (
    FederationError,
    ForkedSite,
    LocalFederation,
    free_port,
)

pytestmark = pytest.mark.integration


def test_forked_sites_are_separate_processes_with_their_own_exit(small_cohort, tmp_path):
    nowhere = f"127.0.0.1:{free_port()}"  # nothing listens: each site gives up
    with LocalFederation(tmp_path) as fed:
        fed.start_site_host(threads=1)
        host = fed.processes["site-host"].pid
        quick = fed.start_site("NYU", data_dir=small_cohort, device="cpu", threads=1,
                               superlink=nowhere, max_wait_time=2.0)
        slow = fed.start_site("UM", data_dir=small_cohort, device="cpu", threads=1,
                              superlink=nowhere, max_wait_time=600.0)
        assert isinstance(quick, ForkedSite) and isinstance(slow, ForkedSite)
        assert len({quick.pid, slow.pid, host}) == 3
        for proc in (quick, slow):  # a session of its own, like every process we start
            assert psutil.Process(proc.pid).ppid() == host
            deadline = time.monotonic() + 10  # the child leaves the host's session first
            while os.getsid(proc.pid) != proc.pid and time.monotonic() < deadline:
                time.sleep(0.05)
            assert os.getsid(proc.pid) == proc.pid

        # the host had not initialised CUDA when it said it was ready
        assert fed.host_ready is not None and fed.host_ready.cuda_initialized is False

        # the site that cannot reach the server exits 2, saying why in an event and its log
        assert quick.wait(timeout=120) == 2
        assert f"could not reach the federation server at {nowhere}" in quick.status.failure
        log = (tmp_path / "logs" / "site-NYU.log").read_text()
        assert f"could not reach the federation server at {nowhere}" in log
        with pytest.raises(FederationError, match=r"Site NYU exited at start-up:\n"
                                                  r"Site 'NYU' could not reach"):
            fed.wait_sites_ready(["NYU"], timeout=5)

        # a killed site is reported as killed; the other one is still running
        slow.kill()
        assert slow.wait(timeout=30) == -signal.SIGKILL
        again = fed.start_site("UM", data_dir=small_cohort, device="cpu", threads=1,
                               superlink=nowhere, max_wait_time=600.0)
        assert again.poll() is None and again.pid != slow.pid
    # everything the federation started is gone after it stops
    assert not psutil.pid_exists(host) or psutil.Process(host).status() == "zombie"
    assert not psutil.pid_exists(again.pid)
