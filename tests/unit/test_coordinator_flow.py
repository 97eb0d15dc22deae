"""The coordinator over real sockets, with scripted fake replicas and raw protocol clients.

Each test drives the fake replicas by hand, so interleavings (a replica dying after streaming
two tokens, a delta arriving after a cancel) are exact. Integration tests repeat the important
ones with the real EngineServer.
"""

from __future__ import annotations

import time

import msgpack
import pytest

from infer_cluster.coordinator.backend import BACK_HANDLERS
from infer_cluster.coordinator.frontend import FRONT_HANDLERS
from infer_cluster.protocol import codec
from infer_cluster.protocol.kinds import ConnectionKind, ControlKind, LifecycleKind, ReplyKind, RequestKind
from infer_cluster.protocol.messages import CancelRequest, ClientHello, DeltaPayload, StepOutput, SubmitRequest

from .test_coordinator_helpers import (CoordinatorThread, FakeReplica, RawClient, cluster,  # noqa: F401 (a fixture)
                                      fake_tokens, stats, submit, wait_until)

pytestmark = pytest.mark.timeout(60)


def test_handler_tables_cover_every_kind_a_peer_sends():
    client_kinds = {RequestKind.SUBMIT, RequestKind.CANCEL, ConnectionKind.CLIENT_HELLO,
                    ConnectionKind.PING, ConnectionKind.GOODBYE, ControlKind.STATUS,
                    ControlKind.CONTROL, ControlKind.RESIZE}
    replica_kinds = {ConnectionKind.HELLO, ConnectionKind.HEARTBEAT, ConnectionKind.GOODBYE,
                     ReplyKind.STEP_OUTPUT, LifecycleKind.REPLICA_STATE, LifecycleKind.RESIZE_DONE}
    assert client_kinds <= set(FRONT_HANDLERS)
    assert replica_kinds <= set(BACK_HANDLERS)
    from infer_cluster.worker.serving.replica_io import ENGINE_COMMANDS
    assert ENGINE_COMMANDS == {RequestKind.DISPATCH, RequestKind.ABORT, ControlKind.PAUSE,
                               ControlKind.RESUME, ControlKind.DRAIN, ControlKind.SHUTDOWN,
                               ControlKind.RESIZE_KV}


def test_stream_reaches_the_client_under_its_own_id(cluster):
    r = cluster.replica()
    c = cluster.client()
    submit(c, "mine", prompt="abc", max_tokens=3, temperature=0.0)
    r.wait_for_requests(1)
    (attempt, st), = r.requests.items()
    assert attempt != "mine" and st["dispatch"].sampling_params["temperature"] == 0.0
    for _ in range(3):
        r.step(1)
    got = c.deltas(1)
    assert list(got) == ["mine"]
    assert [t for d in got["mine"] for t in d.token_ids] == fake_tokens("abc", 3)
    assert [d.finish_reason for d in got["mine"]] == [None, None, "length"]
    assert stats(cluster).num_completed == 1 and len(cluster.coord.table) == 0


def test_replica_loss_resumes_streams_without_duplicates(cluster):
    a, b = cluster.replica("a"), cluster.replica("b")
    c = cluster.client()
    for i in range(6):
        submit(c, f"q{i}", prompt=f"prompt {i}", max_tokens=6)
    a.wait_for_requests(3)
    b.wait_for_requests(3)
    a.step(2)
    b.step(2)
    time.sleep(0.1)
    a.close()  # vanishes like kill -9: no goodbye
    b.wait_for_requests(6)
    resumed = [st["dispatch"] for rid, st in b.requests.items() if rid.endswith(".2")]
    assert len(resumed) == 3 and all(len(d.resume_token_ids) == 2 for d in resumed)
    while b.requests:
        b.step(1)
    got = c.deltas(6)
    for i in range(6):
        tokens = [t for d in got[f"q{i}"] for t in d.token_ids]
        assert tokens == fake_tokens(f"prompt {i}", 6), f"q{i}"
        assert sum(d.finish_reason is not None for d in got[f"q{i}"]) == 1
    assert stats(cluster).num_reroutes == 3 and stats(cluster).num_resumed == 3
    assert stats(cluster).num_replica_deaths == 1 and stats(cluster).num_replica_departures == 0


