"""Real cluster on loopback: coordinator + 2 EngineServer replicas (tiny-random) as processes.

Covers: 200 concurrent greedy requests equal to the offline engine; kill -9 of a replica under
that load (every request ends exactly once, complete and duplicate-free; re-routes visible in
the coordinator's stats; the restarted replica registers again and takes load); cancel frees KV
blocks; a killed client's requests are aborted within 5 s.
"""

from __future__ import annotations

import collections
import signal
import subprocess
import sys
import time

import pytest

from infer_cluster.client import InferenceClient
from infer_cluster.protocol import SamplingParams

from .conftest import REPO, PacedLoad, child_env, prompt_set

pytestmark = pytest.mark.timeout(240)


def counting_client(address: str):
    """A client that also counts, per request, every delta and final that reached it."""
    c = InferenceClient(address, name="test")
    finals = collections.Counter()
    tokens = collections.defaultdict(list)
    original = c._deliver

    def deliver(payload):
        tokens[payload.request_id].extend(payload.token_ids)
        if payload.finish_reason is not None:
            finals[payload.request_id] += 1
        original(payload)
    c._deliver = deliver
    return c, finals, tokens


def test_200_concurrent_greedy_requests_match_the_offline_engine(cluster, offline_reference):
    items = prompt_set(200, seed=1)
    expected = offline_reference(items)
    before = [r for r in cluster.status()["replicas"] if r["state"] != "dead"]  # a killed one keeps a row
    c, finals, _ = counting_client(cluster.address)
    try:
        t0 = time.monotonic()
        handles = [c.submit(p, sp, request_id=f"par-{i}") for i, (p, sp) in enumerate(items)]
        outs = [h.result(timeout=180) for h in handles]
        elapsed = time.monotonic() - t0
    finally:
        c.close()
    mismatches = [i for i, (o, (toks, text)) in enumerate(zip(outs, expected))
                  if o.token_ids != toks or o.text != text]
    assert not mismatches, f"{len(mismatches)} outputs differ from offline, first: {mismatches[:5]}"
    assert all(o.finish_reason in ("stop", "length") for o in outs)
    assert all(o.prompt_token_ids for o in outs)
    assert set(finals.values()) == {1} and len(finals) == 200
    assert "async scheduling: on" in cluster.replica_log(1)
    assert "async scheduling: off" in cluster.replica_log(0)
    after = {r["name"]: r for r in cluster.status()["replicas"] if r["state"] != "dead"}
    spread = {r["name"]: after[r["name"]]["num_dispatched"] - r["num_dispatched"] for r in before}
    assert all(n >= 50 for n in spread.values()), f"load not spread: {spread}"
    print(f"\n200 requests over 2 replicas in {elapsed:.2f} s; per replica {spread}")


def revive(cluster) -> None:
    """Start again every replica whose process is gone: a test that failed after killing one
    must leave the session's cluster whole for the tests after it."""
    for i, p in enumerate(cluster.replicas):
        if p is None or p.poll() is not None:
            cluster.start_replica(i)


def test_kill_9_under_load_loses_nothing(cluster, offline_reference):
    cluster.wait_replicas(2)
    try:
        kill_9_under_load(cluster, offline_reference)
    finally:
        revive(cluster)


# Tokens a request of the kill -9 load, and its pacing (`PacedLoad`): a quarter at once, the rest
# over KILL_LOAD_PACE_S seconds, so the load outlasts the status polls after its first tenth.
KILL_LOAD_TOKENS = 48
KILL_LOAD_PACE_S = 3.0


