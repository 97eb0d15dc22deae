"""`bench/dp_scaling.py` end to end on the CPU: it starts the real `infer-cluster serve -dp 1`
and `-dp 2`, sends every round through `InferenceClient`, counts every token, reports a ratio
against the first N, and each serve exits 0 with no process left behind (its process group
is gone). The GPU figure comes from `bench/gpu_suite.sh dp`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .conftest import REPO, child_env

pytestmark = pytest.mark.timeout(240)


def test_dp_scaling_runs_both_sizes_and_stops_them(tmp_path):
    out = tmp_path / "dp.json"
    proc = subprocess.run(
        [sys.executable, "bench/dp_scaling.py", "--dp", "1", "2", "--rounds", "2", "--num-requests", "6",
         "--input-len", "4:12", "--output-len", "5", "--token-id-range", "10:200",
         "--log-dir", str(tmp_path / "logs"), "--out", str(out), "--model", "tiny-random",
         "--num-kv-blocks", "64"],
        cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=220)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [r["dp"] for r in result["runs"]] == [1, 2]
    for run in result["runs"]:
        assert run["serve_exit_code"] == 0
        assert len(run["rounds"]) == 2
        for r in run["rounds"]:
            assert r["num_completed"] == 6 and r["output_tokens"] == 6 * 5, r
        assert run["output_tokens_per_s"] > 0
    assert result["runs"][0]["ratio"] == 1.0
    assert (tmp_path / "logs" / "dp2" / "replica-1.log").exists()  # two replicas really ran
    assert "replicas   requests  output tok/s" in proc.stdout
    for run in result["runs"]:  # serve led its own process group: nothing of it is left
        with pytest.raises(ProcessLookupError):
            os.killpg(run["serve_pid"], 0)


def test_dp_scaling_per_replica_sends_n_times_the_requests(tmp_path):
    """--per-replica: -dp N gets N x --num-requests (the same load per replica)."""
    out = tmp_path / "dp.json"
    proc = subprocess.run(
        [sys.executable, "bench/dp_scaling.py", "--dp", "1", "2", "--rounds", "1", "--num-requests", "3",
         "--per-replica", "--input-len", "4:12", "--output-len", "4", "--token-id-range", "10:200",
         "--log-dir", str(tmp_path / "logs"), "--out", str(out), "--model", "tiny-random",
         "--num-kv-blocks", "64"],
        cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=220)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = json.loads(out.read_text())["runs"]
    assert [(r["dp"], r["num_requests"]) for r in runs] == [(1, 3), (2, 6)]
    assert [r["rounds"][0]["output_tokens"] for r in runs] == [3 * 4, 6 * 4]
    assert all(r["serve_exit_code"] == 0 for r in runs)
