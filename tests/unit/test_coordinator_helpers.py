"""Test helpers for coordinator unit tests: an in-process coordinator, a scripted fake replica,
and the `cluster` fixture with `submit`, `stats`, `wait_until` (test_coordinator_flow.py and
test_coordinator_control.py import them).

The fake replica speaks the real wire protocol over a real DEALER socket; tests drive it by hand
(`recv`, `step`) so every interleaving is deterministic. Integration tests use the real
`EngineServer` instead. No test functions live here.
"""

from __future__ import annotations

import os
import threading
import time

import pytest
import zmq

from infer_cluster.coordinator.config import CoordinatorConfig
from infer_cluster.coordinator.server import Coordinator
from infer_cluster.protocol import codec
from infer_cluster.protocol.messages import (DeltaPayload, Goodbye, Heartbeat, Hello, ReplicaCapacity,
                               ReplicaLoad, StepOutput, SubmitRequest)


class CoordinatorThread:
    """A `Coordinator` on free loopback ports, served by a background thread."""

    def __init__(self, **overrides):
        cfg = dict(host="127.0.0.1", port=0, replica_port=0, heartbeat_interval=0.1,
                   replica_timeout=0.6, client_timeout=2.0, no_replica_timeout=0.8)
        cfg.update(overrides)
        self.coord = Coordinator(CoordinatorConfig(**cfg), context=zmq.Context())
        self.front = self.coord.front_address
        self.back = self.coord.back_address
        self.thread = threading.Thread(target=self.coord.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.coord.request_stop(graceful=False)
        self.thread.join(5)
        assert not self.thread.is_alive(), "coordinator thread did not stop"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def fake_tokens(prompt_key: str, n: int) -> list[int]:
    """The fake engine's deterministic 'model': token i depends only on the prompt and i."""
    base = sum(prompt_key.encode()) % 1000
    return [(base + 7 * i) % 5000 + 10 for i in range(n)]


class FakeReplica:
    """A replica speaking the wire protocol, driven step by step by the test."""

    def __init__(self, address: str, name: str = "fake", model: str = "tiny-random",
                 register: bool = True):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.IDENTITY, f"{name}-{os.urandom(4).hex()}".encode())
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)
        self.name = name
        self.model = model
        self.requests: dict[str, dict] = {}  # attempt id -> {"dispatch", "emitted"}
        self.aborted: list[str] = []
        self.other: list = []
        if register:
            self.register()

    def send(self, msg):
        self.sock.send_multipart([b"", codec.encode(msg)])

    def register(self):
        self.send(Hello(replica_name=self.name, capacity=ReplicaCapacity(
            model=self.model, num_total_blocks=100, block_size=16, max_num_seqs=8,
            max_model_len=512), pid=os.getpid(), host="localhost"))
        msg = self.recv_one(2.0)
        assert msg is not None and msg.KIND.name == "HELLO_ACK", msg

    def recv_one(self, timeout: float):
        if not self.sock.poll(int(timeout * 1000)):
            return None
        frames = self.sock.recv_multipart()
        return codec.decode(frames[-1])

    def pump(self, timeout: float = 0.05) -> None:
        """Read everything that arrived; track dispatches and aborts."""
        while True:
            msg = self.recv_one(timeout)
            if msg is None:
                return
            timeout = 0.01
            kind = msg.KIND.name
            if kind == "DISPATCH":
                self.requests[msg.request_id] = {"dispatch": msg, "emitted": 0}
            elif kind == "ABORT":
                for rid in msg.request_ids:
                    if self.requests.pop(rid, None) is not None:
                        self.aborted.append(rid)
            else:
                self.other.append(msg)

    def wait_for_requests(self, n: int, timeout: float = 3.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.requests) < n and time.monotonic() < deadline:
            self.pump(0.05)
        assert len(self.requests) >= n, f"{self.name} got {len(self.requests)} of {n} requests"

    def step(self, num_tokens: int = 1) -> list[str]:
        """Emit up to `num_tokens` new tokens for every request; finished ones end with
        "length". Returns the attempt ids that finished."""
        deltas, finished = [], []
        for rid, st in list(self.requests.items()):
            d = st["dispatch"]
            key = d.prompt if d.prompt is not None else ",".join(map(str, d.prompt_token_ids))
            max_tokens = d.sampling_params.get("max_tokens", 16)
            done_before = len(d.resume_token_ids) + st["emitted"]
            n = min(num_tokens, max_tokens - done_before)
            toks = fake_tokens(key, done_before + n)[done_before:]
            st["emitted"] += n
            is_last = done_before + n >= max_tokens
            deltas.append(DeltaPayload(request_id=rid, token_ids=toks,
                                       text="".join(f"<{t}>" for t in toks),
                                       finish_reason="length" if is_last else None))
            if is_last:
                finished.append(rid)
                del self.requests[rid]
        if deltas:
            self.send(StepOutput(deltas=deltas))
        return finished

    def heartbeat(self, **load):
        self.send(Heartbeat(state="active", load=ReplicaLoad(**load)))

    def goodbye(self):
        self.send(Goodbye(reason="test"))

    def close(self):
        self.sock.close()
        self.ctx.term()


