"""Running the gateway: `run_gateway(config)` serves the app with uvicorn until SIGINT/SIGTERM.

Owns only the uvicorn invocation (uvicorn picks uvloop and httptools, both dependencies, for a
cheaper event loop and HTTP parser; it handles the signals and finishes open responses on
shutdown; the app's lifespan closes the coordinator connection). Never imports torch.
"""

from __future__ import annotations

import uvicorn

from .app import create_app
from .config import GatewayConfig


def run_gateway(config: GatewayConfig) -> None:
    app = create_app(config)
    uvicorn.run(app, host=config.host, port=config.port, log_level=config.log_level.lower(),
                access_log=False, timeout_graceful_shutdown=10)