def test_silent_replica_is_declared_dead_and_its_late_deltas_ignored(cluster):
    a, b = cluster.replica("a"), cluster.replica("b")
    c = cluster.client()
    submit(c, "x", max_tokens=3)
    submit(c, "y", max_tokens=3)
    a.wait_for_requests(1)
    b.wait_for_requests(1)
    deadline = time.monotonic() + 3
    while len(cluster.coord.registry) == 2 and time.monotonic() < deadline:
        b.heartbeat()  # only b stays alive
        b.pump(0.05)
    assert len(cluster.coord.registry) == 1
    b.wait_for_requests(2)
    a.step(3)  # a wakes up and talks: too late
    a.pump(0.3)
    assert any(m.KIND.name == "REREGISTER" for m in a.other)
    while b.requests:
        b.step(1)
    got = c.deltas(2)
    for rid in ("x", "y"):
        assert [t for d in got[rid] for t in d.token_ids] == fake_tokens("hello", 3)
    assert wait_until(lambda: stats(cluster).num_stale_deltas >= 1)


def test_cancel_aborts_on_the_replica_and_ends_once(cluster):
    r = cluster.replica()
    c = cluster.client()
    submit(c, "k", max_tokens=10)
    r.wait_for_requests(1)
    attempt = next(iter(r.requests))
    r.step(1)
    # The token must reach the client before the cancel is sent: the coordinator reads the two
    # sockets in no fixed order, and a token handled after the cancel would be a second stale delta.
    first: dict = {}
    while "k" not in first:
        msg = c.recv(5.0)
        assert msg is not None, "the first token never reached the client"
        if msg.KIND.name == "DELTA":
            first = {d.request_id: [d] for d in msg.deltas}
    c.send(CancelRequest(request_id="k"))
    assert wait_until(lambda: (r.pump(0.02), attempt in r.aborted)[1])
    # the replica's own abort final (and a straggling token) arrive after the cancel: ignored
    r.send(StepOutput(deltas=[DeltaPayload(request_id=attempt, token_ids=[5], finish_reason="abort")]))
    got = c.deltas(1)
    assert [d.finish_reason for d in got["k"]][-1] == "abort"
    assert sum(d.finish_reason is not None for d in got["k"]) == 1
    assert c.recv(0.3) is None
    assert wait_until(lambda: stats(cluster).num_stale_deltas == 1)


def test_vanished_client_requests_are_aborted(cluster):
    r = cluster.replica()
    c = cluster.client()
    for i in range(3):
        submit(c, f"z{i}", max_tokens=50)
    r.wait_for_requests(3)
    c.close()  # no GOODBYE, no more pings
    t0 = time.monotonic()
    deadline = t0 + 5
    while len(r.aborted) < 3 and time.monotonic() < deadline:
        r.heartbeat()
        r.pump(0.1)
    assert len(r.aborted) == 3, "client's requests were not aborted"
    assert time.monotonic() - t0 < 5
    assert stats(cluster).num_client_gone_aborts == 3 and len(cluster.coord.table) == 0


def test_admission_limit_replies_overloaded():
    with CoordinatorThread(max_requests=2) as ct:
        r = FakeReplica(ct.back)
        c = RawClient(ct.front)
        for rid in ("a", "b", "c"):
            submit(c, rid)
        got = c.deltas(1)
        assert got["c"][-1].error.code == "overloaded"
        assert "--max-requests" in got["c"][-1].error.message
        assert ct.coord.dispatcher.stats.num_overloaded == 1
        r.close()
        c.close()


def test_deadline_times_out_and_frees_the_replica(cluster):
    r = cluster.replica()
    c = cluster.client()
    c.send(SubmitRequest(request_id="slow", prompt="x", sampling_params={"max_tokens": 50},
                         timeout=0.3))
    r.wait_for_requests(1)
    attempt = next(iter(r.requests))
    r.step(1)
    got = c.deltas(1, timeout=3)
    final = got["slow"][-1]
    assert final.finish_reason == "timeout" and final.error.code == "timeout"
    assert wait_until(lambda: (r.pump(0.02), attempt in r.aborted)[1])
    assert stats(cluster).num_timeouts == 1


