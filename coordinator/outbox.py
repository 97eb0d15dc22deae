"""Everything the coordinator sends goes through here.

Owns: encoding and non-blocking sends on the two ROUTER sockets, batching of client deltas (all
deltas for one client produced in one loop turn go out as one DELTA message), and noticing that a
peer is gone (`ROUTER_MANDATORY` makes a send to a vanished identity fail instead of vanishing).
It never decides what a lost peer means: it records it in `lost_clients` / `lost_replicas` and
the coordinator loop hands those to the dispatcher. Never blocks: a full queue is a lost peer.
The request ids whose finals a lost client never got are kept in `lost_finals`, so that the
coordinator can tell the client how they ended if it comes back (a reconnect after a blip).
"""

from __future__ import annotations

import errno
import logging

import zmq

from infer_cluster.protocol import codec
from infer_cluster.protocol.errors import ProtocolError
from infer_cluster.protocol.messages import DeltaPayload, DeltaReply, Message

log = logging.getLogger("infer_cluster.coordinator")

MAX_DELTAS_PER_MESSAGE = 1024


class Outbox:
    def __init__(self, front: zmq.Socket, back: zmq.Socket, max_frame_bytes: int):
        self.front = front
        self.back = back
        self.max_frame_bytes = max_frame_bytes
        self._deltas: dict[bytes, list[DeltaPayload]] = {}
        self.lost_clients: dict[bytes, str] = {}
        self.lost_finals: dict[bytes, list[str]] = {}  # client -> ids whose final did not go out
        self.lost_replicas: dict[bytes, str] = {}
        self.num_sent = 0

    def _send(self, sock: zmq.Socket, identity: bytes, msg: Message) -> str:
        """Returns "" on success, else why the peer cannot be reached."""
        try:
            payload = codec.encode(msg, self.max_frame_bytes)
        except ProtocolError as exc:
            log.error("not sending %s: %s", msg.KIND.name, exc)
            return ""
        try:
            # Copying sends: our messages are small, and pyzmq's zero-copy path (a tracker per
            # frame, freed by a helper thread) measured ~3 ms per send under load.
            sock.send_multipart([identity, b"", payload], flags=zmq.NOBLOCK)
        except zmq.Again:
            return "its queue is full (not reading?)"
        except zmq.ZMQError as exc:
            if exc.errno == errno.EHOSTUNREACH:
                return "disconnected"
            raise
        self.num_sent += 1
        return ""

    def to_client(self, identity: bytes, msg: Message) -> bool:
        why = self._send(self.front, identity, msg)
        if why:
            self.lost_clients.setdefault(identity, why)
        return not why

    def to_replica(self, replica, msg: Message) -> bool:
        why = self._send(self.back, replica.key, msg)
        if why:
            self.lost_replicas.setdefault(replica.key, why)
        return not why

    def to_identity(self, sock: zmq.Socket, identity: bytes, msg: Message) -> None:
        """Reply to a peer that is not (or no longer) registered; failures only matter to it."""
        self._send(sock, identity, msg)

    def delta(self, client: bytes, payload: DeltaPayload) -> None:
        self._deltas.setdefault(client, []).append(payload)

    def flush(self) -> None:
        if not self._deltas:
            return
        pending, self._deltas = self._deltas, {}
        for client, payloads in pending.items():
            if client in self.lost_clients:
                self._lose_finals(client, payloads)
                continue
            for i in range(0, len(payloads), MAX_DELTAS_PER_MESSAGE):
                if not self.to_client(client, DeltaReply(deltas=payloads[i:i + MAX_DELTAS_PER_MESSAGE])):
                    self._lose_finals(client, payloads[i:])
                    break

    def _lose_finals(self, client: bytes, payloads: list[DeltaPayload]) -> None:
        """Remember the requests among `payloads` whose final did not go out to `client`."""
        self.lost_finals.setdefault(client, []).extend(
            p.request_id for p in payloads if p.finish_reason is not None)
