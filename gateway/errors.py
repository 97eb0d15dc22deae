"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with the right status.

Owns: `APIError` (what route code raises), the mapping from infer-cluster error codes (the
`code` of `protocol.errors` classes, as they arrive in a failed request's final delta) to HTTP
status and OpenAI error type, and the FastAPI exception handlers (pydantic validation errors
become 400 naming the field, not FastAPI's default 422), and `json_reply` (a response model as
a 200 JSON reply). Never imports torch.

To map a new cluster error: add its code to `_BY_CODE`.
"""

from __future__ import annotations

import logging
from typing import Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from infer_cluster.protocol import InferClusterError

log = logging.getLogger("infer_cluster.gateway")

# cluster error code -> (HTTP status, OpenAI error type)
_BY_CODE = {
    "invalid_request": (400, "invalid_request_error"),
    "invalid_config": (400, "invalid_request_error"),
    "out_of_memory": (400, "invalid_request_error"),  # can never fit this replica's KV pool
    "model_not_found": (404, "invalid_request_error"),
    "invalid_api_key": (401, "invalid_request_error"),  # gateway API keys (api_keys.py)
    "overloaded": (503, "server_error"),
    "no_replica": (503, "server_error"),
    "unreachable": (503, "server_error"),  # the coordinator does not answer
    "aborted": (503, "server_error"),
    "timeout": (504, "server_error"),
    "protocol": (500, "server_error"),
    "engine": (500, "server_error"),
    "internal": (500, "server_error"),
}


class APIError(Exception):
    """An error reply. `code` is the cluster's error code (or an HTTP-level one)."""

    def __init__(self, message: str, code: str = "invalid_request", param: Optional[str] = None,
                 status: Optional[int] = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param
        self.request_id: Optional[str] = None  # the reply's id once it has one (X-Request-Id)
        default_status, self.type = _BY_CODE.get(code, (500, "server_error"))
        self.status = status or default_status

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    @classmethod
    def from_cluster(cls, exc: InferClusterError, param: Optional[str] = None) -> "APIError":
        """The reply for a cluster error; `param` defaults to the field the error names."""
        return cls(exc.message, exc.code, param or exc.param)

    @classmethod
    def from_final(cls, finish_reason: str, error: Optional[dict]) -> "APIError":
        """The error a request that ended with `finish_reason` abort/error/timeout stands for."""
        if finish_reason == "abort":
            return cls("the request was aborted by the cluster (operator action or shutdown)",
                       "aborted")
        error = error or {}
        code = str(error.get("code") or ("timeout" if finish_reason == "timeout" else "internal"))
        return cls(str(error.get("message") or "the request failed"), code, error.get("param") or None)


def error_response(err: APIError, retry_after: int) -> JSONResponse:
    headers = {"Retry-After": str(retry_after)} if err.status == 503 else None
    if err.status == 401:
        headers = {"WWW-Authenticate": 'Bearer realm="infer-cluster"'}
    if err.request_id:
        headers = dict(headers or {}, **{"X-Request-Id": err.request_id})
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


def unexpected_error_response(exc: Exception, metrics, retry_after: int) -> JSONResponse:
    """An exception no handler expected: logged with its traceback, a 500 in OpenAI's shape."""
    log.error("unexpected error while serving a request", exc_info=exc)
    err = APIError(f"internal error in the gateway ({type(exc).__name__}: {exc}); see its log",
                   "internal")
    metrics.count_error(err.code, err.status)
    return error_response(err, retry_after)


def json_reply(model, request_id: Optional[str] = None) -> JSONResponse:
    """A 200 reply with a response model as its JSON: the same bytes FastAPI writes for a route
    that returns the model (no aliases, None kept), built here so the lean path
    (`fastpath.py`) and the FastAPI routes answer alike. `request_id`: its X-Request-Id."""
    return JSONResponse(model.model_dump(mode="json"),
                        headers={"X-Request-Id": request_id} if request_id else None)


def _param_of(loc) -> Optional[str]:
    parts = [str(p) for p in loc if p != "body"]
    return ".".join(parts) if parts else None


def _json_message(error: dict) -> str:
    """A body that is not JSON: what the parser expected, and where."""
    loc = error.get("loc", ())
    at = f" at character {loc[1]}" if len(loc) > 1 and isinstance(loc[1], int) else ""
    why = (error.get("ctx") or {}).get("error", "")
    return f"the request body is not valid JSON{at}" + (f": {why}" if why else "")


def install_error_handlers(app: FastAPI, retry_after: int, metrics) -> None:
    async def on_api_error(request: Request, exc: APIError):
        metrics.count_error(exc.code, exc.status)
        return error_response(exc, retry_after)

    async def on_validation_error(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        if first.get("type") == "json_invalid":  # loc is ("body", character offset): no field
            err = APIError(_json_message(first), "invalid_request")
        else:
            param = _param_of(first.get("loc", ()))
            where = f"{param}: " if param else ""
            msg = first.get("msg", "invalid value").removeprefix("Value error, ")  # our validators'
            err = APIError(f"{where}{msg}", "invalid_request", param)
        metrics.count_error(err.code, err.status)
        return error_response(err, retry_after)

    async def on_http_error(request: Request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        err = APIError(str(exc.detail), code, status=exc.status_code)
        err.type = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return error_response(err, retry_after)

    async def on_unexpected(request: Request, exc: Exception):
        # A bug, not the caller's mistake: logged with its traceback, answered in OpenAI's shape.
        return unexpected_error_response(exc, metrics, retry_after)

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(Exception, on_unexpected)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
