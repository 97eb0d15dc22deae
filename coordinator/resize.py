"""Operator resizes of a replica's KV pool (`infer-cluster control resize`), end to end on the
coordinator side.

Owns: `ResizeTracker`: checking a RESIZE against the registry (exactly one live replica of that
name; blocks at least one max-length request's worth, from the capacity the replica reported),
forwarding it as RESIZE_KV with a ticket, and answering the operator exactly once with a
CONTROL_REPLY: the replica's RESIZE_DONE (its new capacity then becomes the record's, so status
and routing see it at once), the replica dying first, or no answer within `timeout`. Never
imports torch; never touches requests (the replica preempts what does not fit, nothing ends).

To extend (e.g. resize every replica at once): keep one ticket per replica and one reply per
operator request.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from infer_cluster.protocol.messages import ControlReply, ResizeDone, ResizeKV, ResizeRequest

log = logging.getLogger("infer_cluster.coordinator")

RESIZE_TIMEOUT = 120.0  # seconds; a GPU resize re-captures CUDA graphs


@dataclass
class _Pending:
    client: bytes
    replica_key: bytes
    replica_name: str
    deadline: float


class ResizeTracker:
    def __init__(self, timeout: float = RESIZE_TIMEOUT):
        self.timeout = timeout
        self._pending: dict[str, _Pending] = {}

    def __len__(self) -> int:
        return len(self._pending)

    def start(self, coord, identity: bytes, msg: ResizeRequest, now: float) -> None:
        """Check and forward one operator RESIZE; bad input is answered at once."""
        records = coord.registry.find_by_name(msg.replica)
        if len(records) != 1:
            names = sorted({r.name for r in coord.registry.live()})
            why = (f"no live replica named {msg.replica!r} (live: {', '.join(names) or 'none'})"
                   if not records else f"{len(records)} live replicas are named {msg.replica!r}; "
                   "resize needs exactly one")
            self._reply(coord, identity, False, why, [])
            return
        record = records[0]
        cap = record.capacity
        need = -(-cap.max_model_len // cap.block_size)
        if msg.num_kv_blocks is not None and msg.num_kv_blocks < need:
            self._reply(coord, identity, False, f"--blocks {msg.num_kv_blocks} is too small for "
                        f"replica {record.name}: one request of max_model_len {cap.max_model_len} "
                        f"tokens needs {need} blocks of {cap.block_size} tokens", [record.name])
            return
        ticket = os.urandom(8).hex()
        forwarded = ResizeKV(ticket=ticket, num_kv_blocks=msg.num_kv_blocks,
                             kv_cache_dtype=msg.kv_cache_dtype)
        if not coord.outbox.to_replica(record, forwarded):
            self._reply(coord, identity, False, f"replica {record.name} is unreachable", [record.name])
            return
        log.info("operator: resize replica %s to %s blocks, kv dtype %s", record.name,
                 msg.num_kv_blocks or "same bytes", msg.kv_cache_dtype or "unchanged")
        self._pending[ticket] = _Pending(identity, record.key, record.name, now + self.timeout)

    def on_done(self, coord, record, msg: ResizeDone) -> None:
        """The replica's answer: adopt its new capacity and load, answer the operator."""
        pending = self._pending.pop(msg.ticket, None)
        if msg.capacity is not None:
            record.capacity = msg.capacity
        if msg.load is not None:
            record.load = msg.load
        if msg.ok:
            log.info("replica %s resized: %s", record.name, msg.message)
        else:
            log.warning("replica %s refused a resize: %s", record.name, msg.message)
        if pending is not None:
            self._reply(coord, pending.client, msg.ok, f"replica {record.name}: {msg.message}",
                        [record.name], msg.capacity)

    def expire(self, coord, now: float) -> None:
        """Answer resizes whose replica died or stayed silent past the deadline."""
        for ticket, p in list(self._pending.items()):
            if coord.registry.get(p.replica_key) is None:
                why = f"replica {p.replica_name} went away before answering the resize"
            elif now >= p.deadline:
                why = f"replica {p.replica_name} did not answer the resize within {self.timeout:g} s"
            else:
                continue
            del self._pending[ticket]
            self._reply(coord, p.client, False, why, [p.replica_name])

    @staticmethod
    def _reply(coord, identity: bytes, ok: bool, message: str, names: list, capacity=None) -> None:
        coord.outbox.to_client(identity, ControlReply(ok=ok, message=message, replicas=names,
                                                      capacity=capacity))
