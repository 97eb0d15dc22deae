"""`LoopIO`: the client's socket work on an asyncio event loop instead of an IO thread.

Owns: the job of `ClientIO` (io_thread.py: the DEALER to the coordinator, CLIENT_HELLO, PING,
decoding replies, the connect diagnosis from the socket monitor) for a client that lives inside
one event loop, such as the HTTP gateway's. The DEALER, the inproc command socket and the
monitor are watched with `loop.add_reader` on their ZMQ file descriptors; heartbeats and
connect checks run on `loop.call_later`. Replies are decoded and handed to the client on the
loop's thread.

Why: with an IO thread, a request made on the loop reaches the socket only after that thread
wakes up and gets the GIL, which it gets only once the loop goes idle, and every reply costs a
second thread wake-up and GIL hand-off back to the loop. Here a send made on the loop's thread
goes straight to the DEALER, and a reply is handled where it is used. Sends from any other
thread (e.g. `status()` run in an executor) still travel through the inproc pair, as with
`ClientIO`, and the loop forwards them.

Must never block the loop: every socket call is non-blocking. ZMQ file descriptors are
edge-triggered ("something may have changed"), so a wake-up drains until EAGAIN, and a send
from the loop re-checks ZMQ_EVENTS (a send can consume the edge of a reply that arrived
meanwhile); each heartbeat tick drains too, so a missed edge could delay a reply by one tick
at most, never stall it. Never imports torch.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Optional

import zmq

from infer_cluster.protocol.messages import ClientHello, Goodbye

from .io_thread import UNCONNECTED_TICK, ClientIO

log = logging.getLogger("infer_cluster.client")


class LoopIO(ClientIO):
    """`ClientIO` driven by `loop` (never started as a thread). Create and `start` it on the
    loop's thread, while the loop runs; `stop` it (from any thread) before the loop ends."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._loop = loop
        self._loop_thread: Optional[int] = None
        self._fds: list[int] = []
        self._timer: Optional[asyncio.TimerHandle] = None
        self._closed = threading.Event()

    # -------------------------------------------------------------- any thread

    def start(self) -> None:
        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            on_loop = False
        if not on_loop:
            self._shutdown()
            self._cmd_push.close()
            raise RuntimeError("a client with io_loop must be created on that loop, while it runs")
        self._loop_thread = threading.get_ident()
        for sock, on_ready in ((self._dealer, self._on_dealer), (self._cmd_pull, self._on_commands),
                               (self._monitor.socket, self._read_monitor)):
            fd = sock.getsockopt(zmq.FD)
            self._loop.add_reader(fd, self._guarded, on_ready)
            self._fds.append(fd)
        self._send_msg(ClientHello(client_name=self._name))
        self._next_ping = time.monotonic() + self.heartbeat_interval
        self._schedule_tick()
        for on_ready in (self._on_dealer, self._on_commands, self._read_monitor):
            self._loop.call_soon(self._guarded, on_ready)  # whatever came before add_reader

    def send(self, payload: bytes) -> None:
        if threading.get_ident() != self._loop_thread:
            super().send(payload)  # through the inproc pair; `_on_commands` forwards it
            return
        if self.is_stopped:
            raise RuntimeError("the client is closed")
        self._send_raw(payload)
        self._recheck()

    def stop(self, timeout: float = 5.0) -> None:
        if threading.get_ident() == self._loop_thread or not self._loop.is_running():
            # On the loop itself, or the loop no longer runs (nobody else uses the sockets).
            with self._push_lock:
                if self.is_stopped:
                    return
                self.is_stopped = True
            self._send_msg(Goodbye(reason="client closed"))
            self._shutdown()
            self._cmd_push.close()
            return
        super().stop(timeout)  # STOP through the inproc pair, then `join`

    def join(self, timeout: Optional[float] = None) -> None:
        self._closed.wait(timeout)

    def is_alive(self) -> bool:
        return self._loop_thread is not None and not self._closed.is_set()

    # -------------------------------------------------------------- loop thread

    def _guarded(self, on_ready) -> None:
        if self._closed.is_set():
            return
        try:
            on_ready()
        except Exception:  # a bug here would silently hang every request; make it loud
            log.exception("client socket handler crashed")
            self._on_silence(float("inf"))

    def _on_dealer(self) -> None:
        self._drain_replies()  # until EAGAIN: the descriptor signals again on the next reply

    def _on_commands(self) -> None:
        if not self._drain_commands():
            self.is_stopped = True
            self._send_msg(Goodbye(reason="client closed"))
            self._shutdown()
            return
        self._recheck()

    def _recheck(self) -> None:
        """After a send: a reply that arrived meanwhile may not signal the descriptor again."""
        if self._dealer.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            self._loop.call_soon(self._guarded, self._on_dealer)

    def _schedule_tick(self) -> None:
        wake = self._next_ping
        if not self.is_connected:
            wake = min(wake, time.monotonic() + UNCONNECTED_TICK)
        self._timer = self._loop.call_later(max(0.0, wake - time.monotonic()),
                                            self._guarded, self._tick)

    def _tick(self) -> None:
        self._on_dealer()  # a safety net: no reply waits longer than one tick for an edge
        now = time.monotonic()
        if not self.is_connected and self._on_connect_tick is not None:
            self._on_connect_tick(now, self.refusal)
        if self._ping_if_due(now):
            self._recheck()
            silence = now - self.last_heard
            if silence > self.coordinator_timeout:
                self._on_silence(silence)
        self._schedule_tick()

    def _shutdown(self) -> None:
        if self._closed.is_set():
            return
        if self._timer is not None:
            self._timer.cancel()
        if not self._loop.is_closed():
            for fd in self._fds:
                self._loop.remove_reader(fd)
        self._monitor.close()
        self._dealer.close()
        self._cmd_pull.close()
        self._closed.set()
