"""A replica whose message to the coordinator cannot be queued (IMMEDIATE with no connection,
or a full queue: zmq.Again) must not go on as if it was delivered: a lost step output is a final
the coordinator never hears. `ReplicaIO` then drops its registration (the server aborts what it
holds and registers again with a new session, so the coordinator re-routes those requests); a
lost heartbeat alone changes nothing. Real sockets: a DEALER connected where nothing listens."""

import queue
import socket

import zmq

from infer_cluster.protocol import codec
from infer_cluster.protocol.messages import Heartbeat, ReplicaLoad, StepOutput
from infer_cluster.worker.serving.replica_io import REREGISTERED, ReplicaIO
from infer_cluster.worker.serving.server import ServerConfig

CAPACITY = dict(model="tiny-random", num_total_blocks=64, block_size=16, max_num_seqs=8, max_model_len=256)


def _nowhere() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def test_a_dropped_step_output_drops_the_registration_a_dropped_heartbeat_does_not():
    ctx = zmq.Context()
    inbox = queue.SimpleQueue()
    try:
        io = ReplicaIO(ServerConfig(coordinator=_nowhere(), name="r"), CAPACITY, inbox,
                       load_fn=ReplicaLoad, state_fn=lambda: "active", context=ctx)
        io.is_registered = True  # as after a HELLO_ACK
        session = io._session
        io._send_raw(codec.encode(Heartbeat()))
        assert io.num_dropped == 1 and io.is_registered and inbox.empty()
        io._send_raw(codec.encode(StepOutput(deltas=[])))
        assert io.num_dropped == 2 and not io.is_registered and io._session != session
        kind, why = inbox.get_nowait()
        assert kind == REREGISTERED and "could not be queued" in why
        io._send_raw(codec.encode(StepOutput(deltas=[])))  # unregistered: nothing more to drop
        assert inbox.empty()
        io.is_registered, io.closing = True, True  # a replica that drained and exits
        io._send_raw(codec.encode(StepOutput(deltas=[])))
        assert io.is_registered and inbox.empty()
    finally:
        ctx.destroy(linger=0)


def test_a_first_drop_before_registering_is_not_a_warning(caplog):
    """The start-up race (the replica sends before its connect completed; the registration is
    sent again) is logged at INFO; drops that go on, or that hit a registered replica, warn."""
    import logging

    ctx = zmq.Context()
    try:
        io = ReplicaIO(ServerConfig(coordinator=_nowhere(), name="r"), CAPACITY, queue.SimpleQueue(),
                       load_fn=ReplicaLoad, state_fn=lambda: "active", context=ctx)
        with caplog.at_level(logging.INFO, logger="infer_cluster.replica"):
            io._send_raw(codec.encode(Heartbeat()))
            first = [r for r in caplog.records if "unreachable" in r.getMessage()]
            assert [r.levelno for r in first] == [logging.INFO]
            for _ in range(9):
                io._send_raw(codec.encode(Heartbeat()))
            tenth = [r for r in caplog.records if "unreachable" in r.getMessage()]
            assert [r.levelno for r in tenth] == [logging.INFO, logging.WARNING]
    finally:
        ctx.destroy(linger=0)
    ctx = zmq.Context()
    try:
        io = ReplicaIO(ServerConfig(coordinator=_nowhere(), name="r"), CAPACITY, queue.SimpleQueue(),
                       load_fn=ReplicaLoad, state_fn=lambda: "active", context=ctx)
        io.is_registered = True
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="infer_cluster.replica"):
            io._send_raw(codec.encode(Heartbeat()))
        assert [r.levelno for r in caplog.records if "unreachable" in r.getMessage()] == [logging.WARNING]
    finally:
        ctx.destroy(linger=0)
