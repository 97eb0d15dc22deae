"""OpenAI-compatible HTTP gateway: a light process that is a client of the coordinator.

Owns: the HTTP front door (`POST /v1/completions`, `POST /v1/chat/completions`,
`GET /v1/models`, `GET /health`, `GET /metrics`) on FastAPI + uvicorn, its pydantic schemas,
SSE streaming, OpenAI-shaped errors and the Prometheus metrics. Requests travel to the cluster
through `infer_cluster.client.AsyncInferenceClient`; several gateways may serve one coordinator.

Must never import torch or hold a model: it runs where no GPU stack is installed (a unit test
imports it and checks `sys.modules`). Chat templates are rendered on the replica, which has the
tokenizer.

Layout: `config.py` (GatewayConfig), `api_keys.py` / `api_key_gate.py` (HTTP API keys: reading
them, and the ASGI check in front of every route), `schemas.py` (pydantic request/response models),
`params.py` (request -> SamplingParams), `errors.py` (error shape and status codes),
`backend.py` (the coordinator connection and a cached status), `generation.py` (submitting
choices and folding their deltas), `completions.py` / `chat.py` (the two generation routes),
`sse.py` (streaming responses that cancel on disconnect), `metrics.py` / `cluster_metrics.py`
(Prometheus), `app.py` (the app factory), `fastpath.py` (the lean path of the two generation
routes, in front of the FastAPI app), `server.py` (uvicorn entry point).
To add an endpoint: a router module like `completions.py`, included in `app.create_app`; a
latency-critical one can also get the lean path (`fastpath._ROUTES`).

Exports are lazy so that `import infer_cluster.gateway.cluster_metrics` (used by the
coordinator's `--metrics-port`) does not load FastAPI.
"""

from __future__ import annotations

__all__ = ["GatewayConfig", "create_app", "run_gateway"]


def __getattr__(name):
    if name == "GatewayConfig":
        from .config import GatewayConfig
        return GatewayConfig
    if name == "create_app":
        from .app import create_app
        return create_app
    if name == "run_gateway":
        from .server import run_gateway
        return run_gateway
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
