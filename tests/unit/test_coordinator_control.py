"""The coordinator's operator side over real sockets, with scripted fake replicas and raw
protocol clients: which port takes which peer, replica registration (another model, a repeated
hello, a heartbeat from a stranger), pause / resume, status, graceful stop and KV resizes.
The request flow (streams, failover, cancels, admission) is in test_coordinator_flow.py.
"""

from __future__ import annotations

import time

import pytest

from infer_cluster.protocol.kinds import ControlKind, ReplyKind
from infer_cluster.protocol.messages import ControlRequest, Heartbeat, Hello, ReplicaCapacity, StatusRequest, SubmitRequest

from .test_coordinator_helpers import (CoordinatorThread, FakeReplica, RawClient, cluster,  # noqa: F401 (a fixture)
                                      fake_tokens, stats, submit)

pytestmark = pytest.mark.timeout(60)


def test_wrong_port_messages_get_a_pointer_to_the_right_port(cluster):
    c = cluster.client()
    c.send(Hello(replica_name="lost", capacity=ReplicaCapacity(model="m")))
    msg = c.recv()
    assert msg.KIND.name == "ERROR" and cluster.back in msg.message
    r = FakeReplica(cluster.back, "confused", register=False)
    r.send(SubmitRequest(request_id="a", prompt="x"))
    msg = r.recv_one(2.0)
    assert msg.KIND.name == "ERROR" and cluster.front in msg.message
    r.close()


def test_replica_with_another_model_is_refused(cluster):
    cluster.replica("a", model="tiny-random")
    other = FakeReplica(cluster.back, "b", register=False)
    other.send(Hello(replica_name="b", capacity=ReplicaCapacity(model="other-model")))
    msg = other.recv_one(2.0)
    assert msg.KIND.name == "ERROR" and "tiny-random" in msg.message
    assert len(cluster.coord.registry) == 1
    other.close()


def test_hello_retry_is_idempotent_but_a_new_session_re_registers(cluster):
    r = FakeReplica(cluster.back, "r", register=False)
    hello = Hello(replica_name="r", capacity=ReplicaCapacity(model="m"), session="s1")
    r.send(hello)
    assert r.recv_one(2.0).KIND.name == "HELLO_ACK"
    c = cluster.client()
    submit(c, "a", max_tokens=3)
    r.wait_for_requests(1)
    first_attempt = next(iter(r.requests))
    r.send(hello)  # a retry crossing the ack: nothing changes
    r.pump(0.2)
    assert stats(cluster).num_reroutes == 0
    r.send(Hello(replica_name="r", capacity=ReplicaCapacity(model="m"), session="s2"))
    r.wait_for_requests(2)  # same request, new attempt, same (re-registered) replica
    assert stats(cluster).num_reroutes == 1
    new_attempt = [a for a in r.requests if a != first_attempt][0]
    r.requests.pop(first_attempt)
    while r.requests:
        r.step(1)
    got = c.deltas(1)
    assert [t for d in got["a"] for t in d.token_ids] == fake_tokens("hello", 3)
    assert new_attempt.endswith(".2")
    r.close()


def test_pause_and_resume_through_control(cluster):
    r = cluster.replica("r")
    c = cluster.client()
    c.send(ControlRequest(action="pause", replica="r"))
    reply = c.recv()
    assert reply.KIND.name == "CONTROL_REPLY" and reply.ok and reply.replicas == ["r"]
    r.pump(0.2)
    assert any(m.KIND.name == "PAUSE" for m in r.other)
    submit(c, "wait", max_tokens=1)
    r.pump(0.3)
    assert not r.requests and cluster.coord.dispatcher.num_pending == 1
    c.send(ControlRequest(action="resume"))
    assert c.recv().ok
    r.wait_for_requests(1)
    r.step(1)
    assert c.deltas(1)["wait"][-1].finish_reason == "length"
    c.send(ControlRequest(action="drain", replica="nobody"))
    reply = c.recv()
    assert not reply.ok and "nobody" in reply.message


