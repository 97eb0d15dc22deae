"""A client whose coordinator stops reading: a submit that zmq will not queue (the DEALER's
send queue and the kernel's socket buffers are full) ends at once with an `overloaded` error,
instead of waiting for an answer that cannot come; the requests that were queued are answered
once the coordinator reads again. Real coordinator process (stopped with SIGSTOP), real sockets.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from infer_cluster.client import InferenceClient
from infer_cluster.protocol import SamplingParams

from .conftest import ClusterProcs

pytestmark = pytest.mark.timeout(180)
PARAMS = SamplingParams(temperature=0, max_tokens=4)
PROMPT = "backlog " * 25_000  # ~200 KB a frame: a few hundred fill loopback's socket buffers
MAX_SUBMITS = 1_500


def test_submits_zmq_cannot_queue_fail_at_once_as_overloaded(tmp_path):
    procs = ClusterProcs(tmp_path / "logs", num_replicas=0,
                         coordinator_args=["--no-replica-timeout", "1"]).start(timeout=60)
    stopped = False
    try:
        with InferenceClient(procs.address, socket_hwm=4, coordinator_timeout=120) as client:
            client.status(timeout=30)  # connected: the coordinator has answered
            os.kill(procs.coordinator.pid, signal.SIGSTOP)
            stopped = True
            handles, dropped = [], []
            started = time.monotonic()
            while not dropped and len(handles) < MAX_SUBMITS:
                handles.extend(client.submit(PROMPT, PARAMS) for _ in range(20))
                time.sleep(0.02)  # the IO thread forwards them
                dropped = [h for h in handles if h.done()]
            assert dropped, f"{len(handles)} submits of {len(PROMPT)} bytes all queued"
            time.sleep(0.5)
            dropped = [h for h in handles if h.done()]
            # Every finished request finished while the coordinator could not answer: each
            # is one that zmq refused to queue, and says so.
            for h in dropped:
                out = h.output
                assert out.finish_reason == "error" and out.error["code"] == "overloaded", out.error
                assert "was not sent" in out.error["message"] and procs.address in out.error["message"]
            assert time.monotonic() - started < 60
            queued = [h for h in handles if not h.done()]
            assert queued, "every submit was dropped: nothing was queued at all"
            os.kill(procs.coordinator.pid, signal.SIGCONT)
            stopped = False
            # The queued ones reach the coordinator, which has no replica: each gets its answer.
            for h in queued:
                assert h.wait(timeout=60), f"{h.request_id} never answered after SIGCONT"
                out = h.output
                assert out.finish_reason == "error" and out.error["code"] == "no_replica", out.error
            st = client.status(timeout=30)["coordinator"]
            assert st["num_in_flight"] == 0
    finally:
        if stopped:
            os.kill(procs.coordinator.pid, signal.SIGCONT)
        procs.stop()