class RawClient:
    """A bare DEALER speaking the wire protocol (no client library), for exact assertions."""

    def __init__(self, address: str):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)

    def send(self, msg):
        self.sock.send_multipart([b"", codec.encode(msg)])

    def send_raw(self, *frames):
        self.sock.send_multipart(list(frames))

    def recv(self, timeout: float = 2.0):
        if not self.sock.poll(int(timeout * 1000)):
            return None
        return codec.decode(self.sock.recv_multipart()[-1])

    def deltas(self, until_final: int, timeout: float = 5.0) -> dict:
        """Collect deltas by request id until `until_final` requests have ended."""
        got: dict = {}
        finals = 0
        deadline = time.monotonic() + timeout
        while finals < until_final and time.monotonic() < deadline:
            msg = self.recv(0.05)
            if msg is None or msg.KIND.name != "DELTA":
                continue
            for d in msg.deltas:
                got.setdefault(d.request_id, []).append(d)
                finals += d.finish_reason is not None
        return got

    def close(self):
        self.sock.close()
        self.ctx.term()


class AutoReplica(FakeReplica):
    """A fake replica that steps on its own in a background thread (one token per step)."""

    def __init__(self, address: str, name: str = "auto", step_interval: float = 0.005, **kw):
        super().__init__(address, name, **kw)
        self._stop = threading.Event()
        self.step_interval = step_interval
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        next_beat = 0.0
        while not self._stop.is_set():
            self.pump(self.step_interval)
            self.step(1)
            if time.monotonic() >= next_beat:
                self.heartbeat(num_running=len(self.requests), num_free_blocks=100,
                               num_total_blocks=100)
                next_beat = time.monotonic() + 0.1

    def close(self):
        self._stop.set()
        self.thread.join(5)
        super().close()


# -- shared by test_coordinator_flow.py and test_coordinator_control.py ----------------------------

@pytest.fixture
def cluster():
    ct = CoordinatorThread()
    opened = []

    def replica(name="r", **kw):
        r = FakeReplica(ct.back, name, **kw)
        opened.append(r)
        return r

    def client():
        c = RawClient(ct.front)
        opened.append(c)
        return c
    ct.replica, ct.client = replica, client
    yield ct
    for x in opened:
        try:
            x.close()
        except Exception:
            pass
    ct.stop()


def submit(c, rid, prompt="hello", **params):
    params.setdefault("max_tokens", 4)
    c.send(SubmitRequest(request_id=rid, prompt=prompt, sampling_params=params))


def stats(ct):
    return ct.coord.dispatcher.stats


def wait_until(cond, timeout=10.0):  # returns as soon as cond holds; long for a loaded CI host
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()
