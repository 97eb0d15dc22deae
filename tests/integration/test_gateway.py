"""The OpenAI-compatible gateway driven by the real `openai` package (sync, async, streaming)
against a real `infer-cluster serve --http-port` (coordinator, replica and gateway processes)."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from infer_cluster.client import InferenceClient
from infer_cluster.protocol import SamplingParams

pytestmark = pytest.mark.timeout(300)

MODEL = "tiny-random"
PROMPTS = ["Hello, world!", "The capital of France is", "def main():", "Once upon a time"]
CHAT = [{"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def zmq_client(gateway_cluster):
    with InferenceClient(gateway_cluster.address, name="test-reference") as c:
        yield c


def _reference(zmq_client, prompt, **params):
    return zmq_client.submit(prompt, SamplingParams(**params)).result(timeout=60)


def test_models_and_health(gateway_cluster, oai):
    models = oai.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert models.data[0].model_extra["max_model_len"] == 2048
    one = oai.models.retrieve(MODEL)
    assert one.id == MODEL and one.model_extra["max_model_len"] == 2048
    with pytest.raises(openai.NotFoundError) as err:
        oai.models.retrieve("org/no-such-model")  # a slash in the name still reaches the route
    assert err.value.body["code"] == "model_not_found" and "no-such-model" in err.value.body["message"]
    health = httpx.get(f"{gateway_cluster.url}/health", timeout=5)
    assert health.status_code == 200 and health.json()["num_active_replicas"] == 1


def test_greedy_completion_equals_inference_client(oai, zmq_client):
    for prompt in PROMPTS:
        ref = _reference(zmq_client, prompt, temperature=0.0, max_tokens=12)
        got = oai.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
        assert got.object == "text_completion" and got.model == MODEL
        assert got.choices[0].text == ref.text
        assert got.choices[0].finish_reason == ref.finish_reason
        assert got.usage.prompt_tokens == len(ref.prompt_token_ids)
        assert got.usage.completion_tokens == len(ref.token_ids)
        assert got.usage.total_tokens == len(ref.prompt_token_ids) + len(ref.token_ids)


def test_token_id_prompts_and_batches_keep_order(oai, zmq_client):
    refs = [_reference(zmq_client, p, temperature=0.0, max_tokens=6) for p in PROMPTS[:3]]
    ids = refs[0].prompt_token_ids
    one = oai.completions.create(model=MODEL, prompt=ids, max_tokens=6, temperature=0)
    assert one.choices[0].text == refs[0].text and one.usage.prompt_tokens == len(ids)
    batch = oai.completions.create(model=MODEL, prompt=PROMPTS[:3], max_tokens=6, temperature=0)
    assert [c.index for c in batch.choices] == [0, 1, 2]
    assert [c.text for c in batch.choices] == [r.text for r in refs]
    assert batch.usage.prompt_tokens == sum(len(r.prompt_token_ids) for r in refs)
    id_batch = oai.completions.create(model=MODEL, prompt=[r.prompt_token_ids for r in refs],
                                      max_tokens=6, temperature=0)
    assert [c.text for c in id_batch.choices] == [r.text for r in refs]


def test_streaming_text_equals_non_streaming(oai):
    full = oai.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=16, temperature=0)
    chunks = list(oai.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=16,
                                         temperature=0, stream=True,
                                         stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [full.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage == full.usage

    chat_full = oai.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10, temperature=0)
    chat_chunks = list(oai.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10,
                                                   temperature=0, stream=True,
                                                   stream_options={"include_usage": True}))
    assert chat_chunks[0].choices[0].delta.role == "assistant"
    chat_text = "".join(c.choices[0].delta.content or "" for c in chat_chunks if c.choices)
    assert chat_text == chat_full.choices[0].message.content
    assert chat_chunks[-1].usage == chat_full.usage


def test_chat_renders_the_template_on_the_replica(oai, zmq_client):
    ref = zmq_client.chat(CHAT, SamplingParams(temperature=0.0, max_tokens=10)).result(timeout=60)
    got = oai.chat.completions.create(model=MODEL, messages=CHAT, max_completion_tokens=10,
                                      temperature=0)
    assert got.object == "chat.completion"
    assert got.choices[0].message.role == "assistant"
    assert got.choices[0].message.content == ref.text
    assert got.usage.prompt_tokens == len(ref.prompt_token_ids)
    # The ChatML template wrapped the turns: more prompt tokens than the bare contents.
    bare = _reference(zmq_client, CHAT[1]["content"], temperature=0.0, max_tokens=1)
    assert len(ref.prompt_token_ids) > len(bare.prompt_token_ids) + 10


def test_seeded_sampling_reproduces(oai):
    kw = dict(model=MODEL, prompt=PROMPTS[0], max_tokens=12, temperature=1.0, top_p=0.95, seed=1234)
    a = oai.completions.create(**kw)
    b = oai.completions.create(**kw)
    assert a.choices[0].text == b.choices[0].text
    two = oai.completions.create(n=2, **kw)
    assert two.choices[0].text == a.choices[0].text  # choice 0 keeps the request's seed
    assert two.choices[0].text != two.choices[1].text  # choice 1 gets seed + 1
    again = oai.completions.create(n=2, **kw)
    assert [c.text for c in again.choices] == [c.text for c in two.choices]


def test_stop_strings(oai):
    full = oai.completions.create(model=MODEL, prompt=PROMPTS[2], max_tokens=16, temperature=0,
                                  extra_body={"ignore_eos": True})
    text = full.choices[0].text
    stop = text[4:7]
    assert len(stop) == 3
    cut = oai.completions.create(model=MODEL, prompt=PROMPTS[2], max_tokens=16, temperature=0,
                                 stop=[stop], extra_body={"ignore_eos": True})
    assert cut.choices[0].text == text[:text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_logprobs(oai):
    got = oai.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=5, temperature=0,
                                 logprobs=2)
    lp = got.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == got.usage.completion_tokens
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert value <= 0.0 and token in top  # greedy picks the most likely token
        assert len(top) == 2
        assert value == pytest.approx(max(top.values()))
    assert "".join(lp.tokens) == got.choices[0].text  # each token named by its own text
    chat = oai.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4, temperature=0,
                                       logprobs=True, top_logprobs=3)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    assert all(len(t.top_logprobs) == 3 and t.logprob <= 0.0 for t in content)
    assert content[0].logprob == pytest.approx(max(x.logprob for x in content[0].top_logprobs))
    joined = bytes(b for t in content for b in t.bytes)  # the exact bytes, split characters too
    assert joined.decode("utf-8", errors="replace") == chat.choices[0].message.content
    assert all(bytes(t.bytes).decode("utf-8", errors="replace") == t.token for t in content)


def test_n_two_choices(oai):
    got = oai.completions.create(model=MODEL, prompt=PROMPTS[3], max_tokens=7, temperature=0, n=2,
                                 extra_body={"ignore_eos": True})
    assert [c.index for c in got.choices] == [0, 1]
    assert got.choices[0].text == got.choices[1].text  # greedy: both the same
    assert got.usage.completion_tokens == 14
    chunks = list(oai.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=5, n=2,
                                              temperature=0, stream=True))
    texts = {0: "", 1: ""}
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] += ch.delta.content or ""
    assert texts[0] == texts[1] and texts[0]


def test_sixteen_concurrent_async_streams(gateway_cluster, oai):
    prompts = [f"{PROMPTS[i % 4]} {i}" for i in range(16)]
    refs = [oai.completions.create(model=MODEL, prompt=p, max_tokens=10, temperature=0,
                                   extra_body={"ignore_eos": True}).choices[0].text for p in prompts]

    async def run():
        client = openai.AsyncOpenAI(base_url=f"{gateway_cluster.url}/v1", api_key="unused",
                                    max_retries=0, timeout=60)

        async def one(prompt):
            stream = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=10,
                                                     temperature=0, stream=True,
                                                     extra_body={"ignore_eos": True})
            return "".join([c.choices[0].text async for c in stream if c.choices])
        try:
            return await asyncio.gather(*(one(p) for p in prompts))
        finally:
            await client.close()

    assert asyncio.run(run()) == refs
    gateway_cluster.wait_idle()


def test_closed_stream_aborts_its_request(gateway_cluster):
    body = {"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 2000, "stream": True,
            "ignore_eos": True}
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", f"{gateway_cluster.url}/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            lines = resp.iter_lines()
            for _ in range(3):
                assert next(lines).startswith("data: ")
                next(lines)  # blank separator
            assert gateway_cluster.status()["coordinator"]["num_in_flight"] == 1
        closed_at = time.monotonic()
    st = gateway_cluster.wait_idle(timeout=2.0)
    assert time.monotonic() - closed_at < 2.0
    assert st["coordinator"]["num_aborted"] >= 1


def test_disconnect_before_a_non_streaming_reply_aborts_its_request(gateway_cluster):
    body = {"model": MODEL, "prompt": PROMPTS[1], "max_tokens": 2000, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{gateway_cluster.url}/v1/completions", json=body,
                   timeout=httpx.Timeout(10.0, read=1.0))
    closed_at = time.monotonic()
    gateway_cluster.wait_idle(timeout=2.0)
    assert time.monotonic() - closed_at < 2.0


def test_metrics_parse_and_count(gateway_cluster, oai):
    oai.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=3, temperature=0)
    families = {f.name: f for f in text_string_to_metric_families(
        httpx.get(f"{gateway_cluster.url}/metrics", timeout=10).text)}
    for name in ("infer_cluster_requests", "infer_cluster_request_errors",
                 "infer_cluster_time_to_first_token_seconds",
                 "infer_cluster_time_per_output_token_seconds",
                 "infer_cluster_e2e_request_latency_seconds", "infer_cluster_prompt_tokens",
                 "infer_cluster_generation_tokens", "infer_cluster_gateway_requests_in_flight",
                 "infer_cluster_coordinator_reroutes", "infer_cluster_coordinator_replica_deaths",
                 "infer_cluster_coordinator_replica_departures",
                 "infer_cluster_coordinator_requests_in_flight", "infer_cluster_replica_num_running",
                 "infer_cluster_replica_num_waiting", "infer_cluster_replica_kv_blocks_used",
                 "infer_cluster_replica_preemptions", "infer_cluster_replica_prefix_cache_hit_tokens"):
        assert name in families, name

    def value(name, suffix="_total", **labels):
        return sum(s.value for s in families[name].samples
                   if s.name == name + suffix and all(s.labels.get(k) == v for k, v in labels.items()))

    assert value("infer_cluster_requests", finish_reason="length") >= 1
    assert value("infer_cluster_generation_tokens") >= 3
    assert value("infer_cluster_time_to_first_token_seconds", "_count") >= 1
    assert value("infer_cluster_coordinator_up", "") == 1
    assert value("infer_cluster_replica_kv_blocks_total", "", replica="replica-0") == 1024
    # The coordinator's own --metrics-port serves the cluster families without the gateway.
    own = {f.name for f in text_string_to_metric_families(
        httpx.get(f"http://127.0.0.1:{gateway_cluster.metrics_port}/metrics", timeout=10).text)}
    assert {"infer_cluster_coordinator_requests", "infer_cluster_replica_num_running"} <= own
