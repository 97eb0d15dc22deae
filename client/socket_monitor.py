"""`SocketMonitor`: the events libzmq reports about one socket's connection, read without blocking.

Owns: making a socket's monitor (a PAIR on a unique inproc address), draining the events that
have arrived, and closing it. What an event means is the owner's business: the client's IO
(client/io_thread.py, client/loop_io.py) turns them into a one-line reason why nothing answers,
the replica's IO (worker/serving/replica_io.py) into a fatal deployment error. Never imports torch.

To watch another event: pass its `zmq.EVENT_*` flag in `events` and handle it in the owner.
"""

from __future__ import annotations

import os

import zmq
from zmq.utils.monitor import recv_monitor_message


class SocketMonitor:
    def __init__(self, sock: zmq.Socket, events: int, name: str):
        self._sock = sock
        # A unique address: pyzmq's default embeds the fd, which a later socket may reuse.
        self.socket = sock.get_monitor_socket(
            events, addr=f"inproc://{name}-monitor-{os.getpid()}-{os.urandom(6).hex()}")

    def drain(self) -> list[int]:
        """The `zmq.EVENT_*` kinds that arrived since the last call, oldest first."""
        kinds = []
        while True:
            try:
                kinds.append(recv_monitor_message(self.socket, flags=zmq.NOBLOCK)["event"])
            except zmq.Again:
                return kinds

    def close(self) -> None:
        self._sock.disable_monitor()
        self.socket.close(linger=0)