def kill_9_under_load(cluster, offline_reference):
    items = [(p, SamplingParams(temperature=0.0, max_tokens=KILL_LOAD_TOKENS, ignore_eos=True))
             for p, _ in prompt_set(200, seed=2)]
    expected = offline_reference(items)
    before = cluster.status()["coordinator"]
    generated = cluster.generated_tokens()
    c, finals, tokens = counting_client(cluster.address)
    total = 200 * KILL_LOAD_TOKENS
    try:
        load = PacedLoad(c, items, "kill-", head=50, pace_s=KILL_LOAD_PACE_S).start()
        cluster.wait_generated(generated, total * 0.1)  # early: the rest must outlast the status polls
        # The victim is a replica mid-stream: on a loaded machine one replica once streamed the
        # quarter alone while the other's requests had not started, and killing that other one
        # resumed nothing (tests/integration/test_structured_failover.py does the same).
        victim, _ = cluster.replica_mid_stream(generated)
        streamed = sum(len(v) for v in tokens.values())
        cluster.kill_replica(victim, signal.SIGKILL)
        t_kill = time.monotonic()
        outs = load.results()
        recovery = time.monotonic() - t_kill
    finally:
        c.close()
    assert streamed < total, "the load finished before the kill; make requests longer"
    assert all(o.finish_reason == "length" for o in outs), collections.Counter(o.finish_reason for o in outs)
    assert len(finals) == 200 and set(finals.values()) == {1}, "a request ended twice or never"
    for i, (o, (toks, text)) in enumerate(zip(outs, expected)):
        assert len(o.token_ids) == KILL_LOAD_TOKENS, f"request {i} incomplete: {len(o.token_ids)} tokens"
        assert tokens[f"kill-{i}"] == o.token_ids  # what crossed the wire, no duplicates
        assert o.token_ids == toks, f"request {i} differs from the offline engine"
        assert o.text == text, f"request {i}: text differs across the resume point"
    after = cluster.status()["coordinator"]
    reroutes = after["num_reroutes"] - before["num_reroutes"]
    resumed = after["num_resumed"] - before["num_resumed"]
    assert reroutes > 0 and resumed > 0 and after["num_replica_deaths"] > before["num_replica_deaths"]
    print(f"\nkill -9 of replica-{victim} after {streamed}/{total} tokens: {reroutes} re-routes "
          f"({resumed} resumed mid-stream), all 200 done {recovery:.2f} s after the kill")

    # The replica comes back, registers again and takes load.
    cluster.start_replica(victim)
    cluster.wait_replicas(2)
    with InferenceClient(cluster.address) as c2:
        outs = c2.generate([f"after restart {i}" for i in range(20)],
                           SamplingParams(temperature=0.0, max_tokens=4))
    assert all(o.finish_reason in ("stop", "length") for o in outs)
    rows = [r for r in cluster.status()["replicas"] if r["name"] == f"replica-{victim}" and r["state"] == "active"]
    assert rows and rows[0]["num_dispatched"] > 0


def test_cancel_frees_the_requests_kv_blocks(cluster):
    cluster.wait_replicas(2)
    cluster.wait_idle()
    long_prompt = list(range(10, 330))  # 320 tokens = 20 blocks of 16
    with InferenceClient(cluster.address) as c:
        h = c.submit(long_prompt, SamplingParams(temperature=0.0, max_tokens=100000, ignore_eos=True))
        next(h.stream(timeout=60))
        deadline = time.monotonic() + 10
        busy = None
        while time.monotonic() < deadline and busy is None:
            rows = cluster.status()["replicas"]
            busy = next((r for r in rows if r["num_running"] == 1), None)
            time.sleep(0.1)
        assert busy is not None
        used = busy["num_total_blocks"] - busy["num_free_blocks"]
        assert used >= 20, f"a 320-token prompt should hold >= 20 blocks, holds {used}"
        t0 = time.monotonic()
        assert h.cancel()
        assert h.result(timeout=10).finish_reason == "abort"
    st = cluster.wait_idle(timeout=5)
    row = next(r for r in st["replicas"] if r["name"] == busy["name"])
    assert row["num_free_blocks"] == row["num_total_blocks"]
    print(f"\ncancel freed {used} KV blocks on {busy['name']} within {time.monotonic() - t0:.2f} s")


CLIENT_SCRIPT = """
import sys, time
from infer_cluster.client import InferenceClient
from infer_cluster.protocol import SamplingParams
c = InferenceClient(sys.argv[1])
hs = [c.submit(list(range(10, 60)), SamplingParams(max_tokens=100000, ignore_eos=True))
      for _ in range(8)]
for h in hs:
    next(h.stream(timeout=60))
print("streaming", flush=True)
time.sleep(600)
"""


