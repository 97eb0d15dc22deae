"""A replica stopped together with its coordinator (what `serve` and `deploy/local.sh down` do
on Ctrl-C) exits cleanly with nothing in flight: its closing state change may find the
coordinator gone, which loses nothing and must not read as a failure in its log.

The replica marks itself closing before it queues that state change (worker/serving/server.py
`_begin_drain`). Before, it did so only once drained, and a loaded machine could let the IO
thread send the change in between: a WARNING and a needless re-registration (a CI flake of
tests/integration/test_cli.py). This test runs the coordinator-first order; that interleaving
itself depends on thread timing and is not forced here."""

from __future__ import annotations

import signal
import time

import pytest

from .conftest import ClusterProcs

pytestmark = pytest.mark.timeout(120)


def test_a_replica_stopped_after_its_coordinator_warns_about_nothing(tmp_path):
    # Heartbeats every 5 s: the closing state change is the first message to find it gone.
    cluster = ClusterProcs(tmp_path, num_replicas=1,
                           coordinator_args=["--heartbeat-interval", "5", "--replica-timeout", "30"])
    try:
        cluster.start()
        # A replica sends its first heartbeat right after registering. Stopped before it lands,
        # the coordinator leaves that heartbeat undeliverable, and the replica rightly warns (a
        # coordinator that vanished while it was serving): wait for that heartbeat's load report.
        deadline = time.monotonic() + 10
        while not cluster.status()["replicas"][0]["num_total_blocks"]:
            assert time.monotonic() < deadline, "no heartbeat from the replica within 10 s"
            time.sleep(0.05)
        cluster.coordinator.send_signal(signal.SIGTERM)
        assert cluster.coordinator.wait(20) == 0
        cluster.replicas[0].send_signal(signal.SIGTERM)
        assert cluster.replicas[0].wait(30) == 0
        log = cluster.replica_log(0)
        assert "stopped: drained" in log, log[-2000:]
        assert " WARNING " not in log and " ERROR " not in log, log[-2000:]
    finally:
        cluster.stop()
