"""Process supervision behind `infer-cluster serve`: one coordinator, N replica processes and,
with `--http-port`, one HTTP gateway process.

Owns: starting the children (own session, so a terminal Ctrl-C reaches only `serve`, and a
parent-death signal, so they never outlive a killed `serve`), waiting until the cluster is ready,
restarting a replica or gateway that dies (a replica registers again and takes load), and the
ordered stop: gateway first (it stops taking HTTP requests), then the coordinator and the
replicas together (SIGTERM: the coordinator refuses new work and waits for what is in flight,
each replica finishes its requests and says goodbye), SIGKILL after a grace period. It never
talks the wire protocol itself except through `InferenceClient.status`.
Never imports torch: replicas are separate processes.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

log = logging.getLogger("infer_cluster.serve")

RESTART_BACKOFF = (1.0, 2.0, 5.0, 10.0, 30.0)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    os.setsid()
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: SIGTERM us when the parent dies
    except Exception:
        pass


@dataclass
class Child:
    name: str
    argv: list[str]
    log_path: Optional[str] = None
    proc: Optional[subprocess.Popen] = None
    num_restarts: int = 0
    next_restart: Optional[float] = None
    _log_file: object = field(default=None, repr=False)

    def start(self, env: dict) -> None:
        out = None
        if self.log_path:
            self._log_file = open(self.log_path, "ab", buffering=0)
            out = self._log_file
        self.proc = subprocess.Popen(self.argv, env=env, stdout=out, stderr=out,
                                     stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        log.info("started %s (pid %d)%s", self.name, self.proc.pid,
                 f", log {self.log_path}" if self.log_path else "")

    @property
    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.is_running:
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float) -> bool:
        if self.proc is None:
            return True
        try:
            self.proc.wait(timeout=max(0.0, timeout))
            return True
        except subprocess.TimeoutExpired:
            return False


class ClusterLauncher:
    def __init__(self, coordinator_argv: list[str], replica_argvs: list[list[str]],
                 client_address: str, log_dir: Optional[str] = None, restart_replicas: bool = True,
                 env: Optional[dict] = None, replica_envs: Optional[list[dict]] = None,
                 auth: Optional[str] = None,
                 gateway_argv: Optional[list[str]] = None, gateway_url: Optional[str] = None,
                 gateway_env: Optional[dict] = None):
        self.auth = auth  # key folder for the readiness client (admin or client key)
        self.env = dict(env if env is not None else os.environ)
        self.env.setdefault("PYTHONUNBUFFERED", "1")
        self.replica_envs = [dict(e, PYTHONUNBUFFERED="1") for e in replica_envs] if replica_envs \
            else [self.env] * len(replica_argvs)
        if log_dir:
            os.makedirs(log_dir, exist_ok=True)
        path = (lambda n: os.path.join(log_dir, f"{n}.log")) if log_dir else (lambda n: None)
        self.coordinator = Child("coordinator", coordinator_argv, path("coordinator"))
        self.replicas = [Child(f"replica-{i}", argv, path(f"replica-{i}"))
                         for i, argv in enumerate(replica_argvs)]
        self.gateway = Child("gateway", gateway_argv, path("gateway")) if gateway_argv else None
        self.gateway_url = gateway_url
        self.gateway_env = dict(self.env, **(gateway_env or {}))  # `gateway_env`: variables added
        self.client_address = client_address
        self.restart_replicas = restart_replicas
        self.stop_event = threading.Event()

    def start(self, ready_timeout: float) -> dict:
        """Start everything; return the cluster status once all replicas registered.
        Raises RuntimeError (with the reason) if that does not happen in `ready_timeout`."""
        from infer_cluster.client import InferenceClient
        from infer_cluster.protocol import UnreachableError
        deadline = time.monotonic() + ready_timeout
        self.coordinator.start(self.env)
        for child, env in zip(self.replicas, self.replica_envs):
            child.start(env)
        # Waiting for a coordinator that is still starting is normal: only a refusal (wrong
        # key, auth on one side only) ends the wait early.
        with InferenceClient(self.client_address, name="serve", auth=self.auth,
                             connect_timeout=max(5.0, ready_timeout)) as client:
            while True:
                if not self.coordinator.is_running:
                    raise RuntimeError(f"the coordinator exited with code "
                                       f"{self.coordinator.proc.returncode} during startup")
                dead = [c for c in self.replicas if not c.is_running]
                if dead:
                    raise RuntimeError(f"{dead[0].name} exited with code "
                                       f"{dead[0].proc.returncode} during startup")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RuntimeError(f"the cluster was not ready after {ready_timeout:g} s")
                try:
                    status = client.status(timeout=min(2.0, remaining))
                except TimeoutError:
                    continue
                except UnreachableError as exc:
                    raise RuntimeError(str(exc)) from None
                if status["coordinator"].get("num_replicas", 0) >= len(self.replicas):
                    break
                if self.stop_event.wait(min(0.5, max(0.0, remaining))):
                    raise RuntimeError("stopped during startup")
        if self.gateway is not None:
            self.gateway.start(self.gateway_env)
            self._wait_gateway(deadline)
        return status

    def _wait_gateway(self, deadline: float) -> None:
        """Until the gateway's /health answers 200 (it has seen an active replica)."""
        import httpx
        logging.getLogger("httpx").setLevel(logging.WARNING)  # no line per health probe
        while True:
            if not self.gateway.is_running:
                raise RuntimeError(f"the HTTP gateway exited with code "
                                   f"{self.gateway.proc.returncode} during startup")
            try:
                if httpx.get(f"{self.gateway_url}/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() >= deadline:
                raise RuntimeError(f"the HTTP gateway at {self.gateway_url} was not healthy in time")
            if self.stop_event.wait(0.2):
                raise RuntimeError("stopped during startup")

    def supervise(self) -> int:
        """Until `stop_event`: restart dead replicas (with backoff). Returns an exit code:
        0 when asked to stop, 1 when the coordinator died on its own."""
        while not self.stop_event.wait(0.5):
            if not self.coordinator.is_running:
                log.error("the coordinator exited with code %s; stopping the cluster",
                          self.coordinator.proc.returncode)
                return 1
            now = time.monotonic()
            restartable = list(zip(self.replicas, self.replica_envs))
            if self.gateway is not None:
                restartable.append((self.gateway, self.gateway_env))
            for child, env in restartable:
                if child.is_running or not self.restart_replicas:
                    continue
                if child.next_restart is None:
                    delay = RESTART_BACKOFF[min(child.num_restarts, len(RESTART_BACKOFF) - 1)]
                    child.next_restart = now + delay
                    log.warning("%s exited with code %s; restarting in %g s", child.name,
                                child.proc.returncode, delay)
                elif now >= child.next_restart:
                    child.num_restarts += 1
                    child.next_restart = None
                    child.start(env)
        return 0

    def stop(self, drain_timeout: float, grace: float = 10.0) -> None:
        """Gateway first; then the coordinator and the replicas drain together (the coordinator
        refuses new work and waits for what is in flight; each replica finishes its requests,
        whose outputs still reach the coordinator, then says goodbye); SIGKILL stragglers.
        Stopping the replicas only after the coordinator exited would leave them heartbeating
        into a closed port meanwhile."""
        self.stop_event.set()
        if self.gateway is not None:
            self.gateway.signal(signal.SIGTERM)
            if not self.gateway.wait(grace + 5):
                log.warning("gateway still running after %g s; killing it", grace + 5)
                self.gateway.signal(signal.SIGKILL)
                self.gateway.wait(5)
        self.coordinator.signal(signal.SIGTERM)
        for child in self.replicas:
            child.signal(signal.SIGTERM)
        if not self.coordinator.wait(drain_timeout + grace):
            log.warning("coordinator still running after %g s; killing it", drain_timeout + grace)
            self.coordinator.signal(signal.SIGKILL)
            self.coordinator.wait(5)
        deadline = time.monotonic() + grace
        for child in self.replicas:
            if not child.wait(deadline - time.monotonic()):
                log.warning("%s still running after %g s; killing it", child.name, grace)
                child.signal(signal.SIGKILL)
                child.wait(5)
        for child in [self.coordinator, *self.replicas, *([self.gateway] if self.gateway else [])]:
            if child._log_file is not None:
                child._log_file.close()


def python_module_argv(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]
