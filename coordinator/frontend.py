"""Handlers for messages from clients (the client ROUTER), as a kind -> function table.

Owns: admission (validation, overload and drain refusals), cancel, status and operator control
requests, client liveness touches. Each handler is `fn(coord, identity, msg, now)`; it may read
coordinator state and call the dispatcher, and it replies through `coord.outbox`. It never reads
sockets. Never imports torch.

To accept a new client message: add its kind and struct in `protocol/`, write a handler here and
add it to `FRONT_HANDLERS` (a unit test checks every client-to-coordinator kind has one).
"""

from __future__ import annotations

import logging

from infer_cluster.protocol import InvalidRequestError, SamplingParams
from infer_cluster.protocol.kinds import ConnectionKind, ControlKind, RequestKind
from infer_cluster.protocol.messages import (ControlReply, ErrorReply, HelloAck, Pong, StatusReply,
                               SubmitRequest)

from .dispatcher import error_payload

log = logging.getLogger("infer_cluster.coordinator")


def _reject(coord, identity: bytes, request_id: str, code: str, message: str) -> None:
    coord.dispatcher.stats.num_rejected += 1
    coord.outbox.delta(identity, error_payload(request_id, "error", code, message))


def on_submit(coord, identity: bytes, msg: SubmitRequest, now: float) -> None:
    client = coord.clients.touch(identity, now)
    rid = msg.request_id
    if coord.table.get(identity, rid) is not None:
        # Not a delta: that would end the request already running under this id.
        coord.outbox.to_client(identity, ErrorReply(
            code="invalid_request", request_id=rid,
            message=f"request id {rid!r} is already in flight from this client; use a new id"))
        coord.dispatcher.stats.num_rejected += 1
        return
    if coord.is_draining:
        _reject(coord, identity, rid, "overloaded", "the coordinator is shutting down and takes "
                "no new requests; retry on another coordinator")
        return
    try:
        params = SamplingParams.from_dict(msg.sampling_params)
    except InvalidRequestError as exc:
        _reject(coord, identity, rid, "invalid_request", str(exc))
        return
    if msg.prompt == "" or msg.prompt_token_ids == [] or msg.messages == []:
        _reject(coord, identity, rid, "invalid_request", "the prompt is empty")
        return
    if len(coord.table) >= coord.config.max_requests:
        coord.dispatcher.stats.num_overloaded += 1
        _reject(coord, identity, rid, "overloaded", f"{len(coord.table)} requests are in flight, "
                f"the coordinator's limit (--max-requests) is {coord.config.max_requests}; retry later")
        return
    req = coord.table.create(identity, rid, msg.prompt, msg.prompt_token_ids, params,
                             msg.priority, msg.timeout, now, messages=msg.messages,
                             tools=msg.tools)
    client.request_ids.add(rid)
    coord.dispatcher.stats.num_submitted += 1
    coord.dispatcher.dispatch(req, now)


def on_cancel(coord, identity, msg, now) -> None:
    coord.clients.touch(identity, now)
    req = coord.table.get(identity, msg.request_id)
    if req is not None:  # already ended: its final is on the way, nothing to do
        coord.dispatcher.cancel(req, now)


def on_client_hello(coord, identity, msg, now) -> None:
    coord.clients.touch(identity, now).name = msg.client_name
    log.debug("client %s (%s) connected", identity.hex(), msg.client_name or "unnamed")
    coord.outbox.to_client(identity, HelloAck(
        coordinator=coord.config.name, heartbeat_interval=coord.config.client_timeout / 4,
        num_replicas=len(coord.registry), model=coord.model_name, instance=coord.instance))


def on_ping(coord, identity, msg, now) -> None:
    coord.clients.touch(identity, now)
    coord.outbox.to_client(identity, Pong(instance=coord.instance))


def on_goodbye(coord, identity, msg, now) -> None:
    coord.dispatcher.client_gone(identity, f"said goodbye: {msg.reason or 'closed'}", now,
                                 may_return=False)


def on_status(coord, identity, msg, now) -> None:
    coord.clients.touch(identity, now)
    coord.outbox.to_client(identity, StatusReply(coordinator=coord.status(now),
                                                 replicas=coord.replica_rows(now)))


def on_control(coord, identity, msg, now) -> None:
    coord.clients.touch(identity, now)
    ok, message, names = coord.apply_control(msg.action, msg.replica, now)
    coord.outbox.to_client(identity, ControlReply(ok=ok, message=message, replicas=names))


def on_resize(coord, identity, msg, now) -> None:
    coord.clients.touch(identity, now)
    coord.resizes.start(coord, identity, msg, now)


def on_replica_message_on_client_port(coord, identity, msg, now) -> None:
    coord.outbox.to_identity(coord.front, identity, ErrorReply(
        code="protocol", message=f"{msg.KIND.name} is a replica message but this is the client "
        f"port; replicas connect to {coord.back_address}"))


FRONT_HANDLERS = {
    RequestKind.SUBMIT: on_submit,
    RequestKind.CANCEL: on_cancel,
    ConnectionKind.CLIENT_HELLO: on_client_hello,
    ConnectionKind.PING: on_ping,
    ConnectionKind.GOODBYE: on_goodbye,
    ControlKind.STATUS: on_status,
    ControlKind.CONTROL: on_control,
    ControlKind.RESIZE: on_resize,
    ConnectionKind.HELLO: on_replica_message_on_client_port,
    ConnectionKind.HEARTBEAT: on_replica_message_on_client_port,
}
