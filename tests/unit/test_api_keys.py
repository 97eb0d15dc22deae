"""Reading gateway API keys (gateway/api_keys.py), the non-loopback rule of `GatewayConfig`,
and `ApiKeyGate` as an ASGI app around a plain one (no network)."""

from __future__ import annotations

import asyncio
import json

import pytest

from infer_cluster.gateway.api_key_gate import OPEN_PATHS, ApiKeyGate
from infer_cluster.gateway.api_keys import read_api_keys
from infer_cluster.gateway.config import GatewayConfig


def test_keys_from_flag_and_file(tmp_path):
    f = tmp_path / "keys"
    f.write_text("# team A\nkey-a\n\n  key-b  \n# key-c is revoked\nkey-a\n")
    assert read_api_keys("key-0", str(f)) == ("key-0", "key-a", "key-b")
    assert read_api_keys(None, str(f)) == ("key-a", "key-b")
    assert read_api_keys() == ()


@pytest.mark.parametrize("key, file_text, words", [
    ("", None, "must not be empty"),
    ("two words", None, "printable ASCII"),
    ("clé", None, "printable ASCII"),
    (None, "# nothing\n\n", "holds no key"),
    (None, "ok\nbad key\n", "printable ASCII"),
])
def test_bad_keys_are_refused_naming_the_problem(tmp_path, key, file_text, words):
    path = None
    if file_text is not None:
        path = tmp_path / "keys"
        path.write_text(file_text)
    with pytest.raises(ValueError, match=words):
        read_api_keys(key, None if path is None else str(path))


def test_a_missing_key_file_is_named(tmp_path):
    with pytest.raises(ValueError, match="cannot read it"):
        read_api_keys(None, str(tmp_path / "absent"))


def test_non_loopback_needs_a_key_or_insecure():
    with pytest.raises(ValueError, match="--api-key-file"):
        GatewayConfig(host="0.0.0.0")
    assert GatewayConfig(host="0.0.0.0", api_keys=("k",)).api_keys == ("k",)
    assert GatewayConfig(host="0.0.0.0", insecure=True).insecure
    assert GatewayConfig(host="::1").host == "::1"
    assert "secret-key" not in repr(GatewayConfig(api_keys=("secret-key",)))


def _call(gate, path, headers=()):
    """One request through `gate`: (status, JSON body or None)."""
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": path, "headers": list(headers),
             "query_string": b"", "root_path": ""}
    asyncio.run(gate(scope, receive, send))
    status = sent[0]["status"]
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return status, (json.loads(body) if body and status != 200 else None)


async def _ok_app(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def test_gate_passes_good_keys_and_open_paths_only():
    counted = []
    gate = ApiKeyGate(_ok_app, ("key-1", "key-2"), lambda code, status: counted.append((code, status)))
    assert _call(gate, "/v1/models", [(b"authorization", b"Bearer key-2")])[0] == 200
    assert _call(gate, "/v1/models", [(b"authorization", b"bearer key-1")])[0] == 200
    for path in OPEN_PATHS:
        assert _call(gate, path)[0] == 200, path
    for headers in ([], [(b"authorization", b"Bearer key-3")], [(b"authorization", b"Bearer key-1x")],
                    [(b"authorization", b"Basic key-1")], [(b"authorization", b"key-1")]):
        status, body = _call(gate, "/v1/completions", headers)
        assert status == 401 and body["error"]["code"] == "invalid_api_key", headers
    assert _call(gate, "/anything/else")[0] == 401  # closed by default
    assert counted == [("invalid_api_key", 401)] * 6
    with pytest.raises(ValueError):
        ApiKeyGate(_ok_app, ())
