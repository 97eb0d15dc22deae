"""`Outbox`: a client that cannot be reached (ROUTER_MANDATORY: an identity with no connection)
is recorded as lost, and the ids whose finals did not go out are kept in `lost_finals` (for the
coordinator to tell the client if it comes back), including deltas batched after it was lost.
Real ROUTER socket, no peer."""

import zmq

from infer_cluster.coordinator.outbox import Outbox
from infer_cluster.protocol.messages import DeltaPayload


def test_finals_a_lost_client_never_got_are_kept():
    ctx = zmq.Context()
    try:
        front = ctx.socket(zmq.ROUTER)
        front.setsockopt(zmq.ROUTER_MANDATORY, 1)
        front.setsockopt(zmq.LINGER, 0)
        front.bind("tcp://127.0.0.1:*")
        outbox = Outbox(front, front, 1 << 20)
        ghost = b"client-ghost"
        outbox.delta(ghost, DeltaPayload(request_id="streaming", token_ids=[1, 2]))
        outbox.delta(ghost, DeltaPayload(request_id="done", token_ids=[3], finish_reason="length"))
        outbox.flush()
        assert ghost in outbox.lost_clients
        assert outbox.lost_finals == {ghost: ["done"]}
        outbox.delta(ghost, DeltaPayload(request_id="late", finish_reason="stop"))
        outbox.delta(ghost, DeltaPayload(request_id="late-streaming", token_ids=[4]))
        outbox.flush()  # still lost (not yet settled): not sent, but remembered
        assert outbox.lost_finals == {ghost: ["done", "late"]}
    finally:
        ctx.destroy(linger=0)
