"""The gateway's connection to the cluster: one `AsyncInferenceClient` and a cached status.

Owns: the client's lifetime (opened at app start-up, closed at shutdown), a status snapshot
refreshed every `status_interval` seconds by one background task (so the per-request checks,
"is any replica active?" and "which model names are served?", cost no round trip), and fresh
status calls for `/health` and `/metrics`. Never imports torch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Optional

from infer_cluster.client import AsyncInferenceClient

from .config import GatewayConfig
from .errors import APIError

log = logging.getLogger("infer_cluster.gateway")


def active_replicas(status: dict) -> list[dict]:
    return [r for r in status.get("replicas", []) if r.get("state") == "active"]


class ClusterBackend:
    def __init__(self, config: GatewayConfig):
        self.config = config
        self.client: Optional[AsyncInferenceClient] = None
        self.status: dict = {"coordinator": {}, "replicas": []}
        self.status_at = 0.0
        self._refresher: Optional[asyncio.Task] = None
        self._scrape_error: Optional[str] = "no scrape yet"
        self.created = int(time.time())

    async def start(self) -> None:
        # on_loop: no client IO thread between the event loop and the socket (lower TTFT).
        self.client = AsyncInferenceClient(self.config.coordinator, name="gateway",
                                           auth=self.config.auth, on_loop=True)
        try:
            await self.refresh(timeout=2.0)
        except (TimeoutError, ConnectionError):  # ConnectionError: UnreachableError
            log.warning("the coordinator at %s does not answer yet; serving 503 until it does",
                        self.config.coordinator)
        self._refresher = asyncio.get_running_loop().create_task(self._refresh_forever())

    async def stop(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
        if self.client is not None:
            await self.client.aclose()

    async def refresh(self, timeout: float = 2.0) -> dict:
        status = await self.client.status(timeout=timeout)
        self.status, self.status_at = status, time.monotonic()
        return status

    async def refresh_for_scrape(self) -> None:
        """A fresh status for the metrics collector (`scrape_status`), or the reason there is none."""
        try:
            await self.refresh(timeout=2.0)
            self._scrape_error = None
        except (TimeoutError, ConnectionError) as exc:
            self._scrape_error = str(exc)

    def scrape_status(self) -> dict:
        """The status fetched by the last `refresh_for_scrape`; raises when that failed."""
        if self._scrape_error is not None:
            raise TimeoutError(self._scrape_error)
        return self.status

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.status_interval)
            try:
                await self.refresh(timeout=max(1.0, 4 * self.config.status_interval))
            except (TimeoutError, ConnectionError):
                self.status = {"coordinator": {}, "replicas": []}
            except Exception:  # never let the refresher die silently
                log.exception("status refresh failed")

    # ------------------------------------------------------------------ per-request checks

    @property
    def model_names(self) -> list[str]:
        names = [r["model"] for r in active_replicas(self.status) if r.get("model")]
        names += [self.status.get("coordinator", {}).get("model") or ""]
        if self.config.served_model_name:
            names.insert(0, self.config.served_model_name)
        return list(dict.fromkeys(n for n in names if n))

    @property
    def default_model(self) -> str:
        names = self.model_names
        return names[0] if names else "infer-cluster"

    @property
    def max_model_len(self) -> Optional[int]:
        lens = [r["max_model_len"] for r in active_replicas(self.status) if r.get("max_model_len")]
        return min(lens) if lens else None

    def check_can_serve(self, model: Optional[str]) -> str:
        """The model name to answer with; 503 when no replica is active (per the last status),
        404 when `model` is not one this cluster serves."""
        if not active_replicas(self.status):
            reason = ("the coordinator does not answer" if not self.status.get("coordinator")
                      else "no replica is active (none registered, or all paused / draining)")
            raise APIError(f"cannot serve requests now: {reason}; retry later", "no_replica")
        if model is not None:
            self.check_model_name(model)
        return model or self.default_model

    def check_model_name(self, model: str) -> None:
        """404 `model_not_found` naming what is served, when `model` is not one of this
        cluster's names."""
        if model not in self.model_names:
            served = ", ".join(map(repr, self.model_names)) or "nothing (no replica is active)"
            raise APIError(f"the model {model!r} does not exist; this cluster serves {served}",
                           "model_not_found", "model")
