"""Coordinator bookkeeping without sockets: request table, replica registry, config."""

from __future__ import annotations

import pytest

from infer_cluster.coordinator.config import CoordinatorConfig
from infer_cluster.coordinator.registry import REPLICA_TRANSITIONS, ReplicaRegistry
from infer_cluster.coordinator.requests import (REQUEST_STATE_TRANSITIONS, RequestState, RequestTable,
                                  estimate_prompt_tokens)
from infer_cluster.protocol import SamplingParams
from infer_cluster.protocol.messages import Hello, ReplicaCapacity, ReplicaState


def _hello(name="r0", model="m"):
    return Hello(replica_name=name, capacity=ReplicaCapacity(model=model, num_total_blocks=8))


def test_request_lifecycle_and_attempt_ids():
    t = RequestTable()
    req = t.create(b"c1", "a", "hello", None, SamplingParams(max_tokens=4), 0, None, now=0.0)
    assert req.state is RequestState.PENDING and len(t) == 1
    first = t.start_attempt(req, b"rep1")
    assert first == f"{req.seq}.1" and t.by_attempt(first) is req
    req.delivered_token_ids += [1, 2]
    req.move(RequestState.STREAMING)
    t.detach(req, now=1.0)
    assert req.state is RequestState.PENDING and t.by_attempt(first) is None
    second = t.start_attempt(req, b"rep2")
    assert second != first and req.num_remaining_tokens == 2
    t.finish(req, RequestState.FINISHED, now=2.0)
    assert len(t) == 0 and t.by_attempt(second) is None and t.get(b"c1", "a") is None


def test_request_transitions_are_enforced():
    t = RequestTable()
    req = t.create(b"c", "a", "x", None, SamplingParams(), 0, None, now=0.0)
    with pytest.raises(RuntimeError, match="illegal transition pending -> streaming"):
        req.move(RequestState.STREAMING)
    for final in (RequestState.FINISHED, RequestState.ABORTED, RequestState.FAILED):
        assert REQUEST_STATE_TRANSITIONS[final] == frozenset()


def test_same_id_from_two_clients_is_two_requests_but_not_twice_from_one():
    t = RequestTable()
    t.create(b"c1", "a", "x", None, SamplingParams(), 0, None, now=0.0)
    t.create(b"c2", "a", "x", None, SamplingParams(), 0, None, now=0.0)
    with pytest.raises(KeyError, match="already in flight"):
        t.create(b"c1", "a", "x", None, SamplingParams(), 0, None, now=0.0)


def test_deadlines_expire_once_in_order():
    t = RequestTable()
    a = t.create(b"c", "a", "x", None, SamplingParams(), 0, 2.0, now=0.0)
    b = t.create(b"c", "b", "x", None, SamplingParams(), 0, 1.0, now=0.0)
    t.create(b"c", "c", "x", None, SamplingParams(), 0, None, now=0.0)
    assert t.next_deadline() == 1.0
    assert t.expired(0.5) == []
    assert t.expired(1.5) == [b]
    assert t.expired(5.0) == [a]
    assert t.expired(9.0) == []


def test_prompt_estimate():
    assert estimate_prompt_tokens(None, [1, 2, 3]) == 3
    assert estimate_prompt_tokens("abcdefgh", None) == 3


def test_registry_states_and_expiry():
    reg = ReplicaRegistry()
    r = reg.register(b"id0", _hello(), now=0.0)
    assert r.can_accept and reg.candidates() == [r]
    assert reg.set_state(r, ReplicaState.DRAINING)
    assert reg.candidates() == [] and reg.live() == [r]
    assert not reg.set_state(r, ReplicaState.STARTING)  # not in the table: refused
    assert r.state is ReplicaState.DRAINING
    assert reg.expired(now=10.0, timeout=3.0) == [r]
    reg.remove(r, now=10.0, reason="timeout")
    assert r.state is ReplicaState.DEAD and reg.get(b"id0") is None and list(reg.dead()) == [r]
    assert REPLICA_TRANSITIONS[ReplicaState.DEAD] == frozenset()
    reg.register(b"id1", _hello(), now=0.0)
    with pytest.raises(ValueError):
        reg.register(b"id1", _hello(), now=0.0)


def test_status_row_reports_kv_use():
    reg = ReplicaRegistry()
    r = reg.register(b"id0", _hello(), now=0.0)
    r.load.num_free_blocks = 6
    row = r.status_row(now=1.0)
    assert row["kv_used"] == pytest.approx(0.25) and row["state"] == "active"


@pytest.mark.parametrize("kwargs, match", [
    (dict(port=70000), "port must be a TCP port"),
    (dict(port=5555, replica_port=5555), "must differ"),
    (dict(routing="fastest"), "routing must be one of"),
    (dict(max_requests=0), "max_requests must be >= 1"),
    (dict(heartbeat_interval=0), "heartbeat_interval must be > 0"),
    (dict(heartbeat_interval=2.0, replica_timeout=3.0), "at least twice"),
    (dict(max_frame_bytes=10), "max_frame_bytes"),
])
def test_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CoordinatorConfig(**kwargs)


def test_config_defaults_replica_port():
    assert CoordinatorConfig(port=6000).replica_port == 6001
    assert CoordinatorConfig(port=0).replica_port == 0
