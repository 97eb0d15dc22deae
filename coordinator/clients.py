"""Client registry: which client identities are alive and which requests each owns.

Owns: `ClientRecord` (last time a client was heard from, its in-flight request ids) and
`ClientRegistry`. A client that has requests and falls silent for longer than the client timeout
is gone: the coordinator aborts its requests so their KV blocks are freed. Such a client may only
have been stopped (SIGSTOP, a debugger, a paused VM, a full send queue) and come back: the
registry remembers the ids it lost (`remember_gone`, for `GONE_TTL_S`, at most `MAX_GONE`
clients), and the coordinator tells it their finals when it speaks again (`take_gone`). Pure
bookkeeping: never sends, never imports torch or zmq.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Optional

GONE_TTL_S = 3600.0   # how long the ids a gone client lost are kept for its return
MAX_GONE = 10_000     # gone clients remembered at once (the oldest are forgotten first)


@dataclass
class ClientRecord:
    identity: bytes
    name: str = ""
    last_seen: float = 0.0
    request_ids: set = field(default_factory=set)  # the client's own request ids in flight


class ClientRegistry:
    def __init__(self):
        self._by_identity: dict[bytes, ClientRecord] = {}
        # identity -> (when it was declared gone, the request ids it lost, why)
        self._gone: OrderedDict[bytes, tuple[float, list[str], str]] = OrderedDict()

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

    def remember_gone(self, identity: bytes, request_ids: list[str], reason: str, now: float) -> None:
        """Keep the ids of the requests a gone client lost, for `take_gone` if it comes back."""
        if not request_ids:
            return
        _, before, _ = self._gone.pop(identity, (now, [], reason))
        self._gone[identity] = (now, before + list(request_ids), reason)
        while len(self._gone) > MAX_GONE:
            self._gone.popitem(last=False)

    def take_gone(self, identity: bytes, now: float) -> Optional[tuple[list[str], str, float]]:
        """(lost request ids, why, seconds since) when `identity` was declared gone with requests
        and has not been told yet; None otherwise. Forgets entries older than `GONE_TTL_S`."""
        while self._gone:
            first = next(iter(self._gone))
            if now - self._gone[first][0] <= GONE_TTL_S:
                break
            del self._gone[first]
        entry = self._gone.pop(identity, None) if self._gone else None
        if entry is None:
            return None
        when, request_ids, reason = entry
        return request_ids, reason, now - when

    def num_gone(self) -> int:
        return len(self._gone)

    def silent(self, now: float, timeout: float) -> list[ClientRecord]:
        """Clients not heard from for `timeout` seconds (with or without requests)."""
        return [c for c in self._by_identity.values() if now - c.last_seen > timeout]

    def num_requests(self) -> int:
        return sum(len(c.request_ids) for c in self._by_identity.values())
