"""Replica registry: who is connected, in what state, how loaded, and since when silent.

Owns: `ReplicaRecord` (one registered replica as the coordinator sees it), the replica state
machine (`REPLICA_TRANSITIONS`) and `ReplicaRegistry` (lookup by socket identity, liveness by
last-seen time). Pure bookkeeping: it never sends anything and never touches requests; the
coordinator decides what a death means for requests. Never imports torch or zmq.

To add a replica state: add it to `protocol.messages.ReplicaState`, give it a row here, and say in
`ReplicaRecord.can_accept` whether it takes new work.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, Optional

from infer_cluster.protocol.messages import Hello, ReplicaCapacity, ReplicaLoad, ReplicaState

log = logging.getLogger("infer_cluster.coordinator")

S = ReplicaState
# Allowed state changes (staying in a state is always allowed). DEAD is final: a replica that
# comes back registers again as a new record.
REPLICA_TRANSITIONS: dict[ReplicaState, frozenset[ReplicaState]] = {
    S.STARTING: frozenset({S.ACTIVE, S.PAUSED, S.DRAINING, S.STOPPING, S.DEAD}),
    S.ACTIVE: frozenset({S.PAUSED, S.DRAINING, S.STOPPING, S.DEAD}),
    S.PAUSED: frozenset({S.ACTIVE, S.DRAINING, S.STOPPING, S.DEAD}),
    S.DRAINING: frozenset({S.DRAINED, S.ACTIVE, S.PAUSED, S.STOPPING, S.DEAD}),
    S.DRAINED: frozenset({S.ACTIVE, S.DRAINING, S.STOPPING, S.DEAD}),
    S.STOPPING: frozenset({S.DEAD}),
    S.DEAD: frozenset(),
}


@dataclass
class ReplicaRecord:
    key: bytes                  # ZMQ identity on the replica ROUTER
    name: str
    capacity: ReplicaCapacity
    index: int                  # registration number, for stable ordering in tables
    pid: int = 0
    host: str = ""
    session: str = ""
    state: ReplicaState = ReplicaState.ACTIVE
    registered_at: float = 0.0
    last_seen: float = 0.0
    load: ReplicaLoad = field(default_factory=ReplicaLoad)
    request_ids: set = field(default_factory=set)  # coordinator-internal ids assigned here
    outstanding_tokens: int = 0  # routing load: estimated tokens still to process
    num_dispatched: int = 0
    num_completed: int = 0
    died_at: Optional[float] = None
    death_reason: str = ""

    @property
    def num_requests(self) -> int:
        return len(self.request_ids)

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens the replica's KV pool holds (routing weighs load by it)."""
        return self.capacity.num_total_blocks * self.capacity.block_size

    @property
    def can_accept(self) -> bool:
        return self.state is ReplicaState.ACTIVE

    @property
    def is_alive(self) -> bool:
        return self.state is not ReplicaState.DEAD

    def status_row(self, now: float) -> dict:
        """One row of `infer-cluster status` (plain data for the wire)."""
        load = self.load
        used = max(0, load.num_total_blocks - load.num_free_blocks)
        return {
            "name": self.name, "host": self.host, "pid": self.pid, "state": self.state.value,
            "model": self.capacity.model, "num_requests": self.num_requests,
            "max_model_len": self.capacity.max_model_len,
            "block_size": self.capacity.block_size, "kv_cache_dtype": self.capacity.kv_cache_dtype,
            "speculative": self.capacity.speculative,
            "num_prefilling": load.num_prefilling, "num_generating": load.num_generating,
            "num_running": load.num_running, "num_waiting": load.num_waiting,
            "num_free_blocks": load.num_free_blocks, "num_total_blocks": load.num_total_blocks,
            "kv_used": (used / load.num_total_blocks) if load.num_total_blocks else 0.0,
            "tokens_per_s": load.tokens_per_s, "num_preemptions": load.num_preemptions,
            "prefix_cache_hit_tokens": load.prefix_cache_hit_tokens,
            "num_host_blocks": load.num_host_blocks, "num_host_used_blocks": load.num_host_used_blocks,
            "prefix_cache_hit_tokens_host": load.prefix_cache_hit_tokens_host,
            "num_swapped_out": load.num_swapped_out,
            "num_spec_draft_tokens": load.num_spec_draft_tokens,
            "num_spec_accepted_tokens": load.num_spec_accepted_tokens,
            "spec_draft_tokens_per_position": list(load.spec_draft_tokens_per_position),
            "spec_accepted_tokens_per_position": list(load.spec_accepted_tokens_per_position),
            "num_generated_tokens": load.num_generated_tokens,
            "outstanding_tokens": self.outstanding_tokens, "num_dispatched": self.num_dispatched,
            "num_completed": self.num_completed,
            "seconds_since_seen": round(now - self.last_seen, 3),
            "death_reason": self.death_reason,
        }


class ReplicaRegistry:
    """Live replicas by identity, plus the last few dead ones (for the status table)."""

    def __init__(self, keep_dead: int = 32):
        self._by_key: dict[bytes, ReplicaRecord] = {}
        self._dead: deque[ReplicaRecord] = deque(maxlen=keep_dead)
        self._num_registered = 0

    def __len__(self) -> int:
        return len(self._by_key)

    def get(self, key: bytes) -> Optional[ReplicaRecord]:
        return self._by_key.get(key)

    def register(self, key: bytes, hello: Hello, now: float) -> ReplicaRecord:
        if key in self._by_key:
            raise ValueError("identity already registered; remove the old record first")
        record = ReplicaRecord(key=key, name=hello.replica_name, capacity=hello.capacity,
                               index=self._num_registered, pid=hello.pid, host=hello.host,
                               session=hello.session,
                               registered_at=now, last_seen=now,
                               load=ReplicaLoad(num_total_blocks=hello.capacity.num_total_blocks,
                                                num_free_blocks=hello.capacity.num_total_blocks))
        self._num_registered += 1
        self._by_key[key] = record
        return record

    def set_state(self, record: ReplicaRecord, state: ReplicaState, why: str = "") -> bool:
        """Apply a state change if the table allows it; log and refuse otherwise."""
        if state is record.state:
            return True
        if state not in REPLICA_TRANSITIONS[record.state]:
            log.warning("replica %s: ignoring state change %s -> %s (%s)", record.name,
                        record.state.value, state.value, why or "no reason")
            return False
        log.info("replica %s: %s -> %s%s", record.name, record.state.value, state.value,
                 f" ({why})" if why else "")
        record.state = state
        return True

    def remove(self, record: ReplicaRecord, now: float, reason: str) -> None:
        """Mark dead and forget the identity (its requests are the caller's to re-route)."""
        self.set_state(record, ReplicaState.DEAD, reason)
        record.died_at = now
        record.death_reason = reason
        self._by_key.pop(record.key, None)
        self._dead.append(record)

    def live(self) -> list[ReplicaRecord]:
        return sorted(self._by_key.values(), key=lambda r: r.index)

    def candidates(self) -> list[ReplicaRecord]:
        """Replicas that take new requests, in registration order."""
        return [r for r in self.live() if r.can_accept]

    def expired(self, now: float, timeout: float) -> list[ReplicaRecord]:
        return [r for r in self._by_key.values() if now - r.last_seen > timeout]

    def find_by_name(self, name: str) -> list[ReplicaRecord]:
        return [r for r in self._by_key.values() if r.name == name]

    def dead(self) -> Iterable[ReplicaRecord]:
        return tuple(self._dead)
