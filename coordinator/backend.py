"""Handlers for messages from replicas (the replica ROUTER), as a kind -> function table.

Owns: registration (HELLO, re-registration, model consistency), heartbeats and reported state
changes, step outputs (deltas -> dispatcher), replicas leaving on purpose. Each handler is
`fn(coord, identity, msg, now)`. A message from an identity the registry does not know (a
replica declared dead that is still talking, or one that outlived a coordinator restart) gets
REREGISTER and is otherwise ignored: its deltas belong to attempts already re-routed.
Never imports torch.

To accept a new replica message: add kind + struct in `protocol/`, a handler here, an entry in
`BACK_HANDLERS`.
"""

from __future__ import annotations

import logging

from infer_cluster.protocol.kinds import ConnectionKind, LifecycleKind, ReplyKind
from infer_cluster.protocol.messages import ErrorReply, HeartbeatAck, HelloAck, ReplicaState, Reregister

log = logging.getLogger("infer_cluster.coordinator")

REREGISTER_INTERVAL = 1.0  # at most one REREGISTER per unknown identity per second


def _unknown(coord, identity: bytes, now: float) -> None:
    last = coord.reregister_sent.get(identity, -1e9)
    if now - last >= REREGISTER_INTERVAL:
        coord.reregister_sent[identity] = now
        log.info("message from unregistered replica identity %s; asking it to register again",
                 identity.hex())
        coord.outbox.to_identity(coord.back, identity, Reregister(
            reason="this coordinator does not know you (restarted, or you were declared dead); "
                   "drop your requests and send HELLO"))


def on_hello(coord, identity, msg, now) -> None:
    old = coord.registry.get(identity)
    if old is not None and msg.session and msg.session == old.session:
        old.last_seen = now  # a retried HELLO that crossed our HELLO_ACK: just acknowledge again
        coord.outbox.to_replica(old, HelloAck(
            coordinator=coord.config.name, heartbeat_interval=coord.config.heartbeat_interval,
            num_replicas=len(coord.registry), model=old.capacity.model))
        return
    if old is not None:
        coord.dispatcher.replica_lost(old, "registered again (its old requests are gone)", now)
    models = {r.capacity.model for r in coord.registry.live()}
    if models and msg.capacity.model not in models:
        log.error("replica %s refused: serves model %r, the cluster serves %r", msg.replica_name,
                  msg.capacity.model, sorted(models)[0])
        coord.outbox.to_identity(coord.back, identity, ErrorReply(
            code="invalid_request", message=f"this cluster serves model {sorted(models)[0]!r}, "
            f"you serve {msg.capacity.model!r}; start the replica with the same --model"))
        return
    coord.reregister_sent.pop(identity, None)
    record = coord.registry.register(identity, msg, now)
    cap = msg.capacity
    log.info("replica %s registered from %s pid %d: model %s, %d KV blocks x %d, max %d seqs",
             record.name, msg.host or "?", msg.pid, cap.model, cap.num_total_blocks,
             cap.block_size, cap.max_num_seqs)
    coord.outbox.to_replica(record, HelloAck(
        coordinator=coord.config.name, heartbeat_interval=coord.config.heartbeat_interval,
        num_replicas=len(coord.registry), model=cap.model))
    coord.dispatcher.flush_pending(now)


def _apply_state(coord, record, state: str, why: str, now: float) -> None:
    new = ReplicaState(state)
    if new is ReplicaState.DEAD:
        return  # only the coordinator declares death
    was_accepting = record.can_accept
    coord.registry.set_state(record, new, why)
    if record.can_accept and not was_accepting:
        coord.dispatcher.flush_pending(now)


def _seen_replica(coord, identity: bytes, now: float):
    """The registered replica behind `identity`, marked as heard from now; None (and a
    re-register request) for an identity this coordinator does not know."""
    record = coord.registry.get(identity)
    if record is None:
        _unknown(coord, identity, now)
        return None
    record.last_seen = now
    return record


def on_heartbeat(coord, identity, msg, now) -> None:
    record = _seen_replica(coord, identity, now)
    if record is None:
        return
    record.load = msg.load
    _apply_state(coord, record, msg.state, "heartbeat", now)
    coord.outbox.to_replica(record, HeartbeatAck())


def on_step_output(coord, identity, msg, now) -> None:
    record = _seen_replica(coord, identity, now)
    if record is None:
        coord.dispatcher.stats.num_stale_deltas += len(msg.deltas)
        return
    if msg.load is not None:
        record.load = msg.load
    for payload in msg.deltas:
        coord.dispatcher.on_delta(record, payload, now)


def on_replica_state(coord, identity, msg, now) -> None:
    record = _seen_replica(coord, identity, now)
    if record is None:
        return
    _apply_state(coord, record, msg.state, msg.reason or "reported", now)


def on_resize_done(coord, identity, msg, now) -> None:
    record = _seen_replica(coord, identity, now)
    if record is not None:
        coord.resizes.on_done(coord, record, msg)


def on_replica_goodbye(coord, identity, msg, now) -> None:
    record = coord.registry.get(identity)
    if record is not None:
        coord.dispatcher.replica_lost(record, f"said goodbye: {msg.reason or 'exiting'}", now,
                                      expected=True)


def on_client_message_on_replica_port(coord, identity, msg, now) -> None:
    coord.outbox.to_identity(coord.back, identity, ErrorReply(
        code="protocol", message=f"{msg.KIND.name} is a client message but this is the replica "
        f"port; clients connect to {coord.front_address}"))


BACK_HANDLERS = {
    ConnectionKind.HELLO: on_hello,
    ConnectionKind.HEARTBEAT: on_heartbeat,
    ConnectionKind.GOODBYE: on_replica_goodbye,
    ReplyKind.STEP_OUTPUT: on_step_output,
    LifecycleKind.REPLICA_STATE: on_replica_state,
    LifecycleKind.RESIZE_DONE: on_resize_done,
}
