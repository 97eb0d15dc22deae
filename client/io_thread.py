"""The client's one IO thread: owns the DEALER socket to the coordinator.

Owns: connecting, sending what user threads hand over (through an inproc PUSH/PULL pair, since a
ZMQ socket must only be used by one thread), receiving and decoding replies, periodic PING so
the coordinator knows this client is alive (it aborts the requests of silent clients; the ping
also goes out from inside a long drain of replies, so a client busy reading never looks silent), and
noticing a silent coordinator. A message zmq will not queue goes to the client's
`on_dropped`: a full send queue fails the request in it; before the first answer (no connection
has worked yet) the client keeps it and sends it again (`send_now`) once the coordinator answers. It calls back into the client for
every decoded message and never blocks on a user: callbacks only touch in-memory state. No busy
polling: one `zmq.Poller` wait bounded by the next heartbeat (10 Hz while no reply has arrived
yet, to fail waiting calls on time). Until the first reply, a socket monitor explains why
nothing answers (connection refused, CURVE key refused, auth on one side only) so the client can
fail fast with that reason. With keys (`client/auth.py`) the DEALER is a CURVE client. Never
imports torch.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import time
from typing import Callable, Optional

import zmq

from infer_cluster.protocol import codec
from infer_cluster.protocol.errors import ProtocolError
from infer_cluster.protocol.messages import ClientHello, Goodbye, Message, Ping

from .socket_monitor import SocketMonitor

log = logging.getLogger("infer_cluster.client")

_STOP = b"stop"
_SEND = b"send"
UNCONNECTED_TICK = 0.1  # seconds between connect-deadline checks before the first reply
_MONITOR_EVENTS = (zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                   | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                   | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_CONNECTED)
_TCP_ADDRESS = re.compile(r"^tcp://(\[[0-9a-fA-F:.]+\]|[^:/\s\[\]]+):(\d+)$")


def check_address(address: str) -> str:
    """A usable ZMQ address, or ValueError saying what form is expected."""
    if not isinstance(address, str):
        raise ValueError(f"the address must be a string like tcp://HOST:PORT, got {address!r}")
    if address.startswith(("ipc://", "inproc://")) and len(address.split("://", 1)[1]) > 0:
        return address
    match = _TCP_ADDRESS.match(address)
    if match is None or not 0 < int(match.group(2)) < 65536:
        raise ValueError(f"bad address {address!r}: expected tcp://HOST:PORT with a port in "
                         "1..65535, e.g. tcp://127.0.0.1:5555")
    return address


def _unresolvable_host(address: str) -> Optional[str]:
    match = _TCP_ADDRESS.match(address)
    if match is None or match.group(1).startswith("["):
        return None
    try:
        socket.getaddrinfo(match.group(1), None)
        return None
    except OSError:
        return match.group(1)


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
                 max_frame_bytes: int, keys=None, role: str = "client",
                 on_connect_tick: Optional[Callable[[float, Optional[str]], None]] = None,
                 on_dropped: Optional[Callable[[bytes], None]] = None):
        super().__init__(name=f"infer-cluster-client-io-{name}", daemon=True)
        self.address = address
        self._on_message = on_message
        self._on_silence = on_silence
        self._on_connect_tick = on_connect_tick
        self._on_dropped = on_dropped  # a message zmq would not queue: the client fails its request
        self.hwm = hwm
        self.num_dropped = 0
        self.uses_auth = keys is not None
        self.is_connected = False        # set by the client on the coordinator's first reply
        self.refusal: Optional[str] = None   # a handshake failure that retrying cannot fix
        self._seen_events: set[int] = set()  # monitor events so far (until connected)
        self.heartbeat_interval = heartbeat_interval
        self.coordinator_timeout = coordinator_timeout
        self.max_frame_bytes = max_frame_bytes
        identity = f"client-{name}-{os.getpid()}-{os.urandom(6).hex()}".encode()
        self.identity = identity
        self._dealer = make_dealer(ctx, identity, hwm)
        try:
            if keys is not None:
                from .auth import curve_client
                curve_client(self._dealer, keys, role)
            self._monitor = SocketMonitor(self._dealer, _MONITOR_EVENTS, "client")
            self._dealer.connect(address)
        except Exception:
            self._dealer.close(linger=0)
            raise
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
        self._next_ping = self.last_heard + heartbeat_interval  # the next heartbeat (run() resets it)
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
        poller.register(self._monitor.socket, zmq.POLLIN)
        self._send_msg(ClientHello(client_name=self._name))
        self._next_ping = time.monotonic() + self.heartbeat_interval
        try:
            while True:
                wake = self._next_ping
                if not self.is_connected:
                    wake = min(wake, time.monotonic() + UNCONNECTED_TICK)
                timeout_ms = max(0, int((wake - time.monotonic()) * 1000) + 1)
                events = dict(poller.poll(timeout_ms))
                if self._cmd_pull in events and not self._drain_commands():
                    self._send_msg(Goodbye(reason="client closed"))
                    return
                if self._dealer in events:
                    self._drain_replies()
                if self._monitor.socket in events:
                    self._read_monitor()
                now = time.monotonic()
                if not self.is_connected and self._on_connect_tick is not None:
                    self._on_connect_tick(now, self.refusal)
                if self._ping_if_due(now):
                    silence = now - self.last_heard
                    if silence > self.coordinator_timeout:
                        self._on_silence(silence)
        except Exception:  # a bug here would silently hang every request; make it loud
            log.exception("client IO thread crashed")
            self._on_silence(float("inf"))
        finally:
            self._monitor.close()
            self._dealer.close()
            self._cmd_pull.close()

    # -------------------------------------------------------------- connection diagnosis

    def _read_monitor(self) -> None:
        for kind in self._monitor.drain():
            self._seen_events.add(kind)
            if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                self.refusal = (f"the coordinator at {self.address} refused this client's key "
                                "(check --auth / INFER_CLUSTER_AUTH: the key must come from the "
                                "cluster's `infer-cluster keygen` folder, and clients use the "
                                "client port, not the replica port)")
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
                self.refusal = self._mechanism_mismatch()

    def _mechanism_mismatch(self) -> str:
        if self.uses_auth:
            return (f"the peer at {self.address} does not use CURVE auth with this key folder's "
                    "coordinator key (is it started with the same --auth folder?)")
        return (f"the coordinator at {self.address} requires authentication; pass --auth DIR "
                "(or set INFER_CLUSTER_AUTH) with a key folder from `infer-cluster keygen`")

    def describe_no_answer(self, waited: float) -> str:
        """Why nothing answered after `waited` seconds, with what to check (one line)."""
        if self.refusal:
            return self.refusal
        host = _unresolvable_host(self.address)
        if host is not None:
            return f"cannot resolve host {host!r} in {self.address}; check the address"
        seen = self._seen_events
        head = f"no answer from the coordinator at {self.address} in {waited:g} s"
        if zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL in seen:
            # libzmq reports a mechanism mismatch either way, depending on who closes first.
            if self.uses_auth:
                return (f"{head}: it drops the CURVE handshake, so it does not hold this "
                        "folder's coordinator key (or runs without --auth); use a key folder "
                        "from the same `infer-cluster keygen` as the coordinator's --auth")
            return self._mechanism_mismatch()
        if zmq.EVENT_HANDSHAKE_SUCCEEDED in seen:
            return (f"{head} although the connection is up; is this the coordinator's client "
                    "port (--port), not the replica port or another program?")
        if zmq.EVENT_CONNECTED in seen:
            return f"{head}: the connection keeps closing; is this an infer-cluster coordinator?"
        return (f"{head} (connection refused or unreachable: nothing listens there); is it "
                "running, and is the address its client port (--port)?")

    def _send_msg(self, msg: Message) -> None:
        self._send_raw(codec.encode(msg, self.max_frame_bytes))

    def send_now(self, payload: bytes) -> None:
        """Send from the IO thread (or the loop) itself, e.g. inside a callback."""
        self._send_raw(payload)

    def _send_raw(self, payload) -> None:
        try:
            self._dealer.send_multipart([b"", payload], flags=zmq.NOBLOCK)
        except zmq.Again:
            # Before the first answer this is the connect failure the client reports itself.
            self.num_dropped += 1
            if self.num_dropped in (1, 10, 100) or self.num_dropped % 1000 == 0:
                log.log(logging.ERROR if self.is_connected else logging.DEBUG,
                        "dropped a message to %s: send queue full (%d waiting; coordinator not "
                        "reading?); %d dropped so far (a dropped submit fails its request)",
                        self.address, self.hwm, self.num_dropped)
            if self._on_dropped is not None:
                self._on_dropped(payload)

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

    def _ping_if_due(self, now: float) -> bool:
        """Send the heartbeat if it is due; True when it was sent."""
        if now < self._next_ping:
            return False
        self._send_msg(Ping())
        self._next_ping = now + self.heartbeat_interval
        return True

    def _drain_replies(self) -> None:
        while True:
            try:
                frames = self._dealer.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            self.last_heard = now = time.monotonic()
            # A client working through a backlog of replies must not fall silent: the
            # coordinator ends the requests of a client it has not heard from in client_timeout.
            self._ping_if_due(now)
            try:
                if len(frames) != 2 or frames[0] != b"":
                    raise ProtocolError(f"expected ['', payload] from the coordinator, got "
                                        f"{len(frames)} frame(s)")
                msg = codec.decode(frames[1], self.max_frame_bytes)
            except ProtocolError as exc:
                log.warning("dropped a bad frame from %s: %s", self.address, exc)
                continue
            self._on_message(msg)
