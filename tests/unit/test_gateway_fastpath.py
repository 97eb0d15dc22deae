"""The gateway's lean path (`gateway/fastpath.py`) in front of the real FastAPI app, driven as
an ASGI app in-process (no coordinator: the backend has seen no replica, so a request that
reaches a reply function gets the 503 of `check_can_serve`). Checks which requests the lean
path answers itself and that everything else reaches FastAPI with its body intact, giving the
same replies as before. The streamed and non-streamed replies themselves are covered through
the real `serve --http-port` in tests/integration/test_gateway*.py."""

from __future__ import annotations

import asyncio
import json

import pytest
from prometheus_client import generate_latest

from infer_cluster.gateway.app import create_app
from infer_cluster.gateway.config import GatewayConfig
from infer_cluster.gateway.fastpath import LeanRoutes, is_json_content_type

_JSON = [(b"content-type", b"application/json")]


def _call(app, method: str, path: str, body: bytes, headers=_JSON, chunks: int = 1):
    """One HTTP exchange through the ASGI app; the body split into `chunks` messages."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
             "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
             "query_string": b"", "headers": list(headers), "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 8000)}
    size = max(1, -(-len(body) // chunks))
    parts = [body[i:i + size] for i in range(0, len(body), size)] or [b""]
    inbox = [{"type": "http.request", "body": p, "more_body": i < len(parts) - 1}
             for i, p in enumerate(parts)]
    sent = []

    async def receive():
        if inbox:
            return inbox.pop(0)
        await asyncio.sleep(3600)  # the client stays connected

    async def send(message):
        sent.append(message)

    asyncio.run(asyncio.wait_for(app(scope, receive, send), 10))
    start = sent[0]
    headers = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    return start["status"], headers, b"".join(m.get("body", b"") for m in sent[1:])


@pytest.fixture()
def apps():
    inner = create_app(GatewayConfig())
    seen = []

    async def recorder(scope, receive, send):  # the FastAPI app, noting what reaches it
        seen.append((scope["method"], scope["path"]))
        await inner(scope, receive, send)

    recorder.state = inner.state
    return LeanRoutes(recorder), seen, inner


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_valid_bodies_are_answered_by_the_lean_path(apps, path):
    lean, seen, inner = apps
    body = (b'{"prompt": "hi", "stream": true}' if path == "/v1/completions"
            else b'{"messages": [{"role": "user", "content": "hi"}]}')
    status, headers, reply = _call(lean, "POST", path, body, chunks=3)
    assert seen == []  # FastAPI never saw it
    assert status == 503 and headers["retry-after"] == str(GatewayConfig().retry_after)
    assert json.loads(reply)["error"]["code"] == "no_replica"
    text = generate_latest(inner.state.metrics.registry).decode()
    assert 'infer_cluster_request_errors_total{code="no_replica",status="503"} 1.0' in text


@pytest.mark.parametrize("body, param", [
    (b'{"prompt": "hi", "max_tokens": 0}', "max_tokens"),
    (b'{"prompt": "hi", "bogus": 1}', "bogus"),
    (b'{"max_tokens": 3}', "prompt"),
    (b'{"prompt": "hi",', None),
    (b"", None),
])
def test_invalid_bodies_reach_fastapi_intact_and_get_its_400(apps, body, param):
    lean, seen, _ = apps
    status, _, reply = _call(lean, "POST", "/v1/completions", body, chunks=2)
    assert seen == [("POST", "/v1/completions")]
    error = json.loads(reply)["error"]
    assert status == 400 and error["code"] == "invalid_request"
    if param is not None:
        assert error["param"] == param
    # the same reply as the FastAPI app alone
    direct = _call(create_app(GatewayConfig()), "POST", "/v1/completions", body)
    assert (direct[0], json.loads(direct[2])) == (status, json.loads(reply))


def test_other_routes_methods_and_content_types_go_to_fastapi(apps):
    lean, seen, _ = apps
    assert _call(lean, "GET", "/v1/completions", b"")[0] == 405
    assert _call(lean, "GET", "/v1/models", b"")[0] == 200
    form = [(b"content-type", b"application/x-www-form-urlencoded")]
    status, _, reply = _call(lean, "POST", "/v1/completions", b'{"prompt": "hi"}', headers=form)
    assert status == 400 and json.loads(reply)["error"]["code"] == "invalid_request"
    assert seen == [("GET", "/v1/completions"), ("GET", "/v1/models"), ("POST", "/v1/completions")]


def test_json_content_types_as_fastapi_reads_them():
    assert is_json_content_type([])  # none given: FastAPI decodes JSON too
    assert is_json_content_type([(b"content-type", b"application/json; charset=utf-8")])
    assert is_json_content_type([(b"content-type", b"Application/JSON")])
    assert is_json_content_type([(b"content-type", b"application/vnd.api+json")])
    assert not is_json_content_type([(b"content-type", b"text/plain")])
    assert not is_json_content_type([(b"content-type", b"application/x-www-form-urlencoded")])

