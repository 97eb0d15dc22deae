"""The lean path of the two generation routes: an ASGI app in front of the FastAPI app.

Owns: `LeanRoutes(app)`, which answers `POST /v1/completions` and `POST /v1/chat/completions`
itself - read the body, validate it with the route's pydantic model
(`Model.model_validate_json`), call the same reply function as the FastAPI route
(`completions.reply` / `chat.reply`), and turn an `APIError` into the same OpenAI error reply
and error metric as the app's handler - and hands everything else to the FastAPI app
unchanged: other routes, other methods, lifespan, and any body it cannot take as is. A body
that fails validation (or is empty, or not JSON) is replayed to the FastAPI app, so every 4xx
keeps exactly FastAPI's behaviour and shape (`errors.py`); the lean path only ever answers
requests that FastAPI would have passed to the route.

Why: FastAPI's request pipeline (middleware stack, router matching, dependency solving, the
JSON decode and a second pass of validation through a `TypeAdapter`, the handler wrapper) costs
~0.3 ms of CPU before the route on a small machine, and it sits between an HTTP request and its
first token (issue 12's TTFT target). The routes and their OpenAPI docs stay in FastAPI.

Never imports torch. To give another route the lean path: give it a `reply(body, state,
receive)` function like `completions.reply` and add it to `_ROUTES`.
"""

from __future__ import annotations

from pydantic import ValidationError

from . import chat, completions
from .errors import APIError, error_response, unexpected_error_response
from .schemas import ChatCompletionRequest, CompletionRequest

# path -> (request model, reply function); POST only
_ROUTES = {
    "/v1/completions": (CompletionRequest, completions.reply),
    "/v1/chat/completions": (ChatCompletionRequest, chat.reply),
}


def is_json_content_type(headers) -> bool:
    """True when FastAPI would decode the body as JSON: no Content-Type, or `application/json`
    or `application/*+json` (parameters such as `; charset=utf-8` ignored)."""
    for name, value in headers:
        if name == b"content-type":
            mime = value.split(b";", 1)[0].strip().lower()
            return mime == b"application/json" or (mime.startswith(b"application/")
                                                    and mime.endswith(b"+json"))
    return True


def replay(body: bytes, receive):
    """A receive callable that returns `body` (already read) once, then defers to `receive`."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive_again():
        return pending.pop() if pending else await receive()

    return receive_again


class LeanRoutes:
    """The ASGI app uvicorn serves: the two generation routes here, the rest in `app`."""

    def __init__(self, app):
        self.app = app  # the FastAPI app (its `state` holds backend, metrics, config)

    async def __call__(self, scope, receive, send) -> None:
        route = None
        if scope["type"] == "http" and scope["method"] == "POST":
            route = _ROUTES.get(scope["path"])
        if route is None or not is_json_content_type(scope["headers"]):
            return await self.app(scope, receive, send)
        chunks = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # gone before its body arrived: nothing to answer
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        model, reply = route
        try:
            request = model.model_validate_json(body) if body else None
        except ValidationError:
            request = None
        if request is None:  # FastAPI answers it, with its own error reply
            return await self.app(scope, replay(body, receive), send)
        state = self.app.state
        try:
            response = await reply(request, state, receive)
        except APIError as err:
            state.metrics.count_error(err.code, err.status)
            response = error_response(err, state.config.retry_after)
        except Exception as exc:  # a bug: still an OpenAI-shaped 500, as the app's handler gives
            response = unexpected_error_response(exc, state.metrics, state.config.retry_after)
        try:
            await response(scope, receive, send)  # a stream raises APIError before it starts
        except APIError as err:
            state.metrics.count_error(err.code, err.status)
            await error_response(err, state.config.retry_after)(scope, receive, send)
