"""Real clusters for integration tests: coordinator and replicas as processes on loopback.

Owns: `ClusterProcs` (start a coordinator + N `python -m infer_cluster.worker` replicas on free ports, wait
until registered, kill / restart a replica, stop everything), `PacedLoad` (a kill test's load,
paced so it outlasts the status polls), the shared session clusters
(2 replicas of tiny-random; `serve` of the real SmolLM2) and the offline reference outputs (the same prompts through
`worker.LLM` in this process). Every process started here is ended in a `finally`, and each
child also gets SIGTERM if this test process dies (parent-death signal).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

import pytest

from infer_cluster.client import InferenceClient
from infer_cluster.launcher import _die_with_parent
from infer_cluster.protocol import SamplingParams
from tests.conftest import free_port  # noqa: F401 (the integration tests import it from here)

REPO = Path(__file__).resolve().parents[2]
# Small but enough KV for 200 short requests without preemption.
REPLICA_ENGINE_ARGS = ["--model", "tiny-random", "--num-kv-blocks", "2048", "--max-num-seqs", "256"]
COORDINATOR_ARGS = ["--heartbeat-interval", "0.2", "--replica-timeout", "2.0",
                    "--client-timeout", "3.0", "--no-replica-timeout", "20"]


def child_env(threads: int = 1) -> dict:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # a parallel test worker's processes keep to its share of the cores (tests/conftest.py
        # sets it): a 2-thread replica beside another busy worker spins in OpenMP barriers
        threads = min(threads, int(os.environ.get("OMP_NUM_THREADS", threads)))
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    env["OMP_NUM_THREADS"] = str(threads)  # 2 CI cores shared by all replicas
    for name in ("INFER_CLUSTER_AUTH", "INFER_CLUSTER_API_KEY", "INFER_CLUSTER_API_KEY_FILE"):
        env.pop(name, None)  # tests that want keys pass --auth / --api-key themselves
    return env


def spawn(argv: list[str], log_path: Path, env: Optional[dict] = None) -> subprocess.Popen:
    log = open(log_path, "ab", buffering=0)
    try:
        return subprocess.Popen(argv, cwd=REPO, env=env or child_env(), stdout=log, stderr=log,
                                stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
    finally:
        log.close()


def stop_process(proc: Optional[subprocess.Popen], grace: float = 10.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
    except ProcessLookupError:
        pass


class ClusterProcs:
    """A coordinator and replicas as processes; `prefix` wraps commands (e.g. `ip netns exec`)."""

    def __init__(self, log_dir: Path, num_replicas: int = 2, host: str = "127.0.0.1",
                 connect_host: Optional[str] = None, coordinator_args=(), replica_args=(),
                 coordinator_prefix=(), replica_prefixes=None, replica_connect_hosts=None,
                 auth: Optional[str] = None, replica_extra_args: Optional[dict] = None):
        self.auth = auth  # key folder the test's own status client uses (None: no auth)
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.port, self.replica_port = free_port(), free_port()
        self.host = host
        self.connect_host = connect_host or host
        self.address = f"tcp://{self.connect_host}:{self.port}"
        self.coordinator_args = [*COORDINATOR_ARGS, *coordinator_args]
        self.replica_args = [*REPLICA_ENGINE_ARGS, *replica_args]
        self.replica_extra_args = replica_extra_args or {}  # replica index -> more flags
        self.coordinator_prefix = list(coordinator_prefix)
        self.replica_prefixes = replica_prefixes or [[] for _ in range(num_replicas)]
        self.replica_connect_hosts = replica_connect_hosts or [self.connect_host] * num_replicas
        self.coordinator: Optional[subprocess.Popen] = None
        self.replicas: list[Optional[subprocess.Popen]] = [None] * num_replicas
        self.num_replicas = num_replicas

    def coordinator_log(self) -> str:
        return (self.log_dir / "coordinator.log").read_text(errors="replace")

    def replica_log(self, i: int) -> str:
        return (self.log_dir / f"replica-{i}.log").read_text(errors="replace")

    def start(self, timeout: float = 180.0) -> "ClusterProcs":
        self.coordinator = spawn(
            [*self.coordinator_prefix, sys.executable, "-m", "infer_cluster", "coordinator",
             "--host", self.host, "--port", str(self.port), "--replica-port",
             str(self.replica_port), *self.coordinator_args], self.log_dir / "coordinator.log")
        for i in range(self.num_replicas):
            self.start_replica(i)
        self.wait_replicas(self.num_replicas, timeout)
        return self

    def start_replica(self, i: int) -> None:
        target = f"tcp://{self.replica_connect_hosts[i]}:{self.replica_port}"
        self.replicas[i] = spawn(
            [*self.replica_prefixes[i], sys.executable, "-m", "infer_cluster.worker", "--coordinator", target,
             "--name", f"replica-{i}", "--heartbeat-interval", "0.2", "--coordinator-timeout", "5",
             *self.replica_args, *self.replica_extra_args.get(i, ())], self.log_dir / f"replica-{i}.log")

    def kill_replica(self, i: int, sig: int = signal.SIGKILL) -> None:
        self.replicas[i].send_signal(sig)
        self.replicas[i].wait(10)

    def status(self, timeout: float = 5.0) -> dict:
        with InferenceClient(self.address, name="test-status", auth=self.auth) as c:
            return c.status(timeout=timeout)

    def generated_tokens(self) -> dict:
        """Each live replica's generated-token count (its last heartbeat's), by name (a dead
        process's row keeps its name beside its successor's)."""
        return {r["name"]: r["num_generated_tokens"] for r in self.status()["replicas"]
                if r["state"] != "dead"}

    def wait_generated(self, generated_before: dict, tokens: float, timeout: float = 60.0) -> None:
        """Until the live replicas report `tokens` generated since `generated_before` (their
        own counts: on a loaded host a client can lag far behind them), or `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            now = self.generated_tokens()
            if sum(n - generated_before.get(name, 0) for name, n in now.items()) >= tokens:
                return
            time.sleep(0.01)

    def replica_mid_stream(self, generated_before: dict, timeout: float = 60.0) -> tuple[int, dict]:
        """The index of a replica to kill so that requests die mid-stream: one that still holds
        requests (the coordinator's own count), is running some and has generated tokens since
        `generated_before` (its heartbeats), the one holding the most. (A fast replica can
        stream much of a load alone while the other's requests have not started: killing that
        one resumes nothing.) Also returns each replica's request count, for messages."""
        deadline = time.monotonic() + timeout
        while True:
            rows = [r for r in self.status()["replicas"] if r["state"] != "dead"]
            busy = [r for r in rows if r["num_requests"] > 0 and r["num_running"] > 0
                    and r["num_generated_tokens"] > generated_before.get(r["name"], 0)]
            counts = {r["name"]: r["num_requests"] for r in rows}
            if busy:
                return int(max(busy, key=lambda r: r["num_requests"])["name"].rsplit("-", 1)[1]), counts
            if time.monotonic() > deadline:
                raise AssertionError(f"no replica is mid-stream: {rows}")
            time.sleep(0.02)

    def wait_replicas(self, n: int, timeout: float = 180.0) -> dict:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            for i, p in enumerate([self.coordinator, *self.replicas]):
                if p is not None and p.poll() is not None:
                    name = "coordinator" if i == 0 else f"replica-{i - 1}"
                    log = self.coordinator_log() if i == 0 else self.replica_log(i - 1)
                    raise RuntimeError(f"{name} exited with {p.returncode}:\n{log[-3000:]}")
            try:
                last = self.status(timeout=2.0)
                if last["coordinator"]["num_replicas"] >= n:
                    return last
            except TimeoutError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"only {last and last['coordinator']['num_replicas']} of {n} replicas "
                           f"registered after {timeout} s")

    def wait_idle(self, timeout: float = 10.0) -> dict:
        """Until nothing is in flight and every replica reports all KV blocks free."""
        deadline = time.monotonic() + timeout
        st = None
        while time.monotonic() < deadline:
            st = self.status()
            live = [r for r in st["replicas"] if r["state"] != "dead"]
            if st["coordinator"]["num_in_flight"] == 0 and all(
                    r["num_running"] == 0 and r["num_waiting"] == 0
                    and r["num_free_blocks"] == r["num_total_blocks"] for r in live):
                return st
            time.sleep(0.2)
        raise AssertionError(f"cluster not idle after {timeout} s: {st}")

    def stop(self) -> None:
        for p in self.replicas:
            stop_process(p)
        stop_process(self.coordinator)


class PacedLoad:
    """A kill test's load, sent from a thread: the first `head` requests at once, the rest over
    `pace_s` seconds. Sent all at once, a load of short requests streamed in well under a
    second on a fast 2-core host, and three kill tests in turn found it over before a status
    poll (heartbeats every 0.2 s) showed a replica mid-stream. Paced, the load lasts `pace_s`
    however fast the host is. `results()` joins the sender and returns each request's output."""

    def __init__(self, client: InferenceClient, items: list, id_prefix: str, head: int, pace_s: float):
        self.client, self.items, self.id_prefix = client, items, id_prefix
        self.head, self.pace_s = head, pace_s
        self.handles: list = [None] * len(items)
        self._sender = threading.Thread(target=self._send, name=f"{id_prefix}load", daemon=True)

    def _send(self) -> None:
        rest = max(1, len(self.items) - self.head)
        for i, (p, sp) in enumerate(self.items):
            self.handles[i] = self.client.submit(p, sp, request_id=f"{self.id_prefix}{i}")
            if i >= self.head:
                time.sleep(self.pace_s / rest)

    def start(self) -> "PacedLoad":
        self._sender.start()
        return self

    def results(self, timeout: float = 180.0) -> list:
        self._sender.join(timeout=self.pace_s + 60)
        assert not self._sender.is_alive(), "the load's sender did not finish"
        return [h.result(timeout=timeout) for h in self.handles]


def prompt_set(n: int = 200, seed: int = 0) -> list[tuple[str, SamplingParams]]:
    """Varied prompts (shared prefixes, different lengths) with greedy params of varied length."""
    import random
    rng = random.Random(seed)
    words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "world",
             "capital", "of", "France", "is", "Paris", "tokens", "cache", "serving", "batch"]
    prefixes = ["System: you are a helpful assistant. ", "Once upon a time, ", "def main():\n", ""]
    out = []
    for i in range(n):
        body = " ".join(rng.choice(words) for _ in range(rng.randint(1, 30)))
        prompt = f"{prefixes[i % len(prefixes)]}{i}: {body}"
        out.append((prompt, SamplingParams(temperature=0.0, max_tokens=rng.randint(4, 16),
                                           ignore_eos=bool(i % 2))))
    return out


@pytest.fixture(scope="session")
def offline_reference():
    """`fn(prompts_and_params) -> token id lists` through the offline engine in this process,
    cached per prompt set (one engine for the whole session)."""
    import torch
    from infer_cluster.worker import LLM
    llm = LLM("tiny-random", num_kv_blocks=2048, max_num_seqs=256)
    cache: dict = {}

    def reference(items):
        key = tuple((p if isinstance(p, str) else tuple(p), sp.max_tokens, sp.ignore_eos)
                    for p, sp in items)
        if key not in cache:
            threads = torch.get_num_threads()
            torch.set_num_threads(1)  # like the replicas (OMP_NUM_THREADS=1); restored for others
            try:
                outs = llm.generate([p for p, _ in items], [sp for _, sp in items], use_tqdm=False)
            finally:
                torch.set_num_threads(threads)
            cache[key] = [(o.token_ids, o.text) for o in outs]
        return cache[key]
    reference.llm = llm  # for tests that need more than tokens and text
    return reference


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    # replica-1 runs async scheduling (auto leaves it off on the CPU), replica-0 the sync loop:
    # every cluster test covers both
    procs = ClusterProcs(tmp_path_factory.mktemp("cluster-logs"), num_replicas=2,
                         replica_extra_args={1: ["--async-scheduling"]})
    try:
        procs.start()
        yield procs
    finally:
        procs.stop()


@pytest.fixture(scope="session")
def real_model_cluster(tmp_path_factory):
    """`serve --model smollm2-135m-instruct` (coordinator, one replica of the packaged real
    model, HTTP gateway), shared by tests/integration/test_real_model.py and
    test_structured_real_model.py; `ready_s` is how long it took to answer /health."""
    from .gateway_cluster import GatewayCluster
    procs = GatewayCluster(tmp_path_factory.mktemp("real-model-logs"),
                           extra_args=["--model", "smollm2-135m-instruct"])
    started = time.monotonic()
    try:
        procs.start(timeout=240)
        procs.ready_s = time.monotonic() - started
        yield procs
    finally:
        procs.stop()


@pytest.fixture(scope="session")
def gateway_cluster(tmp_path_factory):
    """`infer-cluster serve --http-port` (coordinator, one replica, HTTP gateway), shared by
    tests/integration/test_gateway*.py."""
    from .gateway_cluster import GatewayCluster
    procs = GatewayCluster(tmp_path_factory.mktemp("gateway-logs"))
    try:
        yield procs.start()
    finally:
        procs.stop()


def openai_client(cluster, timeout: float = 60):
    """The real `openai` client of a cluster's gateway (no retries: a failure shows at once)."""
    import openai
    return openai.OpenAI(base_url=f"{cluster.url}/v1", api_key="unused", max_retries=0, timeout=timeout)


@pytest.fixture(scope="module")
def oai(gateway_cluster):
    """The real `openai` client of the session's gateway (one per test module)."""
    client = openai_client(gateway_cluster)
    yield client
    client.close()
