"""InferenceClient / AsyncInferenceClient against an in-process coordinator and fake replicas."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
import threading
import time

import pytest

from infer_cluster.client import AsyncInferenceClient, InferenceClient
from infer_cluster.protocol import (InvalidRequestError, NoReplicaError, OverloadedError, RequestStatus,
                      SamplingParams)

from .test_coordinator_helpers import AutoReplica, CoordinatorThread, FakeReplica, fake_tokens

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def served():
    ct = CoordinatorThread()
    reps = [AutoReplica(ct.back, "a"), AutoReplica(ct.back, "b")]
    c = InferenceClient(ct.front, heartbeat_interval=0.2)
    yield ct, c
    c.close()
    for r in reps:
        r.close()
    ct.stop()


def test_result_stream_and_status(served):
    _, c = served
    h = c.submit("abc", SamplingParams(max_tokens=5))
    deltas = list(h.stream(timeout=5))
    assert deltas[-1].finish_reason == "length"
    assert [t for d in deltas for t in d.token_ids] == fake_tokens("abc", 5)
    out = h.result(timeout=5)
    assert out.token_ids == fake_tokens("abc", 5) and out.prompt == "abc"
    assert out.text == "".join(d.text for d in deltas)
    assert h.done() and h.status is RequestStatus.FINISHED and not h.cancel()


def test_token_prompts_and_dict_params(served):
    _, c = served
    out = c.submit([5, 6, 7], {"max_tokens": 3}).result(5)
    assert out.token_ids == fake_tokens("5,6,7", 3)
    assert out.prompt_token_ids == [5, 6, 7]


def test_generate_keeps_input_order(served):
    _, c = served
    prompts = [f"p{i}" for i in range(20)]
    outs = c.generate(prompts, SamplingParams(max_tokens=3))
    assert [o.token_ids for o in outs] == [fake_tokens(p, 3) for p in prompts]


def test_many_threads_submit_at_once(served):
    _, c = served
    results, errors = {}, []

    def worker(t):
        try:
            hs = [(f"t{t}-{i}", c.submit(f"t{t}-{i}", SamplingParams(max_tokens=4))) for i in range(25)]
            for p, h in hs:
                results[p] = h.result(20).token_ids
        except Exception as exc:  # surfaced below
            errors.append(exc)
    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    assert not errors
    assert len(results) == 200
    assert all(v == fake_tokens(p, 4) for p, v in results.items())
    assert c.num_in_flight == 0


def test_cancel_ends_with_abort(served):
    _, c = served
    h = c.submit("long", SamplingParams(max_tokens=100000))
    next(h.stream(timeout=5))  # it is running
    assert h.cancel()
    out = h.result(timeout=5)
    assert out.finish_reason == "abort" and h.status is RequestStatus.ABORTED


def test_result_timeout_and_typed_errors():
    with CoordinatorThread(max_requests=1) as ct:
        r = FakeReplica(ct.back)  # never steps
        with InferenceClient(ct.front) as c:
            first = c.submit("a")
            with pytest.raises(TimeoutError, match="has not finished after 0.2 s"):
                first.result(timeout=0.2)
            second = c.submit("b")
            with pytest.raises(OverloadedError, match="--max-requests") as info:
                second.result(timeout=5)
            assert info.value.output.finish_reason == "error"
            assert second.status is RequestStatus.FAILED
            outs = c.generate(["c"])  # batch form returns errors as outputs
            assert outs[0].error["code"] == "overloaded"
        r.close()


def test_bad_arguments_raise_before_sending(served):
    _, c = served
    with pytest.raises(InvalidRequestError, match="empty"):
        c.submit("")
    for ids in ([1, -2], [1, 2**40], [1, True], [1.0]):
        with pytest.raises(InvalidRequestError, match="list of integers in 0.."):
            c.submit(ids)
    with pytest.raises(InvalidRequestError, match="temperature"):
        c.submit("x", {"temperature": -1})
    with pytest.raises(InvalidRequestError, match="unknown sampling parameter"):
        c.submit("x", {"temprature": 0})
    with pytest.raises(InvalidRequestError, match="timeout"):
        c.submit("x", timeout=0)
    with pytest.raises(InvalidRequestError, match="cannot be encoded"):
        c.submit("x", priority=2**70)  # past msgpack's 64 bits
    with pytest.raises(InvalidRequestError, match="stop_token_ids"):
        c.submit("x", {"stop_token_ids": [2**70]})
    h = c.submit("x", SamplingParams(max_tokens=100000), request_id="same")
    with pytest.raises(InvalidRequestError, match="already in flight"):
        c.submit("y", request_id="same")
    h.cancel()
    h.result(5)


def test_close_aborts_what_is_running():
    with CoordinatorThread() as ct:
        r = FakeReplica(ct.back)
        c = InferenceClient(ct.front)
        h = c.submit("x", SamplingParams(max_tokens=1000))
        r.wait_for_requests(1)
        attempt = next(iter(r.requests))
        c.close()
        assert h.result(1).finish_reason == "abort"
        deadline = time.monotonic() + 3
        while attempt not in r.aborted and time.monotonic() < deadline:
            r.pump(0.05)
        assert attempt in r.aborted  # GOODBYE made the coordinator free it at once
        with pytest.raises(RuntimeError, match="closed"):
            c.submit("y")
        r.close()


def test_silent_coordinator_fails_requests_instead_of_hanging():
    # nothing listens on this address
    with InferenceClient("tcp://127.0.0.1:9", heartbeat_interval=0.1, coordinator_timeout=0.5) as c:
        h = c.submit("x")
        with pytest.raises(NoReplicaError, match="lost contact with the coordinator"):
            h.result(timeout=5)


def test_status_and_control(served):
    ct, c = served
    st = c.status()
    assert st["coordinator"]["num_replicas"] == 2
    assert sorted(r["name"] for r in st["replicas"]) == ["a", "b"]
    reply = c.control("drain", "a")
    assert reply["ok"] and reply["replicas"] == ["a"]


@pytest.mark.parametrize("on_loop", [False, True])
def test_async_client(served, on_loop):
    ct, _ = served

    async def main():
        async with AsyncInferenceClient(ct.front, on_loop=on_loop) as ac:
            h = ac.submit("async", SamplingParams(max_tokens=4))
            toks = [t async for d in h.stream() for t in d.token_ids]
            out = await h.result(timeout=5)
            assert toks == out.token_ids == fake_tokens("async", 4)
            outs = await ac.generate(["x", "y"], SamplingParams(max_tokens=2))
            assert [o.token_ids for o in outs] == [fake_tokens("x", 2), fake_tokens("y", 2)]
            h2 = ac.submit("c", SamplingParams(max_tokens=100000))
            async for _ in h2.stream():
                break
            h2.cancel()
            assert (await h2.result(5)).finish_reason == "abort"
            assert (await ac.status())["coordinator"]["num_replicas"] == 2
    asyncio.run(main())


def test_async_client_on_loop_has_no_io_thread_and_fails_fast_when_unreachable(served):
    """`on_loop=True` (the gateway's client): the socket work runs on the loop, no IO thread;
    heartbeats, connect checks and close (from the loop or another thread) work there too."""
    from infer_cluster.protocol import UnreachableError
    ct, _ = served
    before = {t.name for t in threading.enumerate()}

    async def main():
        ac = AsyncInferenceClient(ct.front, on_loop=True, heartbeat_interval=0.05,
                                  coordinator_timeout=2.0)
        assert not any(t.name.startswith("infer-cluster-client-io") and t.name not in before
                       for t in threading.enumerate())
        await asyncio.sleep(0.3)  # several heartbeats on the loop; the connection stays up
        outs = await ac.generate(["x", "y"], SamplingParams(max_tokens=3))
        assert [o.token_ids for o in outs] == [fake_tokens("x", 3), fake_tokens("y", 3)]
        await ac.aclose()  # from an executor thread: the loop closes the sockets
        ac.close()  # idempotent

        gone = AsyncInferenceClient(f"tcp://127.0.0.1:{_port_outside_ephemeral_range()}",
                                    on_loop=True, connect_timeout=0.5)
        started = time.monotonic()
        with pytest.raises(UnreachableError, match="no answer"):
            await gone.submit("x", SamplingParams(max_tokens=2)).result(timeout=5)
        assert time.monotonic() - started < 2.0
        gone.close()  # on the loop's own thread
    asyncio.run(main())
    with pytest.raises(RuntimeError, match="must be created on the event loop"):
        AsyncInferenceClient(ct.front, on_loop=True)


def test_client_coordinator_and_protocol_never_import_torch():
    code = ("import sys, infer_cluster.cli, infer_cluster.coordinator.server, infer_cluster.client, "
            "infer_cluster.protocol.codec, infer_cluster.gateway.app, infer_cluster.gateway.server, "
            "infer_cluster.cli_gateway; "
            "from infer_cluster import InferenceClient, SamplingParams; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _port_outside_ephemeral_range() -> int:
    """A free port the kernel never hands out as a source port: a client reconnecting to a
    closed ephemeral port can connect to itself and hold the port (TCP self-connect)."""
    import random
    import socket
    lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    for _ in range(100):
        port = random.randint(max(1024, lo - 12000), lo - 1)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port below the ephemeral range")


def test_coordinator_restart_fails_in_flight_requests():
    port = _port_outside_ephemeral_range()
    ct = CoordinatorThread(port=port)
    r = FakeReplica(ct.back)
    c = InferenceClient(ct.front, heartbeat_interval=0.1)
    try:
        h = c.submit("x", SamplingParams(max_tokens=1000))
        r.wait_for_requests(1)
        coord = ct.coord

        def crash():  # vanish like kill -9: no final replies
            coord.back.disable_monitor()
            for sock in (coord._monitor, coord.front, coord.back):
                sock.close(linger=0)
        coord._finish_shutdown = crash
        ct.stop()
        r.close()
        ct = None
        deadline = time.monotonic() + 5
        while ct is None:  # same address, fresh state (the old listener closes asynchronously)
            try:
                ct = CoordinatorThread(port=port)
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        with pytest.raises(NoReplicaError, match="restarted"):
            h.result(timeout=5)
    finally:
        c.close()
        if ct is not None:
            ct.stop()


@pytest.mark.parametrize("on_loop", [False, True])
def test_client_working_through_a_backlog_keeps_its_heartbeat(on_loop):
    """A replica sends 200 steps at once, then 100 more over 1.5 s, while the client takes 10 ms
    a step to deliver them: two seconds of backlog against a one-second client timeout, with
    the requests still running at the coordinator. Through the IO thread and on an event loop
    (the gateway's client) the client keeps pinging from inside its drain, so the coordinator
    does not end its requests as silent (it did: a loaded CI host lost a link-cut test so)."""
    ct = CoordinatorThread(client_timeout=1.0, replica_timeout=5.0)
    rep = FakeReplica(ct.back, "flood")
    n, burst, paced = 4, 200, 100
    steps = burst + paced

    def slow(client):
        deliver = client._deliver

        def wrapped(payload):
            time.sleep(0.0025)
            deliver(payload)
        client._deliver = wrapped

    def flood():
        rep.wait_for_requests(n)
        for _ in range(burst):
            rep.step(1)
        for _ in range(paced):
            time.sleep(0.015)
            rep.step(1)
            rep.heartbeat(num_running=len(rep.requests), num_free_blocks=100, num_total_blocks=100)

    async def on_the_loop():
        ac = AsyncInferenceClient(ct.front, on_loop=True, heartbeat_interval=0.2)
        slow(ac._client)
        handles = [ac.submit(f"p{i}", SamplingParams(max_tokens=steps)) for i in range(n)]
        feeder = threading.Thread(target=flood, daemon=True)
        feeder.start()
        try:
            return [await h.result(timeout=30) for h in handles]
        finally:
            feeder.join(10)
            await ac.aclose()

    try:
        if on_loop:
            outs = asyncio.run(on_the_loop())
        else:
            with InferenceClient(ct.front, heartbeat_interval=0.2) as c:
                slow(c)
                handles = [c.submit(f"p{i}", SamplingParams(max_tokens=steps)) for i in range(n)]
                flood()
                outs = [h.result(timeout=30) for h in handles]
        assert [len(o.token_ids) for o in outs] == [steps] * n
        assert all(o.finish_reason == "length" for o in outs)
    finally:
        rep.close()
        ct.stop()