def test_no_replica_fails_with_a_clear_error(cluster):
    c = cluster.client()
    submit(c, "lonely")
    got = c.deltas(1, timeout=4)
    err = got["lonely"][-1].error
    assert err.code == "no_replica" and "no replica is registered" in err.message


def test_pending_request_is_served_when_a_replica_registers(cluster):
    c = cluster.client()
    submit(c, "early", max_tokens=2)
    time.sleep(0.2)
    r = cluster.replica()
    r.wait_for_requests(1)
    r.step(2)
    assert c.deltas(1)["early"][-1].finish_reason == "length"


def test_bad_input_gets_error_replies_and_service_continues(cluster):
    r = cluster.replica()
    bad = cluster.client()
    cases = [
        [b"", b"\x92\x01\x02"],                                  # msgpack array, not a map
        [b"", b"\xde\xad\xbe\xef"],                              # random bytes
        [b"", codec.encode(SubmitRequest(request_id="t", prompt="x"))[:-3]],  # truncated
        [b"", msgpack.packb({"v": 99, "k": 100, "request_id": "v", "prompt": "x"})],
        [b"", msgpack.packb({"v": 1, "k": 4242})],                # unknown kind
        [b"", b"\x80" + b"x" * (cluster.coord.config.max_frame_bytes + 10)],  # over the cap
        [codec.encode(ClientHello())],                           # no empty delimiter
    ]
    for frames in cases:
        bad.send_raw(*frames)
    replies = [bad.recv(2.0) for _ in cases]
    assert all(m is not None and m.KIND.name == "ERROR" and m.code == "protocol" for m in replies), replies
    text = " | ".join(m.message for m in replies)
    for needle in ("must be a msgpack map", "not valid msgpack", "protocol version 99",
                   "unknown message kind 4242", "over the cap", "empty delimiter"):
        assert needle in text
    assert [m.request_id for m in replies][3] == "v"
    submit(bad, "sp", temperature=-1)
    submit(bad, "empty", prompt="")
    got = bad.deltas(2)
    assert got["sp"][-1].error.code == "invalid_request" and "temperature" in got["sp"][-1].error.message
    assert got["empty"][-1].error.message == "the prompt is empty"
    good = cluster.client()
    submit(good, "fine", max_tokens=2)
    r.wait_for_requests(1)
    r.step(2)
    assert good.deltas(1)["fine"][-1].finish_reason == "length"
    assert stats(cluster).num_bad_frames == len(cases)


def test_duplicate_request_id_is_refused_without_ending_the_first(cluster):
    r = cluster.replica()
    c = cluster.client()
    submit(c, "dup", max_tokens=2)
    r.wait_for_requests(1)
    submit(c, "dup", max_tokens=2)
    msg = c.recv()
    assert msg.KIND.name == "ERROR" and msg.request_id == "dup" and "already in flight" in msg.message
    r.step(2)
    assert c.deltas(1)["dup"][-1].finish_reason == "length"


def test_chat_tools_reach_the_replica_and_follow_a_re_route(cluster):
    from infer_cluster.protocol.chat import messages_from_openai, tools_from_openai
    messages = messages_from_openai([
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "w", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sun"}])
    tools = tools_from_openai([{"type": "function", "function": {"name": "w", "description": "d"}}])
    a = cluster.replica("a")
    c = cluster.client()
    c.send(SubmitRequest(request_id="chat", messages=messages, tools=tools,
                         sampling_params={"max_tokens": 4}))
    a.wait_for_requests(1)
    (first,) = [st["dispatch"] for st in a.requests.values()]
    b = cluster.replica("b")  # registered (HELLO_ACK) when this returns
    a.close()  # vanishes: the request goes to b
    b.wait_for_requests(1, timeout=10.0)
    (second,) = [st["dispatch"] for st in b.requests.values()]
    for d in (first, second):
        assert d.messages == messages and d.tools == tools and d.prompt is None
    assert second.request_id != first.request_id and stats(cluster).num_reroutes == 1
