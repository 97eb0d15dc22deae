"""The `infer-cluster` CLI as a user runs it: `serve` until SIGTERM, and the client commands
against it; offline `generate` (the README quick start) without a cluster."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time

import pytest

from .conftest import REPO, child_env, free_port

pytestmark = pytest.mark.timeout(240)


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "infer_cluster", "--log-level", "WARNING", *args],
                          cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=timeout)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead for our purposes
        return f.read().split()[2] != "Z"


def test_serve_status_generate_bench_then_sigterm_stops_everything(tmp_path):
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "infer_cluster", "serve", "--port", str(port), "--replica-port",
         str(free_port()), "--model", "tiny-random", "--num-kv-blocks", "1024", "--kv-offload-gib", "0.01", "--log-dir", str(tmp_path)],
        cwd=REPO, env=child_env(2), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids = []
    try:
        deadline = time.monotonic() + 120
        line = ""
        while time.monotonic() < deadline and proc.poll() is None:
            if select.select([proc.stdout], [], [], 1.0)[0]:
                line = proc.stdout.readline()
                break
        assert "serving tiny-random on " + address in line, (line, proc.stderr.read() if proc.poll() is not None else "")

        st = cli("status", "--address", address, "--json")
        assert st.returncode == 0, st.stderr
        status = json.loads(st.stdout)
        assert status["coordinator"]["num_replicas"] == 1
        pids = [r["pid"] for r in status["replicas"]]
        table = cli("status", "--address", address).stdout
        assert "replica-0" in table and "active" in table and "KV USED" in table
        assert "0 failed, 0 refused by a replica (invalid, or too large)" in table

        gen = cli("generate", "--address", address, "--max-tokens", "8", "Hello")
        assert gen.returncode == 0 and gen.stdout.strip(), gen.stderr
        two = cli("generate", "--address", address, "--max-tokens", "4", "a", "b")
        assert two.returncode == 0 and "[0] 'a'" in two.stdout and "[1] 'b'" in two.stdout

        bad = cli("generate", "--address", address, "--temperature", "-1", "x")
        assert bad.returncode != 0 and bad.stderr.strip().startswith("error: temperature")
        assert len(bad.stderr.strip().splitlines()) == 1

        out = tmp_path / "bench.json"
        b = cli("bench", "--address", address, "-n", "20", "--output-len", "8",
                "--concurrency", "8", "--json", str(out))
        assert b.returncode == 0, b.stderr
        summary = json.loads(out.read_text())
        assert summary["num_completed"] == 20 and summary["ttft_p50_ms"] > 0
        assert "tpot_p99_ms" in b.stdout
        # replica-side timing from each output's metrics: within the client-side TTFT
        assert 0 <= summary["queue_p50_ms"] and 0 < summary["prefill_p50_ms"]
        # each is a part of that request's TTFT, so its p99 cannot exceed TTFT's (1 ms: clocks)
        assert max(summary["queue_p99_ms"], summary["prefill_p99_ms"]) <= summary["ttft_p99_ms"] + 1
        assert "prefill_p99_ms" in b.stdout

        # the host KV tier (0.01 GiB of 16 KiB tiny-random blocks) shows in the status
        (row,) = json.loads(cli("status", "--address", address, "--json").stdout)["replicas"]
        assert row["num_host_blocks"] == 655 and row["num_host_used_blocks"] >= 0
        table = cli("status", "--address", address).stdout
        assert "HOST KV" in table and "/655 blk" in table

        ctl = cli("control", "drain", "--replica", "replica-0", "--address", address)
        assert ctl.returncode == 0 and "replica-0" in ctl.stdout
        ctl = cli("control", "resume", "--address", address)
        assert ctl.returncode == 0

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        deadline = time.monotonic() + 10
        while any(_pid_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_pid_alive(p) for p in pids), "serve left a replica running"
        assert "stopped" in proc.stderr.read()
        # A clean stop warns about nothing: the coordinator goes first (it drains), so the
        # replica's closing notes find it gone, which its log states without a warning.
        replica_log = (tmp_path / "replica-0.log").read_text()
        assert "stopped: drained" in replica_log
        assert " WARNING " not in replica_log and " ERROR " not in replica_log, replica_log[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for pid in pids:
            if _pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_status_without_a_coordinator_is_a_one_line_error():
    r = cli("status", "--address", f"tcp://127.0.0.1:{free_port()}", "--timeout", "0.5")
    assert r.returncode != 0
    assert r.stderr.strip().startswith("error: no reply from the coordinator")


def test_offline_generate_quick_start():
    """The README's first command, as typed: the default model is the packaged SmolLM2."""
    r = cli("generate", "--max-tokens", "24", "--chat", "What is the capital of France?", timeout=180)
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout, r.stdout
