"""Resizing a replica's KV pool while it serves, end to end with real processes: a coordinator
and one replica on loopback, requests streaming through `InferenceClient`, `control resize`
through the coordinator (shrink, then grow). Every request ends exactly once with its full
greedy output (equal to the offline engine's), later requests run on the new pool, and the new
size shows in `status`; bad resizes are refused with a reason and change nothing. Also: every
output carries the replica's timing (`RequestMetrics`)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from infer_cluster.client import InferenceClient
from infer_cluster.protocol import SamplingParams

from .conftest import REPO, ClusterProcs, child_env

pytestmark = pytest.mark.timeout(300)

# max_model_len 256, 16-token blocks: the smallest legal pool is 16 blocks.
REPLICA_ARGS = ["--num-kv-blocks", "64", "--max-model-len", "256", "--max-num-seqs", "16",
                "--max-num-batched-tokens", "128"]
REPLICA = "replica-0"


def _items(n, seed, max_tokens=40):
    out = []
    for i in range(n):
        prompt = [(13 * i + 7 * j + seed) % 450 + 20 for j in range(24 + (i * 5) % 30)]
        out.append((prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens + i % 9, ignore_eos=True)))
    return out


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    procs = ClusterProcs(tmp_path_factory.mktemp("resize-cluster"), num_replicas=1,
                         replica_args=REPLICA_ARGS)
    try:
        procs.start()
        yield procs
    finally:
        procs.stop()


def _replica_row(cluster):
    (row,) = [r for r in cluster.status()["replicas"] if r["name"] == REPLICA]
    return row


def _wait_tokens(handles, num_with_tokens, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sum(1 for h in handles if h.output.token_ids) >= num_with_tokens:
            return
        time.sleep(0.01)
    raise AssertionError("requests did not start streaming")


def test_shrink_then_grow_while_streaming(cluster, offline_reference):
    # outputs long enough that no request can end before the shrink lands (a busy machine
    # slows the client as much as the replica): 16 blocks then hold one or two of them
    items = _items(12, seed=0, max_tokens=120)
    want = [ids for ids, _ in offline_reference(items)]
    before = cluster.status()["coordinator"]
    with InferenceClient(cluster.address, name="resize-test") as c:
        handles = [c.submit(p, sp) for p, sp in items]
        _wait_tokens(handles, 3)
        assert not all(h.done() for h in handles)
        shrink = c.resize(REPLICA, num_kv_blocks=16, timeout=60)
        assert shrink["ok"], shrink
        assert shrink["capacity"]["num_total_blocks"] == 16 and shrink["replicas"] == [REPLICA]
        assert _replica_row(cluster)["num_total_blocks"] == 16
        time.sleep(0.2)  # a few steps on the small pool (preempting, recomputing)
        grow = c.resize(REPLICA, num_kv_blocks=128, timeout=60)
        assert grow["ok"] and grow["capacity"]["num_total_blocks"] == 128, grow
        outs = [h.result(timeout=120) for h in handles]
    assert [o.token_ids for o in outs] == want
    assert all(o.finish_reason == "length" for o in outs)
    for o in outs:  # the replica's timing rides on every final
        m = o.metrics
        assert m is not None and m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finish_time
    row = _replica_row(cluster)
    assert row["num_preemptions"] > 0, row  # the shrink really pushed requests back
    after = cluster.status()["coordinator"]
    # exactly one final each: completed, never failed, aborted or re-routed
    assert after["num_completed"] - before["num_completed"] == len(items)
    for key in ("num_failed", "num_reroutes", "num_aborted"):
        assert after.get(key, 0) == before.get(key, 0), key

    # the next requests run on the new pool: more than 64 blocks in use at once. Together they
    # need about 190 blocks, so the pool of 128 stays full for many steps and the status polls
    # below cannot miss the peak.
    more = _items(16, seed=3, max_tokens=150)
    with InferenceClient(cluster.address, name="resize-test-2") as c:
        handles = [c.submit(p, sp) for p, sp in more]
        peak = 0
        while not all(h.done() for h in handles):
            r = _replica_row(cluster)
            peak = max(peak, r["num_total_blocks"] - r["num_free_blocks"])
            time.sleep(0.05)
        outs = [h.result(timeout=60) for h in handles]
    assert [o.token_ids for o in outs] == [ids for ids, _ in offline_reference(more)]
    st = cluster.wait_idle()
    (row,) = st["replicas"]
    assert row["num_total_blocks"] == row["num_free_blocks"] == 128
    assert peak > 64, peak


def test_bad_resizes_are_refused_and_change_nothing(cluster):
    with InferenceClient(cluster.address, name="resize-bad") as c:
        size = _replica_row(cluster)["num_total_blocks"]
        unknown = c.resize("no-such-replica", num_kv_blocks=64, timeout=10)
        assert not unknown["ok"] and "no live replica named 'no-such-replica'" in unknown["message"]
        small = c.resize(REPLICA, num_kv_blocks=8, timeout=10)
        assert not small["ok"] and "needs 16 blocks" in small["message"]
        huge = c.resize(REPLICA, num_kv_blocks=1 << 38, timeout=30)  # the replica refuses it
        assert not huge["ok"] and "GiB" in huge["message"] and REPLICA in huge["message"]
        assert huge["capacity"]["num_total_blocks"] == size
        # still serving, same pool
        out = c.generate([[30, 31, 32]], SamplingParams(max_tokens=4, temperature=0.0))[0]
        assert out.finish_reason == "length" and len(out.token_ids) == 4
    assert _replica_row(cluster)["num_total_blocks"] == size


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "infer_cluster", "--log-level", "WARNING", *args],
                          cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=60)


def test_cli_control_resize_and_status(cluster):
    r = _cli("control", "resize", "--replica", REPLICA, "--blocks", "96", "--kv-cache-dtype", "int8",
             "--address", cluster.address)
    assert r.returncode == 0, r.stderr
    assert "KV pool now 96 blocks of 16 tokens (int8)" in r.stdout
    status = _cli("status", "--address", cluster.address)
    assert "of 96 int8" in status.stdout, status.stdout
    r = _cli("control", "resize", "--replica", REPLICA, "--kv-cache-dtype", "auto",
             "--address", cluster.address)
    assert r.returncode == 0 and "(auto)" in r.stdout, r.stderr
    r = _cli("control", "resize", "--blocks", "64", "--address", cluster.address)
    assert r.returncode != 0 and r.stderr.strip() == "error: resize needs --replica NAME (see `infer-cluster status`)"
    r = _cli("control", "drain", "--blocks", "64", "--address", cluster.address)
    assert r.returncode != 0 and "apply to resize" in r.stderr
