"""`ApiKeyGate`: the ASGI layer in front of the gateway that asks for an API key.

Owns the check on each request. Every HTTP request but those to `OPEN_PATHS` needs
`Authorization: Bearer KEY` with one of the keys (what the `openai` client sends for
`api_key=KEY`); without it the reply is a 401 in OpenAI's error shape (code `invalid_api_key`,
with `WWW-Authenticate`), counted in the error metric. Open: `/health` (load-balancer probes),
`/metrics` (Prometheus scrapes) and the API docs, as in vLLM; they carry no prompts or outputs.
Closed by default, so a route added later is guarded without a change here. The token is
compared in constant time (`hmac.compare_digest`) with every key. Keys come from
`api_keys.read_api_keys`. Never imports torch.

To open another path (only one that carries no user data): add it to `OPEN_PATHS`.
"""

from __future__ import annotations

import hmac
from typing import Iterable, Optional

from .errors import APIError, error_response

OPEN_PATHS = frozenset({"/health", "/metrics", "/docs", "/docs/oauth2-redirect", "/openapi.json"})


def _bearer(headers: Iterable[tuple[bytes, bytes]]) -> Optional[bytes]:
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" else None
    return None


class ApiKeyGate:
    """ASGI: HTTP requests outside `OPEN_PATHS` pass only with a valid bearer key; the rest
    (open paths, lifespan) goes to `app` untouched."""

    def __init__(self, app, keys: tuple[str, ...], count_error=None):
        if not keys:
            raise ValueError("ApiKeyGate needs at least one key")
        self.app = app
        self.keys = [k.encode() for k in keys]
        self.count_error = count_error  # (code, status) -> None, the gateway's error metric

    def accepts(self, token: Optional[bytes]) -> bool:
        if token is None:
            return False
        ok = False
        for key in self.keys:  # every key, so the time does not tell which one matched
            ok |= hmac.compare_digest(token, key)
        return ok

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        token = _bearer(scope["headers"])
        if self.accepts(token):
            return await self.app(scope, receive, send)
        message = ("no API key: send the header 'Authorization: Bearer KEY' (the openai client's "
                   "api_key)" if token is None else "the API key is not valid for this gateway")
        if self.count_error is not None:
            self.count_error("invalid_api_key", 401)
        await error_response(APIError(message, "invalid_api_key"), 0)(scope, receive, send)
