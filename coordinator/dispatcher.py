"""Moving requests between the table, the replicas and the clients.

Owns: dispatch (pick a replica, send DISPATCH), re-route when a replica is lost (resume from the
tokens already delivered), the pending queue (requests waiting for any replica), ending a
request exactly once (forwarded final, cancel, timeout, error, client gone), and the counters
`infer-cluster status` shows. It never reads sockets and never decodes bytes; it sends through
the `Outbox` it is given. Never imports torch.

Invariants: a request is in exactly one of {pending queue, one replica's `request_ids`, ended};
the client receives exactly one final delta per request it submitted (none if it is gone);
tokens reach the client only from the request's live attempt.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

from infer_cluster.protocol.errors import REFUSAL_CODES
from infer_cluster.protocol.messages import AbortRequest, DeltaPayload, DispatchRequest, ErrorInfo

from .clients import ClientRegistry
from .registry import ReplicaRecord, ReplicaRegistry
from .requests import RequestState, RequestTable, TrackedRequest
from .routing import RoutingInfo, RoutingPolicy

log = logging.getLogger("infer_cluster.coordinator")


@dataclass
class CoordinatorStats:
    num_submitted: int = 0
    num_completed: int = 0       # ended with stop / length
    num_aborted: int = 0         # cancelled by a client
    num_client_gone_aborts: int = 0
    num_failed: int = 0          # ended with an error (not a refusal)
    num_refused: int = 0         # refused by a replica for what the request asks (protocol REFUSAL_CODES)
    num_timeouts: int = 0
    num_rejected: int = 0        # refused at admission (invalid, overloaded, draining)
    num_overloaded: int = 0
    num_reroutes: int = 0        # dispatch attempts after a replica was lost
    num_resumed: int = 0         # re-routes that carried already-delivered tokens
    num_replica_deaths: int = 0       # lost without a goodbye (heartbeat timeout, socket gone, re-registered)
    num_replica_departures: int = 0   # left on purpose (GOODBYE: drained, resized away, stopped)
    num_stale_deltas: int = 0    # deltas from an attempt that was given up on (ignored)
    num_bad_frames: int = 0
    num_delivered_tokens: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def returned_client_finals(request_ids: list[str], reason: str, ago: float) -> list[DeltaPayload]:
    """The finals a client hears when it speaks again after it was declared gone."""
    return [error_payload(rid, "error", "unreachable",
                          f"the coordinator ended request {rid} {ago:.0f} s ago while this client was "
                          f"silent or not reading ({reason}); resubmit it") for rid in request_ids]


def error_payload(request_id: str, reason: str, code: str, message: str) -> DeltaPayload:
    return DeltaPayload(request_id=request_id, finish_reason=reason,
                        error=ErrorInfo(code=code, message=message))


class Dispatcher:
    def __init__(self, registry: ReplicaRegistry, table: RequestTable, clients: ClientRegistry,
                 policy: RoutingPolicy, outbox, no_replica_timeout: float):
        self.registry = registry
        self.table = table
        self.clients = clients
        self.policy = policy
        self.outbox = outbox
        self.no_replica_timeout = no_replica_timeout
        self.stats = CoordinatorStats()
        self._pending: OrderedDict[int, TrackedRequest] = OrderedDict()  # seq -> request

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    # ------------------------------------------------------------------ dispatch

    def dispatch(self, req: TrackedRequest, now: float) -> None:
        """Send `req` to the best replica; park it in the pending queue when none can take it."""
        while True:
            candidates = self.registry.candidates()
            if not candidates:
                if req.seq not in self._pending:
                    self._pending[req.seq] = req
                return
            info = RoutingInfo(prompt=req.prompt, prompt_token_ids=req.prompt_token_ids,
                               num_tokens=req.load_estimate())
            replica = self.policy.choose(candidates, info)
            attempt_id = self.table.start_attempt(req, replica.key)
            msg = DispatchRequest(request_id=attempt_id, prompt=req.prompt,
                                  prompt_token_ids=req.prompt_token_ids,
                                  sampling_params=req.sampling_params, priority=req.priority,
                                  resume_token_ids=list(req.delivered_token_ids),
                                  messages=req.messages, tools=req.tools)
            if self.outbox.to_replica(replica, msg):
                self._pending.pop(req.seq, None)
                replica.request_ids.add(attempt_id)
                replica.num_dispatched += 1
                req.charged_tokens = req.load_estimate()
                replica.outstanding_tokens += req.charged_tokens
                log.debug("request %s -> replica %s as %s", req.request_id, replica.name, attempt_id)
                if req.num_reroutes:
                    log.info("request %s re-routed to replica %s (attempt %d, resuming after %d "
                             "delivered tokens)", req.request_id, replica.name, req.attempt,
                             len(req.delivered_token_ids))
                return
            # The replica vanished between choosing and sending: undo and try the others.
            self.table.detach(req, now)
            self.replica_lost(replica, "unreachable when sending a request", now)

    def flush_pending(self, now: float) -> None:
        """Retry parked requests (a replica registered or became active); fail those that have
        waited longer than `no_replica_timeout`."""
        for req in list(self._pending.values()):
            if req.state is not RequestState.PENDING:
                self._pending.pop(req.seq, None)
                continue
            if now - req.pending_since > self.no_replica_timeout:
                self._pending.pop(req.seq, None)
                num_live = len(self.registry)
                if num_live == 0:
                    why = "no replica is registered"
                    fix = "start a replica with `infer-cluster replica --coordinator ...`"
                else:
                    why = f"none of the {num_live} replicas accepts requests (paused or draining)"
                    fix = "resume paused ones with `infer-cluster control resume`, or start a replica"
                self.fail(req, "no_replica", f"{why} for {self.no_replica_timeout:g} s; {fix}", now)
            elif self.registry.candidates():
                self.dispatch(req, now)

    # ------------------------------------------------------------------ replica loss

    def replica_lost(self, replica: ReplicaRecord, reason: str, now: float,
                     expected: bool = False) -> None:
        """Forget the replica and re-route every request it held (resuming streamed ones)."""
        if not replica.is_alive:
            return
        level = logging.WARNING if replica.num_requests or not expected else logging.INFO
        log.log(level, "replica %s (%s pid %d) %s: %s; re-routing %d request(s)", replica.name,
                replica.host or "?", replica.pid, "left" if expected else "lost", reason,
                replica.num_requests)
        self.registry.remove(replica, now, reason)
        self.policy.forget(replica.key)
        if expected:
            self.stats.num_replica_departures += 1
        else:
            self.stats.num_replica_deaths += 1
        orphans = [self.table.by_attempt(a) for a in sorted(replica.request_ids)]
        replica.request_ids.clear()
        replica.outstanding_tokens = 0
        for req in orphans:
            if req is None or req.state.is_final:
                continue
            self.table.detach(req, now)
            req.num_reroutes += 1
            self.stats.num_reroutes += 1
            if req.delivered_token_ids:
                self.stats.num_resumed += 1
            if req.num_remaining_tokens == 0:
                # Everything was delivered; only the final delta was lost with the replica.
                self.end(req, DeltaPayload(request_id=req.request_id, finish_reason="length"),
                         RequestState.FINISHED, now)
                continue
            self.dispatch(req, now)

    # ------------------------------------------------------------------ deltas

    def on_delta(self, replica: ReplicaRecord, payload: DeltaPayload, now: float) -> None:
        """One delta from `replica`; forwarded to the client only if it is the live attempt."""
        req = self.table.by_attempt(payload.request_id)
        if req is None or req.replica != replica.key:
            self.stats.num_stale_deltas += 1
            return
        if payload.token_ids:
            req.delivered_token_ids.extend(payload.token_ids)
            self.stats.num_delivered_tokens += len(payload.token_ids)
            if req.first_token_at is None:
                req.first_token_at = now
            if req.state is RequestState.DISPATCHED:
                req.move(RequestState.STREAMING)
        new_charge = req.load_estimate()
        replica.outstanding_tokens += new_charge - req.charged_tokens
        req.charged_tokens = new_charge
        payload.request_id = req.request_id
        if payload.finish_reason is None:
            self.outbox.delta(req.client, payload)
            return
        state = {"stop": RequestState.FINISHED, "length": RequestState.FINISHED,
                 "abort": RequestState.ABORTED}.get(payload.finish_reason, RequestState.FAILED)
        if state is RequestState.FAILED:  # the client's id beside the replica's (its log's) id
            log.info("request %s %s on replica %s (as %s): %s", req.request_id,
                     "refused" if _refused(payload) else "failed", replica.name,
                     req.attempt_id, payload.error.message if payload.error else payload.finish_reason)
        self.end(req, payload, state, now)

    # ------------------------------------------------------------------ endings

    def end(self, req: TrackedRequest, final: Optional[DeltaPayload], state: RequestState,
            now: float, notify_client: bool = True) -> None:
        """End `req` exactly once: release its replica slot, send `final` to its client."""
        if req.state.is_final:
            return
        replica = self.registry.get(req.replica) if req.replica is not None else None
        if replica is not None:
            replica.request_ids.discard(req.attempt_id)
            replica.outstanding_tokens -= req.charged_tokens
            replica.num_completed += 1
        req.charged_tokens = 0
        self._pending.pop(req.seq, None)
        self.table.finish(req, state, now)
        client = self.clients.get(req.client)
        if client is not None:
            client.request_ids.discard(req.request_id)
        if state is RequestState.FINISHED:
            self.stats.num_completed += 1
        elif state is RequestState.FAILED:
            if final is not None and final.finish_reason == "timeout":
                self.stats.num_timeouts += 1
            elif final is not None and _refused(final):
                self.stats.num_refused += 1
            else:
                self.stats.num_failed += 1
        if notify_client and final is not None:
            final.request_id = req.request_id
            self.outbox.delta(req.client, final)

    def abort_on_replica(self, req: TrackedRequest) -> None:
        """Tell the replica running `req` to drop it (frees its KV blocks now)."""
        replica = self.registry.get(req.replica) if req.replica is not None else None
        if replica is not None and req.state in (RequestState.DISPATCHED, RequestState.STREAMING):
            self.outbox.to_replica(replica, AbortRequest(request_ids=[req.attempt_id]))

    def fail(self, req: TrackedRequest, code: str, message: str, now: float) -> None:
        log.info("request %s failed: %s", req.request_id, message)
        self.abort_on_replica(req)
        self.end(req, error_payload(req.request_id, "error", code, message), RequestState.FAILED, now)

    def cancel(self, req: TrackedRequest, now: float) -> None:
        self.abort_on_replica(req)
        self.stats.num_aborted += 1
        self.end(req, DeltaPayload(request_id=req.request_id, finish_reason="abort"),
                 RequestState.ABORTED, now)

    def time_out(self, req: TrackedRequest, now: float) -> None:
        self.abort_on_replica(req)
        message = (f"request exceeded its timeout of {req.timeout:g} s after "
                   f"{len(req.delivered_token_ids)} token(s)")
        self.end(req, error_payload(req.request_id, "timeout", "timeout", message),
                 RequestState.FAILED, now)

    def client_gone(self, identity: bytes, reason: str, now: float, may_return: bool = True,
                    lost_finals: Sequence[str] = ()) -> int:
        """Abort every request of a vanished client (no reply: nobody is listening). With
        `may_return` (not after a goodbye) their ids are kept, with `lost_finals` (requests that
        ended here but whose final did not reach it): if the client speaks again, the server
        sends it `returned_client_finals` for all of them."""
        reqs = self.table.of_client(identity)
        if may_return:
            self.clients.remember_gone(identity, [r.request_id for r in reqs] + list(lost_finals),
                                       reason, now)
        by_replica: dict[bytes, list[str]] = {}
        for req in reqs:
            if req.replica is not None and req.state in (RequestState.DISPATCHED,
                                                         RequestState.STREAMING):
                by_replica.setdefault(req.replica, []).append(req.attempt_id)
            self.end(req, None, RequestState.ABORTED, now, notify_client=False)
        for key, attempt_ids in by_replica.items():
            replica = self.registry.get(key)
            if replica is not None:
                self.outbox.to_replica(replica, AbortRequest(request_ids=attempt_ids))
        self.clients.forget(identity)
        self.stats.num_client_gone_aborts += len(reqs)
        if reqs:
            log.warning("client %s gone (%s): aborted its %d request(s)", identity.hex(), reason,
                        len(reqs))
        return len(reqs)


def _refused(final: DeltaPayload) -> bool:
    """The replica refused the request itself (protocol `REFUSAL_CODES`), not failed it."""
    return final.error is not None and final.error.code in REFUSAL_CODES

