"""Structured outputs through the real gateway and cluster (tiny-random, whose random weights
leave the mask alone to keep the output valid), asked by the real `openai` client:
`response_format` json_object and json_schema, vLLM's `structured_outputs` and `guided_*` extra
body on chat and completions, streaming; bad ones are a 400 naming the field, whether the
gateway sees the fault (shape) or the replica's compiler does (a schema xgrammar refuses).
And `logit_bias`, whose ids past the vocabulary the replica refuses."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest

from infer_cluster.client import InferenceClient
from infer_cluster.protocol import SamplingParams

from tests.structured.schemas import BOUNDED

pytestmark = pytest.mark.timeout(300)

MODEL = "tiny-random"
CHAT = [{"role": "user", "content": "Give me JSON."}]


def test_response_format_json_schema(oai):
    schema = BOUNDED["nested"]
    r = oai.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=80, temperature=1.0, seed=3, n=2,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "user", "schema": schema, "strict": True}})
    assert len(r.choices) == 2
    for c in r.choices:
        assert c.finish_reason == "stop", c.message.content
        jsonschema.validate(json.loads(c.message.content), schema)


def test_response_format_json_object_streamed(oai):
    stream = oai.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=120, temperature=0,
                                         response_format={"type": "json_object"}, stream=True)
    text, reason = "", None
    for chunk in stream:
        for c in chunk.choices:
            text += c.delta.content or ""
            reason = c.finish_reason or reason
    assert text.startswith("{")
    if reason == "stop":
        assert isinstance(json.loads(text), dict)


def test_vllm_extra_body(oai):
    schema = BOUNDED["enum"]
    r = oai.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=40, temperature=0.9,
                                    seed=1, extra_body={"structured_outputs": {"json": schema}})
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    r = oai.completions.create(model=MODEL, prompt="Color:", max_tokens=10, temperature=1.0, seed=2,
                               extra_body={"guided_choice": ["red", "green", "blue"]})
    assert r.choices[0].text in ("red", "green", "blue") and r.choices[0].finish_reason == "stop"
    r = oai.completions.create(model=MODEL, prompt="Id:", max_tokens=20, temperature=1.0, seed=2,
                               extra_body={"guided_regex": r"[A-Z]{2}-\d{3}"})
    assert re.fullmatch(r"[A-Z]{2}-\d{3}", r.choices[0].text)
    r = oai.completions.create(model=MODEL, prompt="Sum:", max_tokens=30, temperature=1.0, seed=5,
                               extra_body={"guided_grammar": 'root ::= [1-9] " + " [1-9]'})
    assert re.fullmatch(r"[1-9] \+ [1-9]", r.choices[0].text)
    r = oai.completions.create(model=MODEL, prompt="x", max_tokens=60, temperature=0,
                               extra_body={"guided_json": BOUNDED["flat"]})
    jsonschema.validate(json.loads(r.choices[0].text), BOUNDED["flat"])


def _bad(call) -> openai.BadRequestError:
    with pytest.raises(openai.BadRequestError) as err:
        call()
    return err.value


@pytest.mark.parametrize("kwargs, param", [
    (dict(response_format={"type": "json_schema"}), "response_format"),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}),
     "response_format"),
    (dict(response_format={"type": "xml"}), "response_format"),
    (dict(extra_body={"structured_outputs": {"regex": "a", "choice": ["a"]}}), "structured_outputs"),
    (dict(extra_body={"guided_choice": []}), "guided_choice"),
    (dict(response_format={"type": "json_object"}, extra_body={"guided_regex": "a"}), "guided_regex"),
    # refused by the replica's compiler: named in the words of the request
    (dict(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "nope"}}}}}),
     "response_format"),
    (dict(extra_body={"guided_regex": "(unclosed"}), "guided_regex"),
    (dict(extra_body={"structured_outputs": {"grammar": "root ::= missing"}}), "structured_outputs.grammar"),
])
def test_bad_constraints_are_400_naming_the_field(oai, kwargs, param):
    err = _bad(lambda: oai.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=5, **kwargs))
    body = err.body if isinstance(err.body, dict) else {}
    got = body.get("param") or body.get("error", {}).get("param")
    assert got == param, (err.body, err.message)


def test_logit_bias(oai, gateway_cluster):
    r = oai.completions.create(model=MODEL, prompt="Hello", max_tokens=5, temperature=0,
                               logit_bias={"42": 100}, extra_body={"ignore_eos": True})
    with InferenceClient(gateway_cluster.address, name="test-logit-bias") as c:
        ref = c.submit("Hello", SamplingParams(temperature=0, max_tokens=5, ignore_eos=True,
                                               logit_bias={42: 100})).result(timeout=60)
    assert ref.token_ids == [42] * 5 and r.choices[0].text == ref.text
    err = _bad(lambda: oai.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=5,
                                                   logit_bias={"99999999": 5}))
    assert (err.body.get("param") if isinstance(err.body, dict) else None) == "logit_bias", err.body


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "pattern": "^[A-Z][a-z]{1,8}$"},
        "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"type": "integer", "minimum": -12, "maximum": 14}},
        "required": ["zone"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def _args_valid(call):
    schema = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]["function"]["parameters"]
    jsonschema.validate(json.loads(call.function.arguments), schema)


def test_named_tool_call(oai):
    r = oai.chat.completions.create(model=MODEL, messages=ASK, max_tokens=60, temperature=1.0, seed=4,
                                    tools=[WEATHER, TIME],
                                    tool_choice={"type": "function", "function": {"name": "get_weather"}})
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    (call,) = c.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function" and call.function.name == "get_weather"
    _args_valid(call)


def test_named_tool_call_streamed(oai):
    stream = oai.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=60, temperature=1.0, seed=4, stream=True,
        tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    name, call_id, args, reason, pieces = None, None, "", None, 0
    for chunk in stream:
        for c in chunk.choices:
            for tc in c.delta.tool_calls or ():
                assert tc.index == 0
                call_id = tc.id or call_id
                name = (tc.function.name if tc.function and tc.function.name else name)
                if tc.function and tc.function.arguments:
                    args += tc.function.arguments
                    pieces += 1
            reason = c.finish_reason or reason
    assert reason == "tool_calls" and name == "get_weather" and call_id.startswith("call_")
    assert pieces > 1  # the arguments came as they were generated
    jsonschema.validate(json.loads(args), WEATHER["function"]["parameters"])


@pytest.mark.parametrize("stream", [False, True])
def test_required_tool_calls(oai, stream):
    kw = dict(model=MODEL, messages=ASK, max_tokens=120, temperature=1.0, seed=7,
              tools=[WEATHER, TIME], tool_choice="required")
    if not stream:
        c = oai.chat.completions.create(**kw).choices[0]
        assert c.finish_reason == "tool_calls", c.message.content
        calls = c.message.tool_calls
    else:
        calls, reason = [], None
        for chunk in oai.chat.completions.create(stream=True, **kw):
            for c in chunk.choices:
                calls += c.delta.tool_calls or []
                reason = c.finish_reason or reason
        assert reason == "tool_calls"
    assert calls and len({c.id for c in calls}) == len(calls)
    for call in calls:
        _args_valid(call)


@pytest.mark.parametrize("kwargs, param", [
    (dict(tool_choice="auto"), "tool_choice"),
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": "x"}}]), "tools"),
    (dict(tools=[WEATHER], tool_choice="sometimes"), "tool_choice"),
    (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
    (dict(tool_choice="required"), "tool_choice"),
    (dict(tools=[{"type": "function", "function": {"parameters": {}}}], tool_choice="required"), "tools"),
    (dict(tools=[WEATHER], tool_choice="required", response_format={"type": "json_object"}), "tool_choice"),
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "nope"}}}}}], tool_choice="required"), "tools"),
])
def test_bad_tools_are_400(oai, kwargs, param):
    err = _bad(lambda: oai.chat.completions.create(model=MODEL, messages=ASK, max_tokens=5, **kwargs))
    body = err.body if isinstance(err.body, dict) else {}
    assert (body.get("param") or body.get("error", {}).get("param")) == param, err.body


def test_tool_choice_none_is_plain_text(oai):
    r = oai.chat.completions.create(model=MODEL, messages=ASK, max_tokens=5, temperature=0,
                                    tools=[WEATHER], tool_choice="none")
    assert r.choices[0].message.tool_calls is None and isinstance(r.choices[0].message.content, str)
