"""Routing policies: which live replica gets the next request.

Owns: the `RoutingPolicy` interface and the built-in policies, registered by name in
`ROUTING_POLICIES` (`least-load` default, `prefix`, `round-robin`). A policy only chooses; it
never sends, never mutates replica records, and never sees sockets. It sees each candidate as an
object with `key` (unique, hashable), `outstanding_tokens` and `num_requests`, and optionally
`kv_capacity_tokens` (tokens its KV pool holds; it changes when an operator resizes a replica).
Never imports torch or zmq.

To add a policy: subclass `RoutingPolicy`, set `name`, implement `choose` (and `forget` if it
keeps per-replica state), and add it to `ROUTING_POLICIES`. Unit-test it with plain objects.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional, Protocol, Sequence

import xxhash


class ReplicaView(Protocol):
    key: object
    outstanding_tokens: int
    num_requests: int


@dataclass
class RoutingInfo:
    """What a policy may look at in a request."""

    prompt: Optional[str] = None
    prompt_token_ids: Optional[list] = None
    num_tokens: int = 0  # estimated prompt + remaining output tokens


class RoutingPolicy:
    name = ""

    def choose(self, replicas: Sequence[ReplicaView], info: RoutingInfo) -> ReplicaView:
        raise NotImplementedError

    def forget(self, key: object) -> None:
        """A replica left; drop anything remembered about it."""


def relative_load(replica) -> float:
    """Outstanding tokens per token of KV capacity (plain outstanding tokens when the capacity
    is unknown), so a replica with twice the KV pool takes twice the work."""
    capacity = getattr(replica, "kv_capacity_tokens", 0) or 1
    return replica.outstanding_tokens / capacity


class LeastLoadPolicy(RoutingPolicy):
    """Least outstanding work (prompt + not-yet-generated output tokens of assigned requests)
    relative to KV capacity.

    Ties go round-robin so a burst onto an idle cluster spreads evenly."""

    name = "least-load"

    def __init__(self):
        self._turn = 0

    def choose(self, replicas, info):
        if not replicas:
            raise ValueError("no replica to choose from")
        self._turn += 1
        n = len(replicas)
        best = min(range(n), key=lambda i: (relative_load(replicas[i]),
                                            replicas[i].num_requests, (i - self._turn) % n))
        return replicas[best]


class RoundRobinPolicy(RoutingPolicy):
    name = "round-robin"

    def __init__(self):
        self._turn = 0

    def choose(self, replicas, info):
        if not replicas:
            raise ValueError("no replica to choose from")
        choice = replicas[self._turn % len(replicas)]
        self._turn += 1
        return choice


def prefix_chain_hashes(info: RoutingInfo, chunk_tokens: int, chunk_chars: int,
                        max_chunks: int) -> list[int]:
    """Chained xxhash of the prompt's leading full chunks: hash i covers chunks 0..i, so two
    prompts share hash i exactly when they share their first i+1 chunks."""
    if info.prompt_token_ids is not None:
        ids = info.prompt_token_ids
        chunks = [b"t" + b"".join(t.to_bytes(4, "little") for t in ids[i:i + chunk_tokens])
                  for i in range(0, min(len(ids), chunk_tokens * max_chunks) - chunk_tokens + 1,
                                 chunk_tokens)]
    else:
        data = (info.prompt or "").encode("utf-8", "surrogatepass")
        chunks = [b"s" + data[i:i + chunk_chars]
                  for i in range(0, min(len(data), chunk_chars * max_chunks) - chunk_chars + 1,
                                 chunk_chars)]
    hashes, parent = [], 0
    for chunk in chunks:
        parent = xxhash.xxh64_intdigest(chunk, seed=parent & 0xFFFFFFFFFFFFFFFF)
        hashes.append(parent)
    return hashes


class PrefixAffinityPolicy(RoutingPolicy):
    """Send prompts that share a leading prefix to the replica that saw it (its prefix cache
    holds those KV blocks), unless that replica is much busier than the least loaded one."""

    name = "prefix"

    def __init__(self, chunk_tokens: int = 16, chunk_chars: int = 64, max_chunks: int = 32,
                 max_entries: int = 200_000, imbalance_ratio: float = 1.5,
                 imbalance_slack_tokens: int = 4096):
        self.chunk_tokens = chunk_tokens
        self.chunk_chars = chunk_chars
        self.max_chunks = max_chunks
        self.max_entries = max_entries
        self.imbalance_ratio = imbalance_ratio
        self.imbalance_slack_tokens = imbalance_slack_tokens
        self._owner: OrderedDict[int, object] = OrderedDict()  # chain hash -> replica key (LRU)
        self._fallback = LeastLoadPolicy()
        self.num_affinity_hits = 0

    def choose(self, replicas, info):
        if not replicas:
            raise ValueError("no replica to choose from")
        hashes = prefix_chain_hashes(info, self.chunk_tokens, self.chunk_chars, self.max_chunks)
        by_key = {r.key: r for r in replicas}
        least = self._fallback.choose(replicas, info)
        choice = least
        for h in reversed(hashes):  # longest shared prefix first
            owner = by_key.get(self._owner.get(h))
            if owner is not None:
                limit = least.outstanding_tokens * self.imbalance_ratio + self.imbalance_slack_tokens
                if owner.outstanding_tokens <= limit:
                    choice = owner
                    self.num_affinity_hits += 1
                break
        for h in hashes:
            self._owner[h] = choice.key
            self._owner.move_to_end(h)
        while len(self._owner) > self.max_entries:
            self._owner.popitem(last=False)
        return choice

    def forget(self, key):
        for h in [h for h, owner in self._owner.items() if owner == key]:
            del self._owner[h]


ROUTING_POLICIES: dict[str, type[RoutingPolicy]] = {
    cls.name: cls for cls in (LeastLoadPolicy, PrefixAffinityPolicy, RoundRobinPolicy)
}


def make_policy(name: str) -> RoutingPolicy:
    try:
        return ROUTING_POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown routing policy {name!r}; choose from {sorted(ROUTING_POLICIES)}") from None
