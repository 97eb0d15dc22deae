"""Pure parts of the HTTP gateway and the chat path: parameter mapping, error mapping, the
cluster metrics collector, chat messages on the wire, and chat-template rendering."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from infer_cluster.gateway.cluster_metrics import ClusterCollector
from infer_cluster.gateway.errors import APIError
from infer_cluster.gateway.params import (chat_messages, chat_params, completion_params,
                                          completion_prompts, per_choice)
from infer_cluster.gateway.schemas import ChatCompletionRequest, CompletionRequest
from infer_cluster.protocol import InvalidRequestError, ProtocolError, SamplingParams
from infer_cluster.protocol import codec
from infer_cluster.protocol.messages import ChatMessage, DispatchRequest, SubmitRequest


def test_completion_request_maps_to_sampling_params():
    req = CompletionRequest(prompt="hi", max_tokens=7, temperature=0.5, top_p=0.9, stop="\n",
                            seed=3, presence_penalty=0.1, frequency_penalty=0.2, logprobs=2,
                            top_k=5, min_p=0.05, repetition_penalty=1.1, min_tokens=2,
                            ignore_eos=True, user="u")
    sp = completion_params(req, max_n=4)
    assert (sp.max_tokens, sp.temperature, sp.top_p, sp.stop, sp.seed) == (7, 0.5, 0.9, ["\n"], 3)
    assert (sp.presence_penalty, sp.frequency_penalty, sp.logprobs) == (0.1, 0.2, 2)
    assert sp.logprob_bytes and not completion_params(CompletionRequest(prompt="hi"), 4).logprob_bytes
    assert (sp.top_k, sp.min_p, sp.repetition_penalty, sp.min_tokens, sp.ignore_eos) == (5, 0.05, 1.1, 2, True)
    assert completion_params(CompletionRequest(prompt="hi"), 4).max_tokens == 16  # OpenAI default
    # the replica refuses a prompt + max_tokens past its context, the default 16 included
    assert sp.max_tokens_strict and completion_params(CompletionRequest(prompt="hi"), 4).max_tokens_strict


def test_chat_request_maps_to_sampling_params():
    req = ChatCompletionRequest(messages=[{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                         {"type": "text", "text": "b"}]}],
                                max_tokens=5, max_completion_tokens=9, logprobs=True, top_logprobs=3)
    sp = chat_params(req, max_n=4, max_model_len=2048)
    assert sp.max_tokens == 9 and sp.logprobs == 3
    assert chat_messages(req) == [{"role": "user", "content": "ab"}]
    plain = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], logprobs=True)
    assert chat_params(plain, 4, 2048).logprobs == 0  # logprobs of the sampled token only
    assert chat_params(plain, 4, 2048).max_tokens == 2048  # no cap given: up to the context
    assert sp.max_tokens_strict and not chat_params(plain, 4, 2048).max_tokens_strict


@pytest.mark.parametrize("kwargs, param", [
    (dict(prompt="hi", seed=-1), "seed"),
    (dict(prompt="hi", max_tokens=2, min_tokens=3), "min_tokens"),
    (dict(prompt="hi", echo=True), "echo"),
    (dict(prompt="hi", n=9), "n"),
    (dict(prompt="hi", best_of=3), "best_of"),
    (dict(prompt="hi", logit_bias={"1": -200.0}), "logit_bias"),
])
def test_unsupported_or_bad_values_name_the_field(kwargs, param):
    with pytest.raises(APIError) as info:
        completion_params(CompletionRequest(**kwargs), max_n=4)
    assert info.value.status == 400 and info.value.param == param


def test_prompt_forms_and_batches():
    assert completion_prompts(CompletionRequest(prompt="a"), 8) == ["a"]
    assert completion_prompts(CompletionRequest(prompt=[1, 2]), 8) == [[1, 2]]
    assert completion_prompts(CompletionRequest(prompt=["a", "b"]), 8) == ["a", "b"]
    assert completion_prompts(CompletionRequest(prompt=[[1], [2, 3]]), 8) == [[1], [2, 3]]
    with pytest.raises(APIError, match="at most 1"):
        completion_prompts(CompletionRequest(prompt=["a", "b"]), 1)
    with pytest.raises(APIError, match="prompt.1"):
        completion_prompts(CompletionRequest(prompt=["a", ""]), 8)


def test_per_choice_seeds_differ_but_reproduce():
    sp = SamplingParams(seed=10, temperature=1.0)
    assert [p.seed for p in per_choice(sp, 3)] == [10, 11, 12]
    assert per_choice(SamplingParams(), 2) == [SamplingParams()] * 2


@pytest.mark.parametrize("code, status", [("invalid_request", 400), ("out_of_memory", 400),
                                          ("model_not_found", 404), ("overloaded", 503),
                                          ("no_replica", 503), ("timeout", 504), ("engine", 500),
                                          ("something_new", 500)])
def test_error_codes_map_to_status(code, status):
    err = APIError("m", code)
    assert err.status == status
    assert err.body() == {"error": {"message": "m", "type": err.type, "param": None, "code": code}}


def test_final_deltas_map_to_errors():
    assert APIError.from_final("abort", None).status == 503
    assert APIError.from_final("timeout", {"code": "timeout", "message": "late"}).status == 504
    err = APIError.from_final("error", {"code": "invalid_request", "message": "prompt has 9 tokens"})
    assert (err.status, err.message, err.param) == (400, "prompt has 9 tokens", None)
    err = APIError.from_final("error", {"code": "invalid_request", "message": "m", "param": "max_tokens"})
    assert err.param == "max_tokens"


def test_a_cluster_error_keeps_the_field_it_names():
    from infer_cluster.protocol import InvalidRequestError, error_from_code
    exc = InvalidRequestError("too long", param="prompt")
    assert exc.to_dict() == {"code": "invalid_request", "message": "too long", "param": "prompt"}
    assert InvalidRequestError("x").to_dict() == {"code": "invalid_request", "message": "x"}
    again = error_from_code(**exc.to_dict())
    assert type(again) is InvalidRequestError and again.param == "prompt"
    assert APIError.from_cluster(again).param == "prompt"
    assert APIError.from_cluster(again, "messages").param == "messages"


def _scrape(status) -> dict:
    registry = CollectorRegistry()
    registry.register(ClusterCollector(lambda: status))
    return {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}


def test_cluster_collector_reads_status_at_scrape_time():
    status = {"coordinator": {"num_reroutes": 3, "num_replica_deaths": 1, "num_replica_departures": 2,
                              "num_in_flight": 5, "num_completed": 7, "num_refused": 2},
              "replicas": [{"name": "r0", "state": "active", "num_running": 2, "num_waiting": 1,
                            "num_total_blocks": 100, "num_free_blocks": 60, "kv_used": 0.4,
                            "num_preemptions": 4, "prefix_cache_hit_tokens": 32},
                           {"name": "r1", "state": "dead"}]}
    fams = _scrape(status)
    value = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in fams.values() for s in f.samples}
    assert value[("infer_cluster_coordinator_reroutes_total", ())] == 3
    assert value[("infer_cluster_coordinator_replica_deaths_total", ())] == 1
    assert value[("infer_cluster_coordinator_replica_departures_total", ())] == 2
    assert value[("infer_cluster_coordinator_requests_in_flight", ())] == 5
    assert value[("infer_cluster_coordinator_requests_total", (("outcome", "completed"),))] == 7
    assert value[("infer_cluster_coordinator_requests_total", (("outcome", "refused"),))] == 2
    r0 = (("replica", "r0"),)
    assert value[("infer_cluster_replica_num_running", r0)] == 2
    assert value[("infer_cluster_replica_kv_blocks_used", r0)] == 40
    assert value[("infer_cluster_replica_preemptions_total", r0)] == 4
    assert value[("infer_cluster_replica_prefix_cache_hit_tokens_total", r0)] == 32
    assert ("infer_cluster_replica_num_running", (("replica", "r1"),)) not in value  # dead: left out
    status["coordinator"]["num_reroutes"] = 4  # a later scrape sees the new value
    assert _scrape(status)["infer_cluster_coordinator_reroutes"].samples[0].value == 4


def test_cluster_collector_says_when_the_coordinator_is_down():
    def down():
        raise TimeoutError("no reply")
    registry = CollectorRegistry()
    registry.register(ClusterCollector(down))
    text = generate_latest(registry).decode()
    assert "infer_cluster_coordinator_up 0.0" in text
    assert "infer_cluster_replica_num_running" not in text


def test_chat_messages_travel_on_the_wire():
    msgs = [ChatMessage(role="system", content="be brief"), ChatMessage(role="user", content="hi")]
    sub = SubmitRequest(request_id="r", messages=msgs, sampling_params={"max_tokens": 3})
    back = codec.decode(codec.encode(sub))
    assert back.messages == msgs and back.prompt is None and back.prompt_token_ids is None
    disp = codec.decode(codec.encode(DispatchRequest(request_id="1.1", messages=msgs)))
    assert [m.to_dict() for m in disp.messages] == [{"role": "system", "content": "be brief"},
                                                   {"role": "user", "content": "hi"}]
    with pytest.raises(ProtocolError, match="exactly one of"):
        SubmitRequest.from_wire({**SubmitRequest(request_id="r", prompt="x").to_wire(),
                                 "messages": [{"role": "user", "content": "y"}]})
    with pytest.raises(ProtocolError, match="role"):
        SubmitRequest.from_wire({**SubmitRequest(request_id="r", prompt="x").to_wire(),
                                 "prompt": None, "messages": [{"content": "y"}]})


def test_render_chat_uses_the_template_and_refuses_a_model_without_one(tmp_path):
    from transformers import AutoTokenizer

    from infer_cluster.worker.text.chat import render_chat
    from infer_cluster.worker.loading.embedded import build_tokenizer
    build_tokenizer(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    ids = render_chat(tok, [{"role": "user", "content": "Hello"}])
    assert tok.decode(ids) == "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"
    tok.chat_template = None
    with pytest.raises(InvalidRequestError, match="no chat template"):
        render_chat(tok, [{"role": "user", "content": "Hello"}])


def test_cli_has_the_gateway_command_and_http_options():
    from click.testing import CliRunner

    from infer_cluster.cli import main
    runner = CliRunner()
    serve_help = runner.invoke(main, ["serve", "--help"]).output
    assert "--http-port" in serve_help and "--metrics-port" in serve_help
    assert "--metrics-port" in runner.invoke(main, ["coordinator", "--help"]).output
    gateway_help = runner.invoke(main, ["gateway", "--help"])
    assert gateway_help.exit_code == 0 and "--coordinator" in gateway_help.output
    bad = runner.invoke(main, ["gateway", "--port", "70000"])
    assert bad.exit_code == 1 and "port must be a TCP port" in bad.output
    assert "Traceback" not in bad.output


def test_bench_comparison_and_paired_overhead():
    from infer_cluster.loadgen import LoadResult, RequestTiming
    from infer_cluster.loadgen_http import compare, paired_http_overhead
    diff = compare({"ttft_p50_ms": 10.0, "output_tokens_per_s": 100.0},
                   {"ttft_p50_ms": 10.5, "output_tokens_per_s": 98.0})
    assert diff["ttft_p50_ms_added"] == 0.5 and diff["throughput_change_pct"] == -2.0
    http = LoadResult(timings=[RequestTiming(0.012, 0.110, 4, "length"),
                               RequestTiming(0.014, 0.130, 4, "length")])
    inside = {"infer_cluster_time_to_first_token_seconds_sum": 0.022,
              "infer_cluster_time_to_first_token_seconds_count": 2,
              "infer_cluster_e2e_request_latency_seconds_sum": 0.236,
              "infer_cluster_e2e_request_latency_seconds_count": 2}
    paired = paired_http_overhead({}, inside, http)
    assert paired["ttft_mean_ms_added_by_http"] == pytest.approx(2.0)
    assert paired["e2e_mean_ms_added_by_http"] == pytest.approx(2.0)


def test_stream_events_are_one_line_even_when_text_holds_unicode_line_breaks():
    from infer_cluster.gateway.schemas import CompletionChoice, CompletionResponse
    from infer_cluster.gateway.sse import event_json, sse
    text = "a\u2028b\u2029c\x85d\ne"
    frame = sse(event_json(CompletionResponse(id="x", model="m", choices=[
        CompletionChoice(index=0, text=text)]))).decode()
    assert frame.endswith("\n\n") and len(frame.splitlines()) == 2  # the event and the blank
    assert frame.isascii()
    import json
    assert json.loads(frame[len("data: "):])["choices"][0]["text"] == text


@pytest.mark.parametrize("text", ["", "plain", "a\u2028b\u2029c\x85d\ne\t\"q\"\\", "\x00\x1f\x7f é 漢 😀"])
@pytest.mark.parametrize("finish_reason", [None, "stop", "length"])
def test_fast_chunks_are_byte_identical_to_the_schema_models(text, finish_reason):
    """The streaming hot path builds chunks from dicts; the bytes must be the schema's (DEL
    aside: json escapes it, pydantic does not; both decode to the same text)."""
    import json

    def same(fast, slow):
        assert json.loads(fast) == json.loads(slow)
        assert fast.isascii()
        if "\x7f" not in text:
            assert fast == slow

    from infer_cluster.gateway.schemas import (ChatChunkChoice, ChatCompletionChunk, ChatDelta,
                                               CompletionChoice, CompletionResponse)
    from infer_cluster.gateway.sse import ChunkFormat, event_json
    rid, model, created = "cmpl-\u00e9\"x", "m/\u2028odel", 1700000000
    fast = ChunkFormat(rid, "text_completion", created, model).chunk(
        {"index": 3, "text": text, "logprobs": None, "finish_reason": finish_reason})
    slow = event_json(CompletionResponse(id=rid, created=created, model=model, choices=[
        CompletionChoice(index=3, text=text, finish_reason=finish_reason)]))
    same(fast, slow)
    for role in (None, "assistant"):
        fast = ChunkFormat(rid, "chat.completion.chunk", created, model).chunk(
            {"index": 1, "delta": {"role": role, "content": text}, "logprobs": None,
             "finish_reason": finish_reason})
        slow = event_json(ChatCompletionChunk(id=rid, created=created, model=model, choices=[
            ChatChunkChoice(index=1, delta=ChatDelta(role=role, content=text),
                            finish_reason=finish_reason)]))
        same(fast, slow)


def test_an_unexpected_error_is_an_openai_shaped_500_and_counted():
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from infer_cluster.gateway.errors import install_error_handlers
    from infer_cluster.gateway.metrics import GatewayMetrics

    app = FastAPI()
    metrics = GatewayMetrics()
    install_error_handlers(app, 1, metrics)

    @app.get("/boom")
    async def boom():
        raise OverflowError("Integer value out of range")

    resp = TestClient(app, raise_server_exceptions=False).get("/boom")
    assert resp.status_code == 500
    error = resp.json()["error"]
    assert error["code"] == "internal" and "OverflowError: Integer value out of range" in error["message"]
    assert 'code="internal",status="500"} 1.0' in generate_latest(metrics.registry).decode()


def test_a_value_msgpack_cannot_carry_is_a_protocol_error():
    msg = SubmitRequest(request_id="r", prompt="x", prompt_token_ids=None, sampling_params={},
                        priority=2**70)
    with pytest.raises(ProtocolError, match="SUBMIT message cannot be encoded"):
        codec.encode(msg)


def test_logprob_tokens_are_named_by_their_bytes():
    """The replica's `{token_id: bytes}` names each token (a split UTF-8 character as U+FFFD,
    chat's `bytes` exact); an id without bytes keeps `token_id:<id>`."""
    from infer_cluster.gateway.logprobs import chat_logprobs, completion_logprobs
    entries = [[-0.25, {5: -0.25, 9: -1.5}, {5: b" Hello", 9: b"\xe4\xb8"}],
               [-0.5, {7: -0.5, 99999: -2.0}, {7: b"!"}],
               [-1.0]]  # logprobs=0 and no bytes: the sampled token only, by id
    comp = completion_logprobs([5, 7, 3], entries, text_offset=4)
    assert comp.tokens == [" Hello", "!", "token_id:3"]
    assert comp.token_logprobs == [-0.25, -0.5, -1.0]
    assert comp.top_logprobs == [{" Hello": -0.25, "\ufffd": -1.5}, {"!": -0.5, "token_id:99999": -2.0}, None]
    chat = chat_logprobs([5, 7, 3], entries).content
    assert [(t.token, t.bytes) for t in chat] == [(" Hello", list(b" Hello")), ("!", [33]), ("token_id:3", None)]
    assert [(t.token, t.bytes) for t in chat[0].top_logprobs] == [(" Hello", list(b" Hello")),
                                                                 ("\ufffd", [0xE4, 0xB8])]
    assert chat[1].top_logprobs[1].token == "token_id:99999" and chat[1].top_logprobs[1].bytes is None
