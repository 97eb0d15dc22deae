"""`CoordinatorConfig`: every knob of the coordinator process, validated.

Owns: addresses, liveness timings, admission limit, routing choice and size caps. Validation
raises `ValueError` naming the field (the CLI turns it into a one-line error). Never imports
torch or zmq.

To add a knob: add a field with a default, check it in `__post_init__`, add a CLI flag in
`infer_cluster/cli.py` (`coordinator` and `serve` commands).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Optional

from infer_cluster.protocol.codec import DEFAULT_MAX_FRAME_BYTES

from .routing import ROUTING_POLICIES


@dataclass
class CoordinatorConfig:
    host: str = "127.0.0.1"
    port: int = 5555                 # clients connect here (0 = pick a free port)
    replica_port: int | None = None  # replicas connect here; None = port + 1 (0 = free port)
    routing: str = "least-load"
    max_requests: int = 4096         # in-flight requests before OverloadedError
    heartbeat_interval: float = 0.5  # how often replicas send HEARTBEAT (told in HELLO_ACK)
    replica_timeout: float = 3.0     # no message from a replica for this long -> dead
    client_timeout: float = 4.0      # no message from a client with requests -> abort them
    no_replica_timeout: float = 10.0  # a request waits this long for any replica, then fails
    drain_timeout: float = 30.0      # on SIGTERM: wait this long for in-flight requests
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    socket_hwm: int = 100_000        # per-peer queue limit on both ROUTERs
    name: str = "coordinator"
    auth: Optional[str] = None       # key folder (`infer-cluster keygen`); None = no auth
    insecure: bool = False           # allow a non-loopback bind without auth

    def __post_init__(self):
        if not self.host:
            raise ValueError("host must not be empty")
        if not self.auth and not self.insecure and not is_loopback(self.host):
            raise ValueError(
                f"--host {self.host} accepts connections from other machines, and without "
                "--auth anyone who reaches the port can submit work, control the cluster or "
                "register as a replica; pass --auth DIR (keys from `infer-cluster keygen DIR`), "
                "or --insecure if the network is trusted")
        for name in ("port", "replica_port"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int) and 0 <= value <= 65535):
                raise ValueError(f"{name} must be a TCP port in 0..65535, got {value!r}")
        if self.replica_port is None:
            self.replica_port = 0 if self.port == 0 else self.port + 1
        if self.port != 0 and self.port == self.replica_port:
            raise ValueError(f"port and replica_port must differ, both are {self.port}")
        if self.routing not in ROUTING_POLICIES:
            raise ValueError(f"routing must be one of {sorted(ROUTING_POLICIES)}, got {self.routing!r}")
        if self.max_requests < 1:
            raise ValueError(f"max_requests must be >= 1, got {self.max_requests}")
        for name in ("heartbeat_interval", "replica_timeout", "client_timeout",
                     "no_replica_timeout", "drain_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)}")
        if self.replica_timeout < 2 * self.heartbeat_interval:
            raise ValueError(f"replica_timeout ({self.replica_timeout}) must be at least twice "
                             f"heartbeat_interval ({self.heartbeat_interval})")
        if self.max_frame_bytes < 1024:
            raise ValueError(f"max_frame_bytes must be >= 1024, got {self.max_frame_bytes}")
        if self.socket_hwm < 1:
            raise ValueError(f"socket_hwm must be >= 1, got {self.socket_hwm}")

    @property
    def front_address(self) -> str:
        return f"tcp://{self.host}:{self.port}"

    @property
    def back_address(self) -> str:
        return f"tcp://{self.host}:{self.replica_port}"


def is_loopback(host: str) -> bool:
    """True when `host` can only be reached from this machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # "*", a hostname or an interface name: reachable from elsewhere
