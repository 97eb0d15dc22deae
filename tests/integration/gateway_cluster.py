"""A real `python -m infer_cluster serve --http-port` for the gateway tests.

Owns: `GatewayCluster` (start `serve` with coordinator, one replica (tiny-random unless
`--model` is among the extra arguments) and the HTTP gateway on free ports; wait for /health; status through an `InferenceClient`; always stopped)
for the session fixture `gateway_cluster` (conftest.py) shared by tests/integration/test_gateway*.py
(one cluster for all of them keeps the suite fast).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

from infer_cluster.client import InferenceClient

from .conftest import REPO, child_env, free_port, stop_process

MAX_REQUESTS = 24  # the coordinator's admission limit; test_gateway_errors overloads it


class GatewayCluster:
    def __init__(self, log_dir: Path, extra_args=(), auth=None):
        self.log_dir = Path(log_dir)
        self.port, self.replica_port = free_port(), free_port()
        self.http_port, self.metrics_port = free_port(), free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.url = f"http://127.0.0.1:{self.http_port}"
        self.auth = auth  # key folder when the cluster runs with --auth
        self.extra_args = list(extra_args) + (["--auth", str(auth)] if auth else [])
        self.proc = None

    def start(self, timeout: float = 180.0) -> "GatewayCluster":
        log = open(self.log_dir / "serve.log", "ab", buffering=0)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "infer_cluster", "serve", "--port", str(self.port),
             "--replica-port", str(self.replica_port), "--http-port", str(self.http_port),
             "--metrics-port", str(self.metrics_port), "--max-requests", str(MAX_REQUESTS),
             "--heartbeat-interval", "0.2", "--client-timeout", "3", "--no-replica-timeout", "5",
             "--drain-timeout", "2", "--num-kv-blocks", "1024", "--max-num-seqs", "64",
             "--no-restart", *self.model_args(), *self.extra_args],
            cwd=REPO, env=child_env(2), stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"the gateway was not healthy after {timeout} s:\n{self.log()[-3000:]}")

    def model_args(self) -> list[str]:
        """tiny-random unless the test names a model (`serve` itself defaults to SmolLM2)."""
        return [] if "--model" in self.extra_args else ["--model", "tiny-random"]

    def log(self) -> str:
        return (self.log_dir / "serve.log").read_text(errors="replace")

    def status(self) -> dict:
        with InferenceClient(self.address, name="test-status", auth=self.auth) as c:
            return c.status(timeout=5.0)

    def wait_idle(self, timeout: float = 5.0) -> dict:
        """Until the coordinator tracks no request and the replica runs none."""
        deadline = time.monotonic() + timeout
        st = None
        while time.monotonic() < deadline:
            st = self.status()
            live = [r for r in st["replicas"] if r["state"] != "dead"]
            if st["coordinator"]["num_in_flight"] == 0 and all(
                    r["num_running"] == 0 and r["num_waiting"] == 0 for r in live):
                return st
            time.sleep(0.1)
        raise AssertionError(f"cluster not idle after {timeout} s: {st}")

    def stop(self) -> None:
        """SIGTERM to `serve`; it must take the gateway down with the rest."""
        stop_process(self.proc, grace=30.0)
        try:
            httpx.get(f"{self.url}/health", timeout=2.0)
        except httpx.TransportError:
            return
        raise RuntimeError(f"the gateway at {self.url} still answers after serve stopped")

