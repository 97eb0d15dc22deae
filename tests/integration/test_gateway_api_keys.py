"""HTTP API keys on a real `serve --http-port` (gateway/api_key_gate.py): the real `openai`
client with no key, a wrong key and each accepted key; the open paths; the 401 counted in the
metrics; a key given on `serve`'s command line reaching the gateway child by its
environment, never its argv; and `infer-cluster bench --http` with and without the key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from .conftest import REPO, child_env
from .gateway_cluster import GatewayCluster

pytestmark = pytest.mark.timeout(240)

ARGV_KEY = "argv-key-3f9c1a7e"          # given with --api-key
FILE_KEYS = ["file-key-one-81b2", "file-key-two-c04d"]  # given in --api-key-file


@pytest.fixture(scope="module")
def keyed_cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("api-keys")
    key_file = root / "keys.txt"
    key_file.write_text("# gateway keys\n" + "\n".join(FILE_KEYS) + "\n\n")
    cluster = GatewayCluster(root, extra_args=["--api-key", ARGV_KEY, "--api-key-file", str(key_file)])
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def _client(cluster, key):
    return openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=key, max_retries=0, timeout=60)


@pytest.mark.parametrize("key", [ARGV_KEY, *FILE_KEYS])
def test_each_accepted_key_generates(keyed_cluster, key):
    client = _client(keyed_cluster, key)
    got = client.completions.create(model="tiny-random", prompt="Hello", max_tokens=3, temperature=0)
    assert got.usage.completion_tokens == 3
    chunks = list(client.chat.completions.create(
        model="tiny-random", messages=[{"role": "user", "content": "hi"}], max_tokens=2, stream=True))
    assert chunks and chunks[-1].choices[0].finish_reason == "length"
    assert [m.id for m in client.models.list().data] == ["tiny-random"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_wrong_key_is_401_and_nothing_runs(keyed_cluster, stream):
    before = keyed_cluster.status()["coordinator"]["num_submitted"]
    with pytest.raises(openai.AuthenticationError) as err:
        _client(keyed_cluster, "not-a-key").completions.create(
            model="tiny-random", prompt="Hello", max_tokens=3, stream=stream)
    assert err.value.status_code == 401 and err.value.code == "invalid_api_key"
    assert "not valid" in err.value.message
    assert keyed_cluster.status()["coordinator"]["num_submitted"] == before


def test_no_key_is_401_naming_the_header(keyed_cluster):
    for method, path in (("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
                         ("GET", "/v1/models"), ("GET", "/v1/no-such-route")):
        resp = httpx.request(method, f"{keyed_cluster.url}{path}", timeout=10,
                             json={"model": "tiny-random", "prompt": "hi"} if method == "POST" else None)
        assert resp.status_code == 401, (path, resp.text)
        assert resp.headers["www-authenticate"].startswith("Bearer")
        error = resp.json()["error"]
        assert error["code"] == "invalid_api_key" and "Authorization: Bearer" in error["message"]
    # Not a bearer token: the same refusal
    resp = httpx.get(f"{keyed_cluster.url}/v1/models", headers={"Authorization": f"Basic {ARGV_KEY}"},
                     timeout=10)
    assert resp.status_code == 401


def test_health_and_metrics_stay_open_and_count_the_refusals(keyed_cluster):
    assert httpx.get(f"{keyed_cluster.url}/health", timeout=10).status_code == 200
    httpx.get(f"{keyed_cluster.url}/v1/models", timeout=10)  # one more refusal
    text = httpx.get(f"{keyed_cluster.url}/metrics", timeout=10).text
    lines = [line for line in text.splitlines()
             if line.startswith('infer_cluster_request_errors_total{code="invalid_api_key",status="401"}')]
    assert lines and float(lines[0].split()[-1]) >= 1, text[-2000:]


def test_the_command_line_key_is_not_in_the_gateway_argv(keyed_cluster):
    gateways = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"gateway" in argv and str(keyed_cluster.http_port).encode() in argv:
            gateways.append((argv, environ))
    assert len(gateways) == 1, gateways
    argv, environ = gateways[0]
    assert not any(ARGV_KEY.encode() in a for a in argv), argv
    assert f"INFER_CLUSTER_API_KEY={ARGV_KEY}".encode() in environ
    assert b"--api-key-file" in argv  # the file's path travels; the keys stay in the file


def _bench(cluster, tmp_path, *extra, env=None):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "infer_cluster", "--log-level", "WARNING", "bench", "--address",
         cluster.address, "--http", cluster.url, "-n", "2", "--concurrency", "1", "--input-len", "8",
         "--output-len", "2", "--json", str(out), *extra],
        cwd=REPO, env=dict(child_env(), **(env or {})), capture_output=True, text=True, timeout=150)
    return proc, out


def test_bench_http_sends_the_key_or_says_it_needs_one(keyed_cluster, tmp_path):
    proc, _ = _bench(keyed_cluster, tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr[-2000:]
    assert "refused the bench" in lines[0] and "--api-key" in lines[0], lines[0]
    proc, out = _bench(keyed_cluster, tmp_path, env={"INFER_CLUSTER_API_KEY": FILE_KEYS[0]})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(out.read_text())["http"]["num_completed"] == 2
