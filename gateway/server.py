"""Running the gateway: `run_gateway(config)` serves the app with uvicorn until SIGINT/SIGTERM.

Owns only the uvicorn invocation: the FastAPI app behind the lean path of the generation routes
(`fastpath.LeanRoutes`), uvloop and httptools (both dependencies) for a cheaper event loop and
HTTP parser, and no per-request work the gateway does not need (no access log, no
`X-Forwarded-*` rewriting: the gateway does not use the client address). uvicorn handles the
signals and finishes open responses on shutdown; the app's lifespan closes the coordinator
connection. With `config.api_keys`, `api_key_gate.ApiKeyGate` stands in front of both.
Never imports torch.
"""

from __future__ import annotations

import uvicorn

from .api_key_gate import ApiKeyGate
from .app import create_app
from .config import GatewayConfig
from .fastpath import LeanRoutes


def run_gateway(config: GatewayConfig) -> None:
    fastapi_app = create_app(config)
    app = LeanRoutes(fastapi_app)
    if config.api_keys:
        app = ApiKeyGate(app, config.api_keys, fastapi_app.state.metrics.count_error)
    uvicorn.run(app, host=config.host, port=config.port, log_level=config.log_level.lower(),
                loop="uvloop", http="httptools", access_log=False, proxy_headers=False,
                timeout_graceful_shutdown=10)
