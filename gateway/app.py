"""The FastAPI application: lifespan, the small routes, and wiring of the parts.

Owns: `create_app(config)` (one backend connection, one metrics registry with the gateway's
metrics and the cluster collector, error handlers, routers), `GET /v1/models` and
`GET /v1/models/{model}`, `GET /health`
(200 only while at least one replica is active, from a fresh status call) and `GET /metrics`
(Prometheus text format). State lives on `app.state`, not in module globals, so tests and
several apps can share a process. Never imports torch.
"""

from __future__ import annotations

import contextlib
import logging

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from . import chat, completions
from .backend import ClusterBackend, active_replicas
from .cluster_metrics import ClusterCollector
from .config import GatewayConfig
from .errors import APIError, error_response, install_error_handlers
from .metrics import GatewayMetrics
from .schemas import ModelCard, ModelList

log = logging.getLogger("infer_cluster.gateway")


def create_app(config: GatewayConfig) -> FastAPI:
    backend = ClusterBackend(config)
    metrics = GatewayMetrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await backend.start()
        # /metrics fetches a fresh status before each scrape; the collector reads that one.
        metrics.registry.register(ClusterCollector(backend.scrape_status))
        log.info("gateway on http://%s:%d -> coordinator %s", config.host, config.port,
                 config.coordinator)
        try:
            yield
        finally:
            await backend.stop()

    app = FastAPI(title="infer-cluster", summary="OpenAI-compatible API of an infer-cluster",
                  lifespan=lifespan, docs_url="/docs", redoc_url=None)
    app.state.backend, app.state.metrics, app.state.config = backend, metrics, config
    install_error_handlers(app, config.retry_after, metrics)
    app.include_router(completions.router)
    app.include_router(chat.router)

    @app.get("/v1/models")
    async def list_models() -> ModelList:
        max_len = backend.max_model_len
        return ModelList(data=[ModelCard(id=name, created=backend.created, max_model_len=max_len)
                               for name in backend.model_names])

    @app.get("/v1/models/{model:path}")
    async def retrieve_model(model: str) -> ModelCard:
        """One model (the OpenAI client's `models.retrieve`); 404 `model_not_found` for a name
        this cluster does not serve. Names may hold slashes (`Qwen/Qwen3-0.6B`)."""
        backend.check_model_name(model)
        return ModelCard(id=model, created=backend.created, max_model_len=backend.max_model_len)

    @app.get("/health")
    async def health():
        try:
            status = await backend.refresh(timeout=2.0)
        except (TimeoutError, ConnectionError) as exc:  # ConnectionError: UnreachableError
            return error_response(APIError(f"the coordinator does not answer: {exc}", "no_replica"),
                                  config.retry_after)
        num_active = len(active_replicas(status))
        if num_active == 0:
            return error_response(APIError("no replica is active", "no_replica"), config.retry_after)
        return JSONResponse({"status": "ok", "num_active_replicas": num_active})

    @app.get("/metrics")
    async def prometheus_metrics():
        await backend.refresh_for_scrape()
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