def test_killed_client_requests_are_aborted_within_5_s(cluster):
    cluster.wait_replicas(2)
    cluster.wait_idle()
    before = cluster.status()["coordinator"]["num_client_gone_aborts"]
    proc = subprocess.Popen([sys.executable, "-c", CLIENT_SCRIPT, cluster.address], cwd=REPO,
                            env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "streaming", proc.stderr.read()
        st = cluster.status()
        assert st["coordinator"]["num_in_flight"] == 8
        proc.kill()
        proc.wait(10)
        t0 = time.monotonic()
        st = cluster.wait_idle(timeout=8)
        freed_after = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert st["coordinator"]["num_client_gone_aborts"] - before == 8
    assert freed_after < 5.0, f"took {freed_after:.2f} s to abort a dead client's requests"
    print(f"\nkilled client's 8 requests aborted and KV freed {freed_after:.2f} s after kill -9")


def test_deadline_times_out_and_frees_kv(cluster):
    cluster.wait_replicas(2)
    cluster.wait_idle()
    with InferenceClient(cluster.address) as c:
        h = c.submit(list(range(10, 200)), SamplingParams(max_tokens=100000, ignore_eos=True),
                     timeout=1.0)
        out = h.result(timeout=30)
    assert out.finish_reason == "timeout" and out.error["code"] == "timeout"
    assert len(out.token_ids) > 0  # partial output is kept
    cluster.wait_idle(timeout=5)


def test_pause_holds_requests_and_resume_finishes_them(cluster):
    cluster.wait_replicas(2)
    with InferenceClient(cluster.address) as c:
        assert c.control("pause")["ok"]
        h = c.submit("paused prompt", SamplingParams(temperature=0.0, max_tokens=8))
        time.sleep(1.0)
        assert not h.done()
        states = {r["state"] for r in c.status()["replicas"] if r["state"] != "dead"}
        assert states == {"paused"}
        assert c.control("resume")["ok"]
        out = h.result(timeout=30)
    assert out.finish_reason in ("stop", "length")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if {r["state"] for r in cluster.status()["replicas"] if r["state"] != "dead"} == {"active"}:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("replicas did not report active after resume")


def test_logprobs_and_token_prompts_cross_the_cluster(cluster, offline_reference):
    cluster.wait_replicas(2)
    params = SamplingParams(temperature=0.0, max_tokens=5, logprobs=3)
    prompts = ["Hello there", [11, 22, 33, 44, 55], "The capital of France is"]
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        expected = offline_reference.llm.generate(prompts, params, use_tqdm=False)
    finally:
        torch.set_num_threads(threads)
    with InferenceClient(cluster.address) as c:
        outs = c.generate(prompts, params)
    for o, e in zip(outs, expected):
        assert o.token_ids == e.token_ids and o.prompt_token_ids == e.prompt_token_ids
        assert len(o.logprobs) == 5
        for got, want in zip(o.logprobs, e.logprobs):
            assert got[0] == pytest.approx(want[0], abs=1e-5)
            assert set(got[1]) == set(want[1])


HOLDING_CLIENT_SCRIPT = """
import sys, time
from infer_cluster.client import InferenceClient
from infer_cluster.protocol import SamplingParams
c = InferenceClient(sys.argv[1])
hs = [c.submit("held", SamplingParams(max_tokens=8)) for _ in range(5)]
while c.status()["coordinator"]["num_in_flight"] < 5:
    time.sleep(0.05)
print("submitted", flush=True)
time.sleep(600)
"""


def test_killed_client_with_no_traffic_is_noticed_by_silence(cluster):
    """Nothing is streamed to this client (replicas paused), so only its missing pings can
    reveal that it died: the coordinator must still drop its requests within 5 s."""
    cluster.wait_replicas(2)
    cluster.wait_idle()
    with InferenceClient(cluster.address) as admin:
        assert admin.control("pause")["ok"]
        proc = subprocess.Popen([sys.executable, "-c", HOLDING_CLIENT_SCRIPT, cluster.address],
                                cwd=REPO, env=child_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "submitted", proc.stderr.read()
            proc.kill()
            proc.wait(10)
            t0 = time.monotonic()
            while admin.status()["coordinator"]["num_in_flight"] > 0 and time.monotonic() - t0 < 10:
                time.sleep(0.1)
            gone_after = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            admin.control("resume")
    assert gone_after < 5.0, f"took {gone_after:.2f} s"
    print(f"\nsilent killed client's 5 held requests dropped {gone_after:.2f} s after kill -9")
