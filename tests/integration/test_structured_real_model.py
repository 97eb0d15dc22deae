"""Structured outputs and a forced tool call through the whole cluster with the real
SmolLM2-135M-Instruct (`serve`: coordinator, replica and HTTP gateway as processes), asked by
the real `openai` client: a named function's call has valid arguments, plain and streamed, and a
`response_format` json_schema reply validates."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

pytestmark = pytest.mark.timeout(400)

MODEL = "smollm2-135m-instruct"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
ASK = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]


@pytest.fixture(scope="module")
def oai(real_model_cluster):
    """A client of the session's `serve` of MODEL (conftest.py), also asked by test_real_model."""
    client = openai.OpenAI(base_url=f"{real_model_cluster.url}/v1", api_key="unused",
                           max_retries=0, timeout=180)
    yield client
    client.close()


def test_named_tool_call_plain_and_streamed(oai):
    r = oai.chat.completions.create(model=MODEL, messages=ASK, max_tokens=40, temperature=0,
                                    tools=[WEATHER], tool_choice=NAMED)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c.message
    (call,) = c.message.tool_calls
    assert call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, WEATHER["function"]["parameters"])
    assert "paris" in args["city"].lower()

    streamed, reason = "", None
    for chunk in oai.chat.completions.create(model=MODEL, messages=ASK, max_tokens=40, temperature=0,
                                             tools=[WEATHER], tool_choice=NAMED, stream=True):
        for ch in chunk.choices:
            for tc in ch.delta.tool_calls or ():
                streamed += (tc.function.arguments or "") if tc.function else ""
            reason = ch.finish_reason or reason
    assert reason == "tool_calls" and json.loads(streamed) == args


def test_response_format_json_schema(oai):
    schema = {"type": "object", "properties": {"capital": {"type": "string"},
                                               "population_millions": {"type": "number"}},
              "required": ["capital"], "additionalProperties": False}
    r = oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is the capital of France? JSON."}],
        max_tokens=40, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema,
                                                                "strict": True}})
    c = r.choices[0]
    assert c.finish_reason == "stop", c.message.content
    value = json.loads(c.message.content)
    jsonschema.validate(value, schema)
    assert "paris" in value["capital"].lower()
