"""When one side stops reading, no request waits forever. A client whose coordinator stops
reading: a submit that zmq will not queue (the DEALER's send queue and the kernel's socket
buffers are full) ends at once with an `overloaded` error, and the requests that were queued are
answered once the coordinator reads again. A client that was itself stopped past the
coordinator's client timeout: its requests were aborted, and its next message brings their
`unreachable` finals. Real coordinator and client processes (stopped with SIGSTOP), real sockets.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from infer_cluster.client import InferenceClient
from infer_cluster.protocol import SamplingParams

from .conftest import ClusterProcs, child_env

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


def test_submits_zmq_refuses_before_the_first_answer_go_out_once_it_answers(tmp_path):
    """Before the coordinator first answers, a refused send is a connect problem (a refused
    CURVE handshake drops zmq's pipe), not a full queue: the request is not failed as
    `overloaded`; it goes out when the coordinator answers (or fails with the connect reason
    after `connect_timeout`). Here the coordinator is stopped before the client connects, so the
    DEALER's 4-message queue fills with no answer yet; nothing ends before the first answer,
    and nothing waits forever after it."""
    procs = ClusterProcs(tmp_path / "logs", num_replicas=0,
                         coordinator_args=["--no-replica-timeout", "1"]).start(timeout=60)
    os.kill(procs.coordinator.pid, signal.SIGSTOP)
    stopped = True
    try:
        with InferenceClient(procs.address, socket_hwm=4, coordinator_timeout=120,
                             connect_timeout=60) as client:
            handles = [client.submit("hello", PARAMS) for _ in range(12)]
            deadline = time.monotonic() + 10
            while client._io.num_dropped == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert client._io.num_dropped > 0, "zmq queued every submit: the path is not exercised"
            time.sleep(0.5)
            assert not [h for h in handles if h.done()], "a refused submit failed before any answer"
            os.kill(procs.coordinator.pid, signal.SIGCONT)
            stopped = False
            codes = []
            for h in handles:  # every one ends: the coordinator (no replica) or a full queue
                assert h.wait(timeout=60), f"{h.request_id} never answered after SIGCONT"
                codes.append(h.output.error["code"])
            # Sent again at the first answer into a queue of 4: those that still did not fit
            # end as `overloaded`, now that the coordinator is known to be there.
            assert set(codes) <= {"no_replica", "overloaded"}, codes
            assert "no_replica" in codes, codes
    finally:
        if stopped:
            os.kill(procs.coordinator.pid, signal.SIGCONT)
        procs.stop()


CLIENT_SCRIPT = """
import sys
from infer_cluster.client import InferenceClient
from infer_cluster.protocol import SamplingParams
with InferenceClient(sys.argv[1]) as client:
    handle = client.submit("hello", SamplingParams(temperature=0, max_tokens=4))
    print("submitted", flush=True)
    if handle.wait(timeout=float(sys.argv[2])):
        out = handle.output
        error = out.error or {}
        print("ended", out.finish_reason, error.get("code"), error.get("message"), flush=True)
    else:
        print("hung", flush=True)
"""


def test_a_client_back_from_silence_learns_its_requests_were_ended(tmp_path):
    """The coordinator aborts the requests of a client silent past --client-timeout (their KV is
    freed). A client that was only stopped (SIGSTOP, a debugger, a paused VM) and comes back must
    hear that, not wait forever: its next message gets an `unreachable` final for each."""
    procs = ClusterProcs(tmp_path / "logs", num_replicas=0,
                         coordinator_args=["--no-replica-timeout", "120"]).start(timeout=60)
    client = None
    try:
        client = subprocess.Popen([sys.executable, "-c", CLIENT_SCRIPT, procs.address, "40"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
        assert client.stdout.readline().strip() == "submitted"
        deadline = time.monotonic() + 20
        while procs.status()["coordinator"]["num_in_flight"] != 1:  # waits for a replica
            assert time.monotonic() < deadline, "the request never reached the coordinator"
            time.sleep(0.1)
        os.kill(client.pid, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 20
            while procs.status()["coordinator"]["num_client_gone_aborts"] != 1:
                assert time.monotonic() < deadline, "the silent client's request was never aborted"
                time.sleep(0.2)
            assert procs.status()["coordinator"]["num_in_flight"] == 0
        finally:
            os.kill(client.pid, signal.SIGCONT)
        out, err = client.communicate(timeout=60)
        assert client.returncode == 0, err
        words = out.split()
        assert words[:4] == ["ended", "error", "unreachable", "the"], out
        assert "while this client was silent" in out and "resubmit" in out, out
    finally:
        if client is not None and client.poll() is None:
            client.kill()
            client.wait(timeout=10)
        procs.stop()
