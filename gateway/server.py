"""Running the gateway: `run_gateway(config)` serves the app with uvicorn until SIGINT/SIGTERM.

Owns only the uvicorn invocation: the FastAPI app behind the lean path of the generation routes
(`fastpath.LeanRoutes`), uvloop and httptools (both dependencies) for a cheaper event loop and
HTTP parser, and no per-request work the gateway does not need (no access log, no
`X-Forwarded-*` rewriting: the gateway does not use the client address). uvicorn handles the
signals and finishes open responses on shutdown; the app's lifespan closes the coordinator
connection. Never imports torch.
"""

from __future__ import annotations

import uvicorn

from .app import create_app
from .config import GatewayConfig
from .fastpath import LeanRoutes


def run_gateway(config: GatewayConfig) -> None:
    app = LeanRoutes(create_app(config))
    uvicorn.run(app, host=config.host, port=config.port, log_level=config.log_level.lower(),
                loop="uvloop", http="httptools", access_log=False, proxy_headers=False,
                timeout_graceful_shutdown=10)
