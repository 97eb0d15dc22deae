"""Structured outputs and a forced tool call through the whole cluster with the real
SmolLM2-135M-Instruct (`serve`: coordinator, replica and HTTP gateway as processes), asked by
the real `openai` client: a named function's call has valid arguments, plain and streamed, and a
`response_format` json_schema reply validates. tool_choice "auto": whatever the model chooses,
the reply is consistent and the stream agrees with it; the tools and a tool-call history reach
the template; a call the grammar makes the model write is parsed end to end."""

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


# ------------------------------------------------------------------ tool_choice "auto"

def _kind(message) -> str:
    return "calls" if message.tool_calls else "text"


def _check_auto_reply(choice):
    """Whatever SmolLM2 chose, the reply is consistent: calls of known tools whose arguments
    are JSON objects (finish_reason tool_calls), or text."""
    m = choice.message
    if m.tool_calls:
        assert choice.finish_reason == "tool_calls"
        for call in m.tool_calls:
            assert call.function.name == "get_weather" and call.id.startswith("call_")
            assert isinstance(json.loads(call.function.arguments), dict)
    else:
        assert choice.finish_reason in ("stop", "length") and isinstance(m.content, str)


def test_auto_tool_choice_plain_and_streamed_agree(oai):
    kw = dict(model=MODEL, messages=ASK, max_tokens=40, temperature=0, tools=[WEATHER])
    c = oai.chat.completions.create(**kw).choices[0]
    _check_auto_reply(c)
    content, calls, reason = "", [], None
    for chunk in oai.chat.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            content += ch.delta.content or ""
            calls += ch.delta.tool_calls or []
            reason = ch.finish_reason or reason
    assert ("calls" if calls else "text") == _kind(c.message) and reason == c.finish_reason
    assert (content or None) == c.message.content
    assert [(t.function.name, json.loads(t.function.arguments)) for t in calls] == \
        [(t.function.name, json.loads(t.function.arguments)) for t in c.message.tool_calls or ()]


def test_auto_tools_reach_the_template_and_history_is_accepted(oai):
    kw = dict(model=MODEL, max_tokens=1, temperature=0)
    plain = oai.chat.completions.create(messages=ASK, **kw).usage.prompt_tokens
    with_tools = oai.chat.completions.create(messages=ASK, tools=[WEATHER], **kw).usage.prompt_tokens
    assert with_tools > plain + 50
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"}]
    r = oai.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER], max_tokens=12,
                                    temperature=0)
    _check_auto_reply(r.choices[0])
    assert r.usage.prompt_tokens > with_tools + 20


def test_auto_parses_a_call_the_grammar_makes_the_model_write(oai):
    regex = (r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "[A-Z][a-z]{1,12}", '
             r'"unit": "(celsius|fahrenheit)"\}\}\n</tool_call>')
    kw = dict(model=MODEL, messages=ASK, max_tokens=48, temperature=0, tools=[WEATHER],
              extra_body={"structured_outputs": {"regex": regex}})
    c = oai.chat.completions.create(**kw).choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None, c.message
    (call,) = c.message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
