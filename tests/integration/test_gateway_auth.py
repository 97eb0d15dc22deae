"""The gateway in front of a coordinator that requires CURVE keys (`serve --auth DIR`): the
gateway and the coordinator's metrics thread authenticate with the folder's client key, and
HTTP callers are served as usual."""

from __future__ import annotations

import subprocess
import sys

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from infer_cluster.client import InferenceClient

from .conftest import REPO, child_env
from .gateway_cluster import GatewayCluster

pytestmark = pytest.mark.timeout(240)


def test_gateway_serves_a_cluster_with_auth(tmp_path):
    keys = tmp_path / "keys"
    made = subprocess.run([sys.executable, "-m", "infer_cluster", "keygen", str(keys)], cwd=REPO,
                          env=child_env(), capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    cluster = GatewayCluster(tmp_path, auth=keys)
    try:
        cluster.start()
        client = openai.OpenAI(base_url=f"{cluster.url}/v1", api_key="unused", max_retries=0)
        got = client.completions.create(model="tiny-random", prompt="Hello", max_tokens=4,
                                        temperature=0)
        assert got.usage.completion_tokens == 4
        with InferenceClient(cluster.address, auth=keys) as zmq_client:
            ref = zmq_client.submit("Hello", {"max_tokens": 4, "temperature": 0.0}).result(60)
        assert got.choices[0].text == ref.text
        for url in (f"{cluster.url}/metrics", f"http://127.0.0.1:{cluster.metrics_port}/metrics"):
            samples = {s.name: s.value for f in text_string_to_metric_families(
                httpx.get(url, timeout=10).text) for s in f.samples}
            assert samples["infer_cluster_coordinator_up"] == 1, url
        # Without keys the coordinator stays out of reach (the gateway is the way in).
        with InferenceClient(cluster.address, connect_timeout=1.0) as plain:
            with pytest.raises((ConnectionError, TimeoutError)):
                plain.status(timeout=2.0)
    finally:
        cluster.stop()
