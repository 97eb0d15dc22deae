"""Error paths of the HTTP gateway with raw HTTP (httpx): OpenAI's error shape, the right
status for each cause, Retry-After on 503, and nothing left in flight afterwards."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from infer_cluster.client import InferenceClient
from infer_cluster.protocol import NoReplicaError

from .gateway_cluster import MAX_REQUESTS

pytestmark = pytest.mark.timeout(300)

MODEL = "tiny-random"


def _post(cluster, path, body, **kw):
    return httpx.post(f"{cluster.url}{path}", json=body, timeout=60, **kw)


def _error(resp, status: int, code: str, param=None) -> str:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == code, err
    assert err["type"] == ("invalid_request_error" if status < 500 else "server_error")
    if param is not None:
        assert err["param"] == param, err
    return err["message"]


@pytest.mark.parametrize("body, param, words", [
    ({"prompt": "hi", "top_p": 7}, "top_p", "less than or equal to 1"),
    ({"prompt": "hi", "temperature": -1}, "temperature", "greater than or equal to 0"),
    ({"prompt": "hi", "seed": -5}, "seed", "seed must be >= 0"),
    ({"prompt": "hi", "max_tokens": 2, "min_tokens": 5}, "min_tokens", "must be <= max_tokens"),
    ({"prompt": "hi", "tempreature": 1}, "tempreature", "Extra inputs"),
    ({"prompt": "hi", "n": 100}, "n", "at most"),
    ({"prompt": "hi", "logit_bias": {"x5": 1.0}}, "logit_bias", "keys must be token ids"),
    ({"prompt": "hi", "logit_bias": {"5": 101}}, "logit_bias", "in [-100, 100]"),
    ({"prompt": ""}, "prompt", "must not be empty"),
    ({"prompt": [1, -2]}, None, ""),
    ({"prompt": [1, 2**40]}, None, "list of integers in 0..2147483647"),
    ({"prompt": "hi", "stop_token_ids": [2**70]}, "stop_token_ids", "must be <= 2147483647"),
    ({"prompt": "hi", "max_tokens": 2**70}, "max_tokens", "must be <= 2147483647"),
    ({"prompt": ["a", [1, 2]]}, "prompt", "not a mix of strings and token-id lists"),
    ({"prompt": 5}, "prompt", "prompt: must be a string, a list of token ids"),
    ({"prompt": [[1, "x"]]}, "prompt", "prompt 0 is a list, so it must hold only token ids"),
    ({}, "prompt", "Field required"),
])
def test_bad_completion_parameters_are_400_naming_the_field(gateway_cluster, body, param, words):
    message = _error(_post(gateway_cluster, "/v1/completions", body), 400, "invalid_request", param)
    assert words in message


def test_bad_chat_requests_are_400(gateway_cluster):
    bad_role = {"messages": [{"role": "wizard", "content": "hi"}]}
    _error(_post(gateway_cluster, "/v1/chat/completions", bad_role), 400, "invalid_request",
           "messages.0.role")
    image = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}
    message = _error(_post(gateway_cluster, "/v1/chat/completions", image), 400, "invalid_request",
                     "messages.0.content")
    assert message == ("messages.0.content: only text content parts are supported, "
                       "got a part of type 'image_url'")
    for content in (5, ["hi"], [{"text": "hi"}]):
        message = _error(_post(gateway_cluster, "/v1/chat/completions",
                               {"messages": [{"role": "user", "content": content}]}),
                         400, "invalid_request", "messages.0.content")
        assert 'must be a string or a list of {"type": "text", "text": "..."} parts' in message
    no_messages = {"messages": []}
    _error(_post(gateway_cluster, "/v1/chat/completions", no_messages), 400, "invalid_request",
           "messages")
    top_without_logprobs = {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}
    _error(_post(gateway_cluster, "/v1/chat/completions", top_without_logprobs), 400,
           "invalid_request", "top_logprobs")
    resp = httpx.post(f"{gateway_cluster.url}/v1/chat/completions", content=b"{not json",
                      headers={"Content-Type": "application/json"}, timeout=30)
    message = _error(resp, 400, "invalid_request")
    assert message.startswith("the request body is not valid JSON at character 1"), message
    assert resp.json()["error"]["param"] is None


def test_unknown_model_is_404(gateway_cluster):
    message = _error(_post(gateway_cluster, "/v1/completions",
                           {"model": "gpt-17", "prompt": "hi", "max_tokens": 2}),
                     404, "model_not_found", "model")
    assert "gpt-17" in message and MODEL in message
    _error(_post(gateway_cluster, "/v1/chat/completions",
                 {"model": "gpt-17", "messages": [{"role": "user", "content": "hi"}]}),
           404, "model_not_found", "model")


@pytest.mark.parametrize("stream", [False, True])
def test_prompt_too_long_is_400_with_both_lengths(gateway_cluster, stream):
    body = {"model": MODEL, "prompt": [7] * 3000, "max_tokens": 4, "stream": stream}
    message = _error(_post(gateway_cluster, "/v1/completions", body), 400, "invalid_request", "prompt")
    assert "3000" in message and "2048" in message
    chat = {"messages": [{"role": "user", "content": "capital of France " * 1500}], "stream": stream,
            "max_tokens": 4}
    message = _error(_post(gateway_cluster, "/v1/chat/completions", chat), 400, "invalid_request",
                     "messages")
    assert "max_model_len is 2048" in message
    gateway_cluster.wait_idle()


@pytest.mark.parametrize("stream", [False, True])
def test_max_tokens_past_the_context_is_400_saying_what_fits(gateway_cluster, stream):
    """As the OpenAI API and vLLM answer it: a prompt plus max_tokens longer than max_model_len
    (2048 here) is refused, not cut short with finish_reason "length". Chat without max_tokens
    still runs to the context."""
    body = {"model": MODEL, "prompt": [7] * 2000, "max_tokens": 100, "stream": stream}
    message = _error(_post(gateway_cluster, "/v1/completions", body), 400, "invalid_request",
                     "max_tokens")
    assert "prompt has 2000 and max_tokens asks for 100 more (2100)" in message
    assert "at most 48 tokens" in message and "max_model_len is 2048" in message
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 5000,
            "stream": stream}
    message = _error(_post(gateway_cluster, "/v1/chat/completions", chat), 400, "invalid_request",
                     "max_completion_tokens")  # the field this request used
    assert "max_tokens asks for 5000 more" in message
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5000, "stream": stream}
    _error(_post(gateway_cluster, "/v1/chat/completions", chat), 400, "invalid_request", "max_tokens")
    body["max_tokens"] = 48
    assert _post(gateway_cluster, "/v1/completions", body).status_code == 200
    gateway_cluster.wait_idle()


def test_overload_is_503_with_retry_after(gateway_cluster):
    """MAX_REQUESTS + 16 long streams at once: exactly MAX_REQUESTS are admitted (they stay
    open until every reply is in), the rest get 503 overloaded with Retry-After."""
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 2000, "ignore_eos": True,
            "stream": True}
    num = MAX_REQUESTS + 16

    async def run():
        answered, all_answered = [], asyncio.Event()

        async def one(http):
            async with http.stream("POST", f"{gateway_cluster.url}/v1/completions", json=body) as r:
                body_text = (await r.aread()).decode() if r.status_code != 200 else ""
                answered.append((r.status_code, r.headers.get("Retry-After"), body_text))
                if len(answered) == num:
                    all_answered.set()
                await all_answered.wait()  # admitted streams stay in flight until then

        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=num)) as http:
            await asyncio.wait_for(asyncio.gather(*(one(http) for _ in range(num))), 120)
        return answered

    answered = asyncio.run(run())
    statuses = sorted(status for status, _, _ in answered)
    assert statuses == [200] * MAX_REQUESTS + [503] * 16
    for status, retry_after, text in answered:
        if status == 503:
            assert retry_after == "1"
            err = json.loads(text)["error"]
            assert err["code"] == "overloaded" and "--max-requests" in err["message"]
    gateway_cluster.wait_idle()  # closing the admitted streams cancelled them


def test_no_active_replica_is_503_and_health_follows(gateway_cluster):
    with InferenceClient(gateway_cluster.address, name="test-control") as c:
        assert c.control("pause")["ok"]
        try:
            deadline = time.monotonic() + 5
            health = None
            while time.monotonic() < deadline:
                health = httpx.get(f"{gateway_cluster.url}/health", timeout=5)
                if health.status_code == 503:
                    break
                time.sleep(0.1)
            assert health.status_code == 503 and health.headers["Retry-After"] == "1"
            time.sleep(1.0)  # past the gateway's cached status refresh
            resp = _post(gateway_cluster, "/v1/completions", {"prompt": "hi", "max_tokens": 2})
            assert "no replica is active" in _error(resp, 503, "no_replica")
            assert resp.headers["Retry-After"] == "1"
            # Through ZMQ the request waits --no-replica-timeout (5 s), then says what to do.
            with pytest.raises(NoReplicaError) as err:
                c.submit("hi", {"max_tokens": 2}).result(timeout=30)
            assert "paused or draining" in str(err.value) and "control resume" in str(err.value)
        finally:
            assert c.control("resume")["ok"]
    deadline = time.monotonic() + 5
    while httpx.get(f"{gateway_cluster.url}/health", timeout=5).status_code != 200:
        assert time.monotonic() < deadline, "health did not recover after resume"
        time.sleep(0.1)
    time.sleep(1.0)
    ok = _post(gateway_cluster, "/v1/completions", {"prompt": "hi", "max_tokens": 2})
    assert ok.status_code == 200, ok.text


def test_error_counts_reach_metrics(gateway_cluster):
    _post(gateway_cluster, "/v1/completions", {"prompt": "hi", "top_p": 9})
    text = httpx.get(f"{gateway_cluster.url}/metrics", timeout=10).text
    lines = [l for l in text.splitlines()
             if l.startswith('infer_cluster_request_errors_total{code="invalid_request",status="400"}')]
    assert lines and float(lines[0].split()[-1]) >= 1


def test_unknown_path_is_openai_shaped_404(gateway_cluster):
    resp = httpx.get(f"{gateway_cluster.url}/v1/nothing", timeout=10)
    assert resp.status_code == 404 and json.loads(resp.text)["error"]["code"] == "not_found"


def test_replies_carry_their_id_and_a_failure_is_logged_under_it(gateway_cluster):
    ok = _post(gateway_cluster, "/v1/completions", {"prompt": "hi", "max_tokens": 2})
    assert ok.status_code == 200 and ok.headers["X-Request-Id"] == ok.json()["id"]
    with httpx.stream("POST", f"{gateway_cluster.url}/v1/chat/completions", timeout=30,
                      json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                            "stream": True}) as resp:
        first = next(line for line in resp.iter_lines() if line.startswith("data: {"))
        assert resp.headers["X-Request-Id"] == json.loads(first[6:])["id"]
    # A prompt the replica refuses: the 400 names its id, and the coordinator's log line under
    # that id names the replica and the replica's own id for the request.
    before = _outcomes(gateway_cluster)
    refused = _post(gateway_cluster, "/v1/completions", {"prompt": [10**6], "max_tokens": 2})
    _error(refused, 400, "invalid_request", "prompt")  # an id outside the vocabulary
    rid = refused.headers["X-Request-Id"]
    assert rid.startswith("cmpl-")
    deadline = time.monotonic() + 5
    while f"request {rid}-0 refused on replica replica-0 (as " not in gateway_cluster.log():
        assert time.monotonic() < deadline, gateway_cluster.log()[-2000:]
        time.sleep(0.1)
    # ... and the coordinator counts it as refused (the request's fault), not as failed (the
    # cluster is shared with the module's other tests: compare with the counts before it).
    after = _outcomes(gateway_cluster)
    assert after["refused"] == before["refused"] + 1 and after["failed"] == before["failed"], (before, after)


def _outcomes(cluster) -> dict:
    """The coordinator's ended requests by outcome, from the gateway's /metrics (the status it
    reads is refreshed every 0.5 s, so this waits for it to settle: two equal reads)."""
    def read():
        text = httpx.get(f"{cluster.url}/metrics", timeout=10).text
        return {line.split('"')[1]: float(line.split()[-1]) for line in text.splitlines()
                if line.startswith("infer_cluster_coordinator_requests_total{outcome=")}
    last, deadline = read(), time.monotonic() + 5
    while time.monotonic() < deadline:
        time.sleep(0.6)
        now = read()
        if now == last:
            return now
        last = now
    return last
