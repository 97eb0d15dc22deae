"""The coordinator process: two ROUTER sockets, one event loop, timers.

Owns: socket setup (HWM, LINGER, ROUTER_MANDATORY, ZMQ heartbeats, a disconnect monitor), the
loop (`zmq.Poller` with a timeout set by the next timer; never a busy poll), frame decoding with
error replies for bad input, handler dispatch through `FRONT_HANDLERS` / `BACK_HANDLERS` (a
client declared gone that speaks again first gets the finals of the requests it lost), the
liveness / deadline / pending timers, operator control and the status snapshot, and draining on
shutdown. Request bookkeeping lives in `dispatcher.py`, sends in `outbox.py`.
With `config.auth` set, both ROUTERs are CURVE servers checked by the ZAP handler in `auth.py`
(a key per port), and each client-port message carries its key's role; `ADMIN_KINDS` are refused
unless that role is `admin`.
Never imports torch (a test imports `infer_cluster.cli` and checks).

Threading: everything runs on the thread that calls `serve_forever`; `request_stop` is the one
method safe to call from elsewhere (signal handlers, tests).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Optional

import zmq

from infer_cluster.client.auth import load_keys
from infer_cluster.protocol import codec
from infer_cluster.protocol.errors import ProtocolError
from infer_cluster.protocol.kinds import ControlKind
from infer_cluster.protocol.messages import (ControlReply, Drain, ErrorReply, HeartbeatAck, Message,
                                             Pause, ReplicaState, Resume, Shutdown)

from .backend import BACK_HANDLERS, on_client_message_on_replica_port
from .clients import ClientRegistry
from .config import CoordinatorConfig
from .dispatcher import Dispatcher, error_payload, returned_client_finals
from .frontend import FRONT_HANDLERS
from .outbox import Outbox
from .registry import ReplicaRegistry
from .requests import RequestState, RequestTable
from .resize import ResizeTracker
from .routing import make_policy

log = logging.getLogger("infer_cluster.coordinator")

MAX_BATCH = 512            # messages read from one socket before looking at the others
MAX_POLL_SECONDS = 0.25    # upper bound on one poll, so stop requests are seen promptly
PROBE_DELAYS = (0.05, 0.5)  # after a TCP disconnect, probe replicas at these delays
# Client-port messages only the admin key may send when auth is on (a new operator action that
# changes the cluster goes here too).
ADMIN_KINDS = frozenset({ControlKind.CONTROL, ControlKind.RESIZE})


class _RateLimitedLog:
    """Bad input can arrive as a flood; log the first per second and count the rest."""

    def __init__(self, interval: float = 1.0):
        self.interval = interval
        self._last = -1e9
        self._suppressed = 0

    def warning(self, fmt: str, *args) -> None:
        now = time.monotonic()
        if now - self._last < self.interval:
            self._suppressed += 1
            return
        if self._suppressed:
            fmt += f" ({self._suppressed} similar suppressed)"
        self._last, self._suppressed = now, 0
        log.warning(fmt, *args)


def _make_router(ctx: zmq.Context, config: CoordinatorConfig) -> zmq.Socket:
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)   # sends to a gone peer fail loudly
    sock.setsockopt(zmq.ROUTER_HANDOVER, 1)    # a peer reconnecting with its identity takes over
    sock.setsockopt(zmq.LINGER, 1000)          # flush final replies on close, but never hang
    sock.setsockopt(zmq.SNDHWM, config.socket_hwm)
    sock.setsockopt(zmq.RCVHWM, config.socket_hwm)
    # Frames up to 4x the cap are read so the sender gets an error reply; beyond that ZMQ drops
    # the connection before buffering it all (protects the coordinator's memory).
    sock.setsockopt(zmq.MAXMSGSIZE, 4 * config.max_frame_bytes + 4096)
    sock.setsockopt(zmq.HEARTBEAT_IVL, 1000)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 5000)
    sock.setsockopt(zmq.HEARTBEAT_TTL, 6000)
    return sock


class Coordinator:
    def __init__(self, config: CoordinatorConfig, context: Optional[zmq.Context] = None):
        self.config = config
        self._authenticator = None
        keys = load_keys(config.auth) if config.auth else None  # AuthError names the fix
        # A ZAP handler belongs to a context; with auth, a context of our own keeps it from
        # judging (or colliding with) other sockets of this process.
        self._own_ctx = context is None and keys is not None
        self._ctx = context or (zmq.Context() if keys else zmq.Context.instance())
        self.front = _make_router(self._ctx, config)
        self.back = _make_router(self._ctx, config)
        self._monitor = None
        try:
            if keys is not None:
                from .auth import CLIENT_DOMAIN, REPLICA_DOMAIN, RoleAuthenticator
                from infer_cluster.client.auth import curve_server
                self._authenticator = RoleAuthenticator(self._ctx, keys)
                self._authenticator.start()  # before bind: libzmq admits anyone without a handler
                curve_server(self.front, keys, CLIENT_DOMAIN)
                curve_server(self.back, keys, REPLICA_DOMAIN)
            self.front_address = self._bind(self.front, config.port)
            self.back_address = self._bind(self.back, config.replica_port)
            # A unique name: pyzmq's default embeds the socket's fd, which a later socket in
            # this process can reuse while the old endpoint is still being torn down.
            monitor_address = f"inproc://coordinator-monitor-{os.getpid()}-{os.urandom(6).hex()}"
            self.back.monitor(monitor_address, zmq.EVENT_DISCONNECTED)
            self._monitor = self._ctx.socket(zmq.PAIR)
            self._monitor.connect(monitor_address)
        except Exception:
            for sock in (self._monitor, self.front, self.back):
                if sock is not None:
                    sock.close(linger=0)
            if self._authenticator is not None:
                self._authenticator.stop()
            if self._own_ctx:
                self._ctx.term()
            raise
        self.outbox = Outbox(self.front, self.back, config.max_frame_bytes)
        self.registry = ReplicaRegistry()
        self.table = RequestTable()
        self.clients = ClientRegistry()
        self.dispatcher = Dispatcher(self.registry, self.table, self.clients,
                                     make_policy(config.routing), self.outbox,
                                     config.no_replica_timeout)
        self.reregister_sent: dict[bytes, float] = {}
        self.resizes = ResizeTracker()
        self.started_at = time.monotonic()
        self.instance = os.urandom(8).hex()
        self.is_draining = False
        self._drain_deadline: Optional[float] = None
        self._stop = threading.Event()
        self._graceful = False
        self._probe_at: list[float] = []
        self._next_liveness = 0.0
        self._bad_log = _RateLimitedLog()
        log.info("coordinator listening: clients %s, replicas %s, routing %s, auth %s",
                 self.front_address, self.back_address, config.routing,
                 f"CURVE (keys in {config.auth})" if keys else "off")

    def _bind(self, sock: zmq.Socket, port: int) -> str:
        if port == 0:
            bound = sock.bind_to_random_port(f"tcp://{self.config.host}")
            return f"tcp://{self.config.host}:{bound}"
        address = f"tcp://{self.config.host}:{port}"
        sock.bind(address)
        return address

    @property
    def model_name(self) -> str:
        live = self.registry.live()
        return live[0].capacity.model if live else ""

    # ------------------------------------------------------------------ loop

    def request_stop(self, graceful: bool = True) -> None:
        """Thread-safe. Graceful: refuse new work, finish in-flight (up to drain_timeout)."""
        self._graceful = graceful
        self._stop.set()

    def serve_forever(self) -> None:
        poller = zmq.Poller()
        poller.register(self.back, zmq.POLLIN)
        poller.register(self.front, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        try:
            while True:
                now = time.monotonic()
                if self._stop.is_set():
                    if not self._graceful:
                        break
                    if not self.is_draining:
                        self._begin_drain(now)
                if self.is_draining and (len(self.table) == 0 or now >= self._drain_deadline):
                    break
                events = dict(poller.poll(self._poll_timeout_ms(now)))
                now = time.monotonic()
                if self.back in events:
                    self._read(self.back, self._on_back_frames, now)
                if self.front in events:
                    if self._authenticator is None:
                        self._read(self.front, self._on_front_frames, now)
                    else:
                        self._read_with_role(self.front, self._on_front_frames, now)
                if self._monitor in events:
                    self._on_monitor_events(now)
                self._run_timers(time.monotonic())
                self._settle(time.monotonic())
        finally:
            self._finish_shutdown()

    def _poll_timeout_ms(self, now: float) -> int:
        wake = [now + MAX_POLL_SECONDS, self._next_liveness]
        deadline = self.table.next_deadline()
        if deadline is not None:
            wake.append(deadline)
        wake.extend(self._probe_at)
        return max(0, int((min(wake) - now) * 1000) + 1)

    def _read(self, sock: zmq.Socket, on_frames, now: float) -> None:
        for _ in range(MAX_BATCH):
            try:
                frames = sock.recv_multipart(flags=zmq.NOBLOCK, copy=True)
            except zmq.Again:
                return
            on_frames(frames, now)
            self._settle(now)

    def _read_with_role(self, sock: zmq.Socket, on_frames, now: float) -> None:
        """Like `_read`, and passes the role libzmq's ZAP handler gave the sender's key."""
        for _ in range(MAX_BATCH):
            try:
                frames = sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            role = frames[-1].get("User-Id")
            on_frames([f.bytes for f in frames], now, role)
            self._settle(now)

    def _settle(self, now: float) -> None:
        """Turn send failures into peer losses, then flush batched deltas."""
        while self.outbox.lost_replicas or self.outbox.lost_clients:
            lost_replicas, self.outbox.lost_replicas = self.outbox.lost_replicas, {}
            for key, why in lost_replicas.items():
                record = self.registry.get(key)
                if record is not None:
                    self.dispatcher.replica_lost(record, why, now)
            lost_clients, self.outbox.lost_clients = self.outbox.lost_clients, {}
            for identity, why in lost_clients.items():
                self.dispatcher.client_gone(identity, why, now,
                                            lost_finals=self.outbox.lost_finals.pop(identity, ()))
        self.outbox.flush()

    # ------------------------------------------------------------------ decoding

    def _decode(self, sock, frames, side: str):
        """Frames -> (identity, message) or None after replying / logging the error."""
        identity = frames[0] if frames else b""
        data = None
        try:
            _, payload = codec.split_envelope(frames)
            data = codec.decode_map(payload, self.config.max_frame_bytes)
            return identity, Message.from_wire(data)
        except ProtocolError as exc:
            self.dispatcher.stats.num_bad_frames += 1
            self._bad_log.warning("%s %s: dropped a bad frame: %s", side, identity.hex(), exc)
            self.outbox.to_identity(sock, identity, ErrorReply(
                code=ProtocolError.code, message=str(exc), request_id=codec.peek_request_id(data)))
            return None

    def _on_front_frames(self, frames, now: float, role: Optional[str] = None) -> None:
        decoded = self._decode(self.front, frames, "client")
        if decoded is None:
            return
        identity, msg = decoded
        if msg.KIND in ADMIN_KINDS and self._authenticator is not None and role != "admin":
            self._bad_log.warning("refused %s from client %s: its key is the %s key, not admin",
                                  msg.KIND.name, identity.hex(), role)
            self.outbox.to_identity(self.front, identity, ControlReply(
                ok=False, replicas=[], message=f"refused: control actions need the admin key, "
                f"this connection uses the {role} key (pass --auth with a folder holding "
                f"admin.key_secret)"))
            return
        if self.clients.num_gone():
            back = self.clients.take_gone(identity, now)
            if back is not None:  # declared gone with requests, yet here it is: tell it their end
                request_ids, reason, ago = back
                log.info("client %s is back %.0f s after it was declared gone (%s): sending the "
                         "finals of its %d lost request(s)", identity.hex(), ago, reason, len(request_ids))
                for payload in returned_client_finals(request_ids, reason, ago):
                    self.outbox.delta(identity, payload)
        handler = FRONT_HANDLERS.get(msg.KIND)
        if handler is None:
            self.outbox.to_identity(self.front, identity, ErrorReply(
                code="protocol", message=f"{msg.KIND.name} is not accepted on the client port"))
            return
        handler(self, identity, msg, now)

    def _on_back_frames(self, frames, now: float) -> None:
        decoded = self._decode(self.back, frames, "replica")
        if decoded is None:
            return
        identity, msg = decoded
        handler = BACK_HANDLERS.get(msg.KIND, on_client_message_on_replica_port)
        handler(self, identity, msg, now)

    def _on_monitor_events(self, now: float) -> None:
        while True:
            try:
                self._monitor.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                break
        # The event does not say which identity left; probing every replica with a cheap
        # message makes ROUTER_MANDATORY report the one that is gone (the probe may race the
        # socket's own cleanup, hence two delays; the heartbeat timeout is the last resort).
        self._probe_at = sorted(set(self._probe_at) | {now + d for d in PROBE_DELAYS})

    # ------------------------------------------------------------------ timers

    def _run_timers(self, now: float) -> None:
        for req in self.table.expired(now):
            log.info("request %s timed out after %.3g s", req.request_id, req.timeout)
            self.dispatcher.time_out(req, now)
        if self._probe_at and self._probe_at[0] <= now:
            self._probe_at = [t for t in self._probe_at if t > now]
            for record in self.registry.live():
                self.outbox.to_replica(record, HeartbeatAck())
        if now >= self._next_liveness:
            self._next_liveness = now + min(0.25, self.config.heartbeat_interval / 2)
            for record in self.registry.expired(now, self.config.replica_timeout):
                self.dispatcher.replica_lost(
                    record, f"no heartbeat for {now - record.last_seen:.1f} s "
                    f"(timeout {self.config.replica_timeout:g} s)", now)
            for client in self.clients.silent(now, self.config.client_timeout):
                self.dispatcher.client_gone(
                    client.identity, f"silent for {now - client.last_seen:.1f} s", now)
            self.dispatcher.flush_pending(now)
            self.resizes.expire(self, now)
            for identity, sent in list(self.reregister_sent.items()):
                if now - sent > 60:
                    del self.reregister_sent[identity]

    # ------------------------------------------------------------------ operator control

    def apply_control(self, action: str, replica_name: Optional[str], now: float):
        """Send PAUSE/RESUME/DRAIN/SHUTDOWN to one replica (by name) or all."""
        targets = (self.registry.find_by_name(replica_name) if replica_name is not None
                   else self.registry.live())
        if not targets:
            return False, (f"no live replica named {replica_name!r}" if replica_name is not None
                           else "no replica is registered"), []
        message, state = {
            "pause": (Pause(reason="operator"), ReplicaState.PAUSED),
            "resume": (Resume(reason="operator"), ReplicaState.ACTIVE),
            "drain": (Drain(reason="operator"), ReplicaState.DRAINING),
            "shutdown": (Shutdown(graceful=True, reason="operator"), ReplicaState.DRAINING),
        }[action]
        for record in targets:
            log.info("operator: %s replica %s", action, record.name)
            if self.outbox.to_replica(record, message):
                # Stop routing to it at once; its own report confirms the state later.
                self.registry.set_state(record, state, f"operator {action}")
        self._settle(now)
        if action == "resume":
            self.dispatcher.flush_pending(now)
        return True, f"{action} sent to {len(targets)} replica(s)", [r.name for r in targets]

    # ------------------------------------------------------------------ status

    def status(self, now: float) -> dict:
        states = {s: 0 for s in RequestState}
        for req in self.table:
            states[req.state] += 1
        data = self.dispatcher.stats.to_dict()
        data.update({
            "name": self.config.name, "front_address": self.front_address,
            "back_address": self.back_address, "routing": self.config.routing,
            "model": self.model_name, "uptime_s": round(now - self.started_at, 3),
            "num_replicas": len(self.registry), "num_clients": len(self.clients),
            "num_in_flight": len(self.table), "num_pending": self.dispatcher.num_pending,
            "num_dispatched": states[RequestState.DISPATCHED],
            "num_streaming": states[RequestState.STREAMING],
            "max_requests": self.config.max_requests, "is_draining": self.is_draining,
        })
        return data

    def replica_rows(self, now: float) -> list[dict]:
        return ([r.status_row(now) for r in self.registry.live()]
                + [r.status_row(now) for r in self.registry.dead()])

    # ------------------------------------------------------------------ shutdown

    def _begin_drain(self, now: float) -> None:
        self.is_draining = True
        self._drain_deadline = now + self.config.drain_timeout
        log.info("coordinator draining: %d request(s) in flight, waiting up to %g s",
                 len(self.table), self.config.drain_timeout)

    def _finish_shutdown(self) -> None:
        now = time.monotonic()
        for req in list(self.table):
            self.dispatcher.abort_on_replica(req)
            self.dispatcher.end(req, error_payload(req.request_id, "error", "no_replica",
                                                   "the coordinator shut down before the request "
                                                   "finished"), RequestState.FAILED, now)
        try:
            self.outbox.flush()
        except zmq.ZMQError:
            pass
        log.info("coordinator stopped (%s)", self.dispatcher.stats.to_dict())
        self.back.disable_monitor()
        for sock in (self._monitor, self.front, self.back):
            sock.close()
        if self._authenticator is not None:
            self._authenticator.stop()
        if self._own_ctx:
            self._ctx.term()
