"""The client's one IO thread: owns the DEALER socket to the coordinator.

Owns: connecting, sending what user threads hand over (through an inproc PUSH/PULL pair, since a
ZMQ socket must only be used by one thread), receiving and decoding replies, periodic PING so
the coordinator knows this client is alive (it aborts the requests of silent clients), and
noticing a silent coordinator. It calls back into the client for every decoded message and never
blocks on a user: callbacks only touch in-memory state. No busy polling: one `zmq.Poller` wait
bounded by the next heartbeat. Never imports torch.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable

import zmq

from infer_cluster.protocol import codec
from infer_cluster.protocol.errors import ProtocolError
from infer_cluster.protocol.messages import ClientHello, Goodbye, Message, Ping

log = logging.getLogger("infer_cluster.client")

_STOP = b"stop"
_SEND = b"send"


def make_dealer(ctx: zmq.Context, identity: bytes, hwm: int) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, identity)
    sock.setsockopt(zmq.LINGER, 500)          # let GOODBYE out on close, never hang
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    sock.setsockopt(zmq.RECONNECT_IVL, 100)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
    sock.setsockopt(zmq.HEARTBEAT_IVL, 1000)  # drop a dead TCP link so reconnect can happen
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 5000)
    return sock


class ClientIO(threading.Thread):
    def __init__(self, ctx: zmq.Context, address: str, name: str,
                 on_message: Callable[[Message], None], on_silence: Callable[[float], None],
                 heartbeat_interval: float, coordinator_timeout: float, hwm: int,
                 max_frame_bytes: int):
        super().__init__(name=f"infer-cluster-client-io-{name}", daemon=True)
        self.address = address
        self._on_message = on_message
        self._on_silence = on_silence
        self.heartbeat_interval = heartbeat_interval
        self.coordinator_timeout = coordinator_timeout
        self.max_frame_bytes = max_frame_bytes
        identity = f"client-{name}-{os.getpid()}-{os.urandom(6).hex()}".encode()
        self.identity = identity
        self._dealer = make_dealer(ctx, identity, hwm)
        self._dealer.connect(address)
        inproc = f"inproc://client-cmd-{identity.hex()}"
        self._cmd_pull = ctx.socket(zmq.PULL)
        self._cmd_pull.setsockopt(zmq.LINGER, 0)
        self._cmd_pull.bind(inproc)
        self._cmd_push = ctx.socket(zmq.PUSH)
        self._cmd_push.setsockopt(zmq.LINGER, 0)
        self._cmd_push.setsockopt(zmq.SNDHWM, 0)  # user threads must never block on the IO thread
        self._cmd_push.connect(inproc)
        self._push_lock = threading.Lock()
        self._name = name
        self.last_heard = time.monotonic()
        self.is_stopped = False

    # -------------------------------------------------------------- user-thread side

    def send(self, payload: bytes) -> None:
        with self._push_lock:
            if self.is_stopped:
                raise RuntimeError("the client is closed")
            self._cmd_push.send_multipart([_SEND, payload])

    def stop(self, timeout: float = 5.0) -> None:
        with self._push_lock:
            if self.is_stopped:
                return
            self.is_stopped = True
            self._cmd_push.send(_STOP)
        self.join(timeout)
        self._cmd_push.close()

    # -------------------------------------------------------------- IO thread

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._dealer, zmq.POLLIN)
        poller.register(self._cmd_pull, zmq.POLLIN)
        self._send_msg(ClientHello(client_name=self._name))
        next_ping = time.monotonic() + self.heartbeat_interval
        try:
            while True:
                timeout_ms = max(0, int((next_ping - time.monotonic()) * 1000) + 1)
                events = dict(poller.poll(timeout_ms))
                if self._cmd_pull in events and not self._drain_commands():
                    self._send_msg(Goodbye(reason="client closed"))
                    return
                if self._dealer in events:
                    self._drain_replies()
                now = time.monotonic()
                if now >= next_ping:
                    self._send_msg(Ping())
                    next_ping = now + self.heartbeat_interval
                    silence = now - self.last_heard
                    if silence > self.coordinator_timeout:
                        self._on_silence(silence)
        except Exception:  # a bug here would silently hang every request; make it loud
            log.exception("client IO thread crashed")
            self._on_silence(float("inf"))
        finally:
            self._dealer.close()
            self._cmd_pull.close()

    def _send_msg(self, msg: Message) -> None:
        self._send_raw(codec.encode(msg, self.max_frame_bytes))

    def _send_raw(self, payload) -> None:
        try:
            self._dealer.send_multipart([b"", payload], flags=zmq.NOBLOCK)
        except zmq.Again:
            log.error("dropped a message to %s: send queue full (coordinator unreachable?)",
                      self.address)

    def _drain_commands(self) -> bool:
        """Forward queued sends; False once a stop command is seen."""
        while True:
            try:
                frames = self._cmd_pull.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return True
            if frames[0] == _STOP:
                return False
            self._send_raw(frames[1])

    def _drain_replies(self) -> None:
        while True:
            try:
                frames = self._dealer.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            self.last_heard = time.monotonic()
            try:
                if len(frames) != 2 or frames[0] != b"":
                    raise ProtocolError(f"expected ['', payload] from the coordinator, got "
                                        f"{len(frames)} frame(s)")
                msg = codec.decode(frames[1], self.max_frame_bytes)
            except ProtocolError as exc:
                log.warning("dropped a bad frame from %s: %s", self.address, exc)
                continue
            self._on_message(msg)
