"""`infer-cluster bench --http` against a real `serve --http-port`: the same workload through ZMQ
and through the gateway (keep-alive connections shared by all rounds), every request counted on
both sides, and the comparison the docs quote (HTTP minus ZMQ, the paired HTTP-layer figure)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import REPO, child_env

pytestmark = pytest.mark.timeout(180)


def test_bench_http_runs_both_paths_and_compares(gateway_cluster, tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "infer_cluster", "--log-level", "WARNING", "bench",
         "--address", gateway_cluster.address, "--http", gateway_cluster.url, "-n", "3",
         "--concurrency", "1", "--input-len", "8", "--output-len", "4", "--repeat", "2",
         "--json", str(out)],
        cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(out.read_text())
    for side in ("zmq", "http"):
        s = summary[side]
        assert s["num_requests"] == 6 and s["num_completed"] == 6, (side, s)
        assert s["output_tokens"] == 6 * 4, (side, s)  # ignore_eos: exactly --output-len each
        assert 0 < s["ttft_p50_ms"] <= s["e2e_p50_ms"], (side, s)
    diff = summary["http_minus_zmq"]
    assert set(diff) >= {"ttft_p50_ms_added", "e2e_p50_ms_added", "throughput_change_pct"}
    paired = summary["http_layer_paired"]
    # The gateway's own histograms saw exactly the HTTP rounds' requests, each with a TTFT
    # no larger than what the HTTP client measured around it (mean over the same requests).
    assert 0 < paired["ttft_mean_ms_inside_gateway"] <= paired["ttft_mean_ms_http_client"]
    assert "what the gateway adds" in proc.stdout
    gateway_cluster.wait_idle()


def test_bench_http_refuses_a_workload_past_the_context(gateway_cluster):
    """The gateway answers a prompt plus max_tokens past max_model_len (2048 here) with a 400,
    the ZMQ path cuts it short: the bench says so in one line before it sends anything."""
    proc = subprocess.run(
        [sys.executable, "-m", "infer_cluster", "--log-level", "WARNING", "bench",
         "--address", gateway_cluster.address, "--http", gateway_cluster.url, "-n", "2",
         "--input-len", "2000", "--output-len", "100"],
        cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=150)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[-1] == ("error: the workload's longest request is 2100 tokens (prompt + output), "
                         "past the cluster's max_model_len of 2048; the gateway refuses such "
                         "requests, so lower --input-len / --output-len"), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    gateway_cluster.wait_idle()
