"""The replica's IO thread: the DEALER socket to the coordinator and nothing else.

Owns: registration (HELLO with protocol version + capacity, retried until HELLO_ACK; again after
REREGISTER or a silent coordinator), heartbeats with load and tokens/s, forwarding the engine
loop's encoded outputs (inproc PUSH -> PULL, because a ZMQ socket belongs to one thread), and
handing coordinator commands to the engine loop's queue. It never calls the engine and never
blocks on it, so a long step cannot delay a heartbeat. No busy polling: one `zmq.Poller` wait
bounded by the next timer. With `config.auth` (a key folder holding the replica keypair, see
`client/auth.py`) the DEALER is a CURVE client; a coordinator that refuses the key (or uses no
auth) is a fatal deployment error, reported once, not retried forever. Never imports torch.

To pass a new coordinator command to the engine loop: add its kind to `ENGINE_COMMANDS`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import time
from typing import Callable

import zmq

from infer_cluster.client.socket_monitor import SocketMonitor
from infer_cluster.protocol import codec
from infer_cluster.protocol.errors import ProtocolError
from infer_cluster.protocol.kinds import ConnectionKind, ControlKind, ReplyKind, RequestKind
from infer_cluster.protocol.messages import (Goodbye, Heartbeat, Hello, Message, ReplicaCapacity, ReplicaLoad)

log = logging.getLogger("infer_cluster.replica")

ENGINE_COMMANDS = frozenset({RequestKind.DISPATCH, RequestKind.ABORT, ControlKind.PAUSE,
                             ControlKind.RESUME, ControlKind.DRAIN, ControlKind.SHUTDOWN,
                             ControlKind.RESIZE_KV})
REREGISTERED = "reregistered"  # pseudo-kind: "drop what you hold, the coordinator forgot it"
HELLO_RETRY_SECONDS = 1.0
_STOP = b"stop"


def make_replica_dealer(ctx: zmq.Context, identity: bytes) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, identity)
    sock.setsockopt(zmq.LINGER, 1000)          # GOODBYE gets out; a dead peer cannot hang exit
    sock.setsockopt(zmq.SNDHWM, 100_000)
    sock.setsockopt(zmq.RCVHWM, 100_000)
    # Queue nothing on a connection that is not up: stale deltas sent while cut off would only
    # be ignored by the coordinator, and queued HELLO retries would arrive as a burst.
    sock.setsockopt(zmq.IMMEDIATE, 1)
    sock.setsockopt(zmq.RECONNECT_IVL, 100)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
    sock.setsockopt(zmq.HEARTBEAT_IVL, 500)     # notice a cut link and reconnect
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3000)
    sock.setsockopt(zmq.HEARTBEAT_TTL, 6000)
    return sock


def _is_heartbeat(payload) -> bool:
    try:
        return codec.decode(payload).KIND is ConnectionKind.HEARTBEAT
    except ProtocolError:
        return False


class ReplicaIO(threading.Thread):
    def __init__(self, config, capacity: dict, inbox, load_fn: Callable[[], ReplicaLoad],
                 state_fn: Callable[[], object], context=None):
        super().__init__(name=f"replica-io-{config.name}", daemon=True)
        self.config = config
        self._ctx = context or zmq.Context.instance()
        self.set_capacity(capacity)
        self._inbox = inbox
        self._load_fn = load_fn
        self._state_fn = state_fn
        identity = f"{config.name}-{socket.gethostname()}-{os.getpid()}-{os.urandom(4).hex()}"
        self.identity = identity.encode()
        self._dealer = make_replica_dealer(self._ctx, self.identity)
        self._uses_auth = bool(getattr(config, "auth", None))
        if self._uses_auth:
            from infer_cluster.client.auth import curve_client, load_keys
            keys = load_keys(config.auth)
            keys.pick_role(("replica",))
            curve_client(self._dealer, keys, "replica")
        self._monitor = SocketMonitor(self._dealer, zmq.EVENT_HANDSHAKE_FAILED_AUTH
                                      | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                                      | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, "replica")
        self._warned_handshake = False
        self._dealer.connect(config.coordinator)
        inproc = f"inproc://replica-out-{self.identity.hex()}"
        self._pull = self._ctx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.LINGER, 0)
        self._pull.bind(inproc)
        self._push = self._ctx.socket(zmq.PUSH)
        self._push.setsockopt(zmq.LINGER, 0)
        self._push.setsockopt(zmq.SNDHWM, 0)  # the engine loop must never block on IO
        self._push.connect(inproc)
        self._push_lock = threading.Lock()
        self.heartbeat_interval = config.heartbeat_interval
        self.is_registered = False
        self.num_registrations = 0
        self.num_dropped = 0
        self.fatal_error = ""
        self._session = os.urandom(8).hex()
        self._last_heard = time.monotonic()
        self._rate_mark = (time.monotonic(), 0)
        self._stopped = False
        # Set by the server once it drained to exit: a coordinator that stopped first (serve's
        # shutdown order) only misses the state change and goodbye, so say so without a warning.
        self.closing = False

    # -------------------------------------------------------------- engine-thread side

    def set_capacity(self, capacity: dict) -> None:
        """What HELLO reports from now on (after a resize). One reference swap: safe to call
        from the engine loop while this thread reads it."""
        self._capacity = ReplicaCapacity(**{k: capacity[k] for k in (
            "model", "num_total_blocks", "block_size", "max_num_seqs", "max_model_len",
            "kv_cache_dtype", "speculative") if k in capacity})

    @property
    def capacity(self) -> ReplicaCapacity:
        return self._capacity

    def send(self, msg: Message) -> None:
        payload = codec.encode(msg)
        with self._push_lock:
            if not self._stopped:
                self._push.send_multipart([b"send", payload])

    def stop(self, goodbye: str, timeout: float = 5.0) -> None:
        with self._push_lock:
            if self._stopped:
                return
            self._stopped = True
            self._push.send_multipart([_STOP, goodbye.encode()[:4000]])
        if self.is_alive():
            self.join(timeout)
        self._push.close()

    # -------------------------------------------------------------- IO thread

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._dealer, zmq.POLLIN)
        poller.register(self._pull, zmq.POLLIN)
        poller.register(self._monitor.socket, zmq.POLLIN)
        next_hello = 0.0
        next_heartbeat = 0.0
        try:
            while True:
                now = time.monotonic()
                wake = next_heartbeat if self.is_registered else next_hello
                events = dict(poller.poll(max(0, int((wake - now) * 1000) + 1)))
                if self._pull in events:
                    goodbye = self._forward_outputs()
                    if goodbye is not None:
                        self._send(Goodbye(reason=goodbye))
                        return
                if self._dealer in events:
                    self._read_commands()
                if self._monitor.socket in events:
                    self._read_monitor()
                now = time.monotonic()
                if not self.is_registered and now >= next_hello and not self.fatal_error:
                    self._send(Hello(replica_name=self.config.name, capacity=self._capacity,
                                     pid=os.getpid(), host=socket.gethostname(),
                                     session=self._session))
                    next_hello = now + HELLO_RETRY_SECONDS
                if self.is_registered and now >= next_heartbeat:
                    self._send(Heartbeat(state=self._state_fn().value, load=self._rated_load(now)))
                    next_heartbeat = now + self.heartbeat_interval
                    if now - self._last_heard > self.config.coordinator_timeout:
                        self._forget_registration(
                            f"coordinator silent for {now - self._last_heard:.1f} s")
                        next_hello = now
        except Exception:
            log.exception("replica IO thread crashed")
            self.fatal_error = "replica IO thread crashed"
        finally:
            self._monitor.close()
            self._dealer.close()
            self._pull.close()

    def _read_monitor(self) -> None:
        """A refused handshake is a deployment error: retrying cannot fix it, so stop."""
        for kind in self._monitor.drain():
            if self.fatal_error:
                continue
            if kind == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                # Also what a coordinator restarting mid-handshake looks like: keep trying.
                if not self._warned_handshake:
                    self._warned_handshake = True
                    log.warning("the coordinator at %s drops the handshake (%s); retrying",
                                self.config.coordinator, "does it hold this folder's coordinator "
                                "key?" if self._uses_auth else "does it require --auth?")
                continue
            if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                self.fatal_error = (f"the coordinator at {self.config.coordinator} refused this "
                                    "replica's key: use the replica key of the cluster's "
                                    "`infer-cluster keygen` folder, on the replica port")
            elif self._uses_auth:
                self.fatal_error = (f"the coordinator at {self.config.coordinator} does not "
                                    "accept CURVE auth with this folder's coordinator key (was it "
                                    "started with the same --auth folder?)")
            else:
                self.fatal_error = (f"the coordinator at {self.config.coordinator} requires "
                                    "authentication: pass --auth DIR (or INFER_CLUSTER_AUTH) "
                                    "with the cluster's key folder")
            log.error("%s", self.fatal_error)

    def _rated_load(self, now: float) -> ReplicaLoad:
        load = self._load_fn()
        t0, n0 = self._rate_mark
        rate = max(0.0, (load.num_generated_tokens - n0) / max(1e-6, now - t0))
        self._rate_mark = (now, load.num_generated_tokens)
        return dataclasses.replace(load, tokens_per_s=round(rate, 2))

    def _send(self, msg: Message) -> None:
        self._send_raw(codec.encode(msg))

    def _send_raw(self, payload) -> None:
        try:
            self._dealer.send_multipart([b"", payload], flags=zmq.NOBLOCK)
        except zmq.Again:
            # Not connected (IMMEDIATE) or the coordinator stopped reading (queue full). A
            # heartbeat may go missing. Anything else (a step's deltas or finals, a state change)
            # leaves the coordinator with requests it will never hear the end of, unless it
            # re-routes them: so this replica drops what it holds and registers again with a
            # new session, which makes the coordinator re-route them from their delivered tokens
            # (or it has declared this replica dead already and re-routed them).
            self.num_dropped += 1
            was_registered = self.is_registered
            if self.is_registered and not self.closing and not _is_heartbeat(payload):
                self._forget_registration("a message to the coordinator could not be queued "
                                          "(not connected, or it is not reading)")
            if self.closing:
                if self.num_dropped == 1:
                    log.info("coordinator %s already stopped; this replica's closing state change "
                             "and goodbye were not delivered (no request was in flight)",
                             self.config.coordinator)
            elif self.num_dropped in (1, 10, 100) or self.num_dropped % 1000 == 0:
                # A first drop before this replica ever registered is the start-up race of a
                # connect that has not completed (the registration is sent again): not a warning.
                level = logging.INFO if self.num_dropped == 1 and not was_registered else logging.WARNING
                log.log(level, "coordinator %s unreachable: %d message(s) dropped",
                        self.config.coordinator, self.num_dropped)

    def _forward_outputs(self):
        """Send what the engine loop queued; returns the GOODBYE reason once stop is seen."""
        while True:
            try:
                frames = self._pull.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return None
            if frames[0] == _STOP:
                return frames[1].decode(errors="replace")
            self._send_raw(frames[1])

    def _forget_registration(self, why: str) -> None:
        log.warning("%s; dropping in-flight requests and registering again", why)
        self.is_registered = False
        self._session = os.urandom(8).hex()
        self._inbox.put((REREGISTERED, why))

    def _read_commands(self) -> None:
        while True:
            try:
                frames = self._dealer.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            self._last_heard = time.monotonic()
            try:
                if len(frames) != 2 or frames[0] != b"":
                    raise ProtocolError(f"expected ['', payload], got {len(frames)} frame(s)")
                msg = codec.decode(frames[1])
            except ProtocolError as exc:
                log.warning("dropped a bad frame from the coordinator: %s", exc)
                continue
            kind = msg.KIND
            if kind in ENGINE_COMMANDS:
                self._inbox.put((kind, msg))
            elif kind is ConnectionKind.HELLO_ACK:
                if not self.is_registered:
                    self.num_registrations += 1
                    log.info("registered with coordinator %s (%d replica(s) live), heartbeat "
                             "every %gs", self.config.coordinator, msg.num_replicas,
                             msg.heartbeat_interval)
                self.is_registered = True
                self.heartbeat_interval = msg.heartbeat_interval
            elif kind is ConnectionKind.REREGISTER:
                if self.is_registered:
                    self._forget_registration(f"coordinator asked to register again: {msg.reason}")
            elif kind is ReplyKind.ERROR:
                if not self.is_registered and msg.code in ("invalid_request", "protocol"):
                    # The answer to our HELLO: wrong model or protocol version. Retrying cannot
                    # fix a deployment error, so exit with the coordinator's explanation.
                    self.fatal_error = f"coordinator refused registration: {msg.message}"
                    log.error(self.fatal_error)
                else:
                    log.warning("coordinator reported an error (%s): %s", msg.code, msg.message)
            elif kind is not ConnectionKind.HEARTBEAT_ACK:
                log.warning("ignoring unexpected %s from the coordinator", kind.name)
