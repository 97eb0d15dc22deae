"""`GatewayConfig`: the options of one gateway process, validated in `__post_init__`.

Owns only the settings and their checks (each `ValueError` names the option, and the CLI turns
it into one line). Never imports torch or FastAPI.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from infer_cluster.coordinator.config import is_loopback


@dataclass
class GatewayConfig:
    coordinator: str = "tcp://127.0.0.1:5555"  # the coordinator's client address
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: Optional[str] = None    # extra name the API accepts for the cluster's model
    request_timeout: Optional[float] = None    # seconds; passed on as each request's deadline
    max_n: int = 16                            # cap on `n` (choices per prompt)
    max_batch: int = 256                       # cap on prompts in one /v1/completions call
    status_interval: float = 0.5               # how often the cached cluster status refreshes
    retry_after: int = 1                       # seconds, sent with 503 replies
    log_level: str = "info"
    auth: Optional[str] = None                 # key folder (`infer-cluster keygen`) when the
                                               # coordinator runs with --auth; client or admin key
    api_keys: tuple = field(default=(), repr=False)  # HTTP bearer keys (api_keys.py); () = none asked
    insecure: bool = False                     # allow a non-loopback host without api_keys

    def __post_init__(self):
        if not self.coordinator.startswith(("tcp://", "ipc://", "inproc://")):
            raise ValueError(f"coordinator must be a ZMQ address like tcp://HOST:PORT, got "
                             f"{self.coordinator!r}")
        if not self.host:
            raise ValueError("host must not be empty")
        if not self.api_keys and not self.insecure and not is_loopback(self.host):
            raise ValueError(
                f"--http-host/--host {self.host} accepts HTTP requests from other machines, and "
                "without an API key anyone who reaches the port can use the cluster; pass "
                "--api-key-file FILE (or INFER_CLUSTER_API_KEY), or --insecure if the network "
                "is trusted")
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ValueError(f"port must be a TCP port in 0..65535, got {self.port!r}")
        if self.request_timeout is not None and not self.request_timeout > 0:
            raise ValueError(f"request_timeout must be > 0 seconds, got {self.request_timeout!r}")
        for name in ("max_n", "max_batch", "retry_after"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if not self.status_interval > 0:
            raise ValueError(f"status_interval must be > 0, got {self.status_interval!r}")
