"""Client registry: which client identities are alive and which requests each owns.

Owns: `ClientRecord` (last time a client was heard from, its in-flight request ids) and
`ClientRegistry`. A client that has requests and falls silent for longer than the client timeout
is gone: the coordinator aborts its requests so their KV blocks are freed. Pure bookkeeping:
never sends, never imports torch or zmq.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ClientRecord:
    identity: bytes
    name: str = ""
    last_seen: float = 0.0
    request_ids: set = field(default_factory=set)  # the client's own request ids in flight


class ClientRegistry:
    def __init__(self):
        self._by_identity: dict[bytes, ClientRecord] = {}

    def __len__(self) -> int:
        return len(self._by_identity)

    def touch(self, identity: bytes, now: float) -> ClientRecord:
        rec = self._by_identity.get(identity)
        if rec is None:
            rec = self._by_identity[identity] = ClientRecord(identity=identity, last_seen=now)
        rec.last_seen = now
        return rec

    def get(self, identity: bytes):
        return self._by_identity.get(identity)

    def forget(self, identity: bytes) -> None:
        self._by_identity.pop(identity, None)

    def silent(self, now: float, timeout: float) -> list[ClientRecord]:
        """Clients not heard from for `timeout` seconds (with or without requests)."""
        return [c for c in self._by_identity.values() if now - c.last_seen > timeout]

    def num_requests(self) -> int:
        return sum(len(c.request_ids) for c in self._by_identity.values())