def test_status_reports_replicas_and_counters(cluster):
    r = cluster.replica("r")
    r.heartbeat(num_running=2, num_free_blocks=40, num_total_blocks=100)
    c = cluster.client()
    time.sleep(0.1)
    c.send(StatusRequest())
    msg = c.recv()
    assert msg.coordinator["num_replicas"] == 1
    row = msg.replicas[0]
    assert row["name"] == "r" and row["num_running"] == 2 and row["kv_used"] == pytest.approx(0.6)


def test_graceful_stop_finishes_in_flight_and_refuses_new():
    ct = CoordinatorThread()
    r = FakeReplica(ct.back)
    c = RawClient(ct.front)
    submit(c, "inflight", max_tokens=2)
    r.wait_for_requests(1)
    ct.coord.request_stop(graceful=True)
    time.sleep(0.3)
    submit(c, "late")
    got = c.deltas(1)
    assert got["late"][-1].error.code == "overloaded"
    r.step(2)
    got = c.deltas(1)
    assert got["inflight"][-1].finish_reason == "length"
    ct.thread.join(5)
    assert not ct.thread.is_alive()
    r.close()
    c.close()


def test_heartbeat_from_unknown_replica_gets_reregister(cluster):
    r = FakeReplica(cluster.back, "ghost", register=False)
    r.send(Heartbeat())
    msg = r.recv_one(2.0)
    assert msg.KIND.name == "REREGISTER"
    r.close()


def _resize_kv(replica, timeout=2.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        replica.pump(0.05)
        for msg in replica.other:
            if msg.KIND is ControlKind.RESIZE_KV:
                replica.other.remove(msg)
                return msg
    raise AssertionError("no RESIZE_KV reached the replica")


def test_resize_is_forwarded_and_the_new_capacity_reaches_status_and_routing(cluster):
    from infer_cluster.protocol.messages import ReplicaLoad, ResizeDone, ResizeRequest
    r = cluster.replica("r")
    c = cluster.client()
    c.send(ResizeRequest(replica="r", num_kv_blocks=300, kv_cache_dtype="int8"))
    fwd = _resize_kv(r)
    assert (fwd.num_kv_blocks, fwd.kv_cache_dtype) == (300, "int8") and fwd.ticket
    cap = ReplicaCapacity(model="tiny-random", num_total_blocks=300, block_size=16,
                          max_num_seqs=8, max_model_len=512, kv_cache_dtype="int8")
    r.send(ResizeDone(ticket=fwd.ticket, ok=True, message="KV pool now 300 blocks", capacity=cap,
                      load=ReplicaLoad(num_total_blocks=300, num_free_blocks=300)))
    reply = c.recv()
    assert reply.KIND is ReplyKind.CONTROL_REPLY and reply.ok and reply.capacity == cap
    assert reply.message == "replica r: KV pool now 300 blocks" and reply.replicas == ["r"]
    (record,) = cluster.coord.registry.live()
    assert record.capacity == cap and record.kv_capacity_tokens == 300 * 16
    c.send(StatusRequest())
    row = c.recv().replicas[0]
    assert (row["num_total_blocks"], row["kv_cache_dtype"]) == (300, "int8")


def test_resize_refusals_and_a_replica_dying_before_it_answers(cluster):
    from infer_cluster.protocol.messages import ResizeRequest
    r = cluster.replica("r")
    c = cluster.client()
    c.send(ResizeRequest(replica="nobody", num_kv_blocks=64))
    reply = c.recv()
    assert not reply.ok and "no live replica named 'nobody' (live: r)" in reply.message
    c.send(ResizeRequest(replica="r", num_kv_blocks=31))  # max_model_len 512 needs 32 blocks
    reply = c.recv()
    assert not reply.ok and "needs 32 blocks of 16 tokens" in reply.message
    c.send(ResizeRequest(replica="r", num_kv_blocks=64))
    _resize_kv(r)
    r.goodbye()  # leaves without answering
    reply = c.recv(3.0)
    assert reply is not None and not reply.ok
    assert reply.message == "replica r went away before answering the resize"
    assert len(cluster.coord.resizes) == 0
    # A goodbye is a departure, not a death (the deaths counter is for alerting on failures).
    assert stats(cluster).num_replica_departures == 1 and stats(cluster).num_replica_deaths == 0
