"""tool_choice "auto" through the real gateway and cluster (tiny-random), asked by the real
`openai` client. The tools reach the replica's chat template (the prompt grows by them); the
replies' `<tool_call>` blocks are parsed into `tool_calls`. tiny-random's weights are random,
so a `structured_outputs` regex makes the model write the blocks: the parse path then runs end
to end (replica text -> gateway parser -> OpenAI reply) on known text shapes, whole and
streamed, with n > 1. Tool-call history is accepted, and a bad one is a 400 naming the field.
`parallel_tool_calls: false` keeps "required" to one call."""

from __future__ import annotations

import json

import openai
import pytest

pytestmark = pytest.mark.timeout(300)

MODEL = "tiny-random"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "integer"}}}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL = r'<tool_call>\{"name": "get_weather", "arguments": \{"city": "[A-Z][a-z]{1,8}", "unit": "(c|f)"\}\}</tool_call>'
TIME_CALL = r'<tool_call>\{"name": "get_time", "arguments": \{"zone": [1-9]\}\}</tool_call>'


def _forced(regex: str, **kw) -> dict:
    return dict(model=MODEL, messages=ASK, tools=[WEATHER, TIME], temperature=1.0, seed=11,
                max_tokens=400, extra_body={"structured_outputs": {"regex": regex}}, **kw)


def _check_weather(call):
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    assert set(args) == {"city", "unit"} and args["unit"] in ("c", "f")


def test_tools_reach_the_template(oai):
    kw = dict(model=MODEL, messages=ASK, max_tokens=1, temperature=0)
    plain = oai.chat.completions.create(**kw).usage.prompt_tokens
    auto = oai.chat.completions.create(tools=[WEATHER], **kw).usage.prompt_tokens
    none = oai.chat.completions.create(tools=[WEATHER], tool_choice="none", **kw).usage.prompt_tokens
    assert auto > plain + 50 and none == plain


def test_a_forced_block_is_parsed_into_tool_calls(oai):
    r = oai.chat.completions.create(**_forced(CALL, n=2))
    assert len(r.choices) == 2
    for c in r.choices:
        assert c.finish_reason == "tool_calls" and c.message.content is None, c.message
        (call,) = c.message.tool_calls
        _check_weather(call)


def test_streamed_calls_per_choice(oai):
    calls: dict[int, list] = {0: [], 1: []}
    content = {0: "", 1: ""}
    reasons = {}
    for chunk in oai.chat.completions.create(stream=True, **_forced(rf"Sure\. {CALL}\n{TIME_CALL}", n=2)):
        for c in chunk.choices:
            content[c.index] += c.delta.content or ""
            for tc in c.delta.tool_calls or ():
                assert tc.id and tc.function.name and tc.function.arguments  # each call whole
                calls[c.index].append(tc)
            if c.finish_reason:
                reasons[c.index] = c.finish_reason
    assert reasons == {0: "tool_calls", 1: "tool_calls"}
    for i in (0, 1):
        assert content[i] == "Sure."
        assert [tc.index for tc in calls[i]] == [0, 1]
        _check_weather(calls[i][0])
        assert calls[i][1].function.name == "get_time"
        assert 1 <= json.loads(calls[i][1].function.arguments)["zone"] <= 9


def test_text_around_calls_unknown_tools_and_parallel_off(oai):
    other = r'<tool_call>\{"name": "nope", "arguments": \{\}\}</tool_call>'
    c = oai.chat.completions.create(**_forced(rf"On it: {CALL} {other} ok")).choices[0]
    assert c.finish_reason == "tool_calls"
    assert c.message.content == 'On it:  <tool_call>{"name": "nope", "arguments": {}}</tool_call> ok'
    _check_weather(c.message.tool_calls[0])
    c = oai.chat.completions.create(parallel_tool_calls=False, **_forced(f"{CALL}{TIME_CALL}")).choices[0]
    assert [t.function.name for t in c.message.tool_calls] == ["get_weather"]
    c = oai.chat.completions.create(**_forced(r"No tool needed\.")).choices[0]
    assert c.finish_reason == "stop" and c.message.content == "No tool needed."
    assert c.message.tool_calls is None


def test_tool_call_history_is_accepted(oai):
    first = oai.chat.completions.create(**_forced(CALL)).choices[0].message
    history = [*ASK, first, {"role": "tool", "tool_call_id": first.tool_calls[0].id,
                             "content": "18 C and sunny"}]
    r = oai.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER], max_tokens=3,
                                    temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    without = oai.chat.completions.create(model=MODEL, messages=history[:1], tools=[WEATHER],
                                          max_tokens=1, temperature=0)
    assert r.usage.prompt_tokens > without.usage.prompt_tokens + 20  # the call and result rendered


@pytest.mark.parametrize("messages, param", [
    ([{"role": "user", "content": "x", "tool_calls": []}], "messages.0.tool_calls"),
    ([*ASK, {"role": "assistant", "tool_calls": [{"id": "1", "type": "function",
                                                  "function": {"arguments": "{}"}}]}],
     "messages.1.tool_calls.0.function.name"),
    ([*ASK, {"role": "assistant", "tool_calls": [{"id": "1", "type": "function",
                                                  "function": {"name": "f", "arguments": {}}}]}],
     "messages.1.tool_calls.0.function.arguments"),
    ([*ASK, {"role": "tool", "tool_call_id": 3, "content": "x"}], "messages.1.tool_call_id"),
])
def test_bad_history_is_400_naming_the_field(oai, messages, param):
    with pytest.raises(openai.BadRequestError) as err:
        oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    body = err.value.body if isinstance(err.value.body, dict) else {}
    assert (body.get("param") or body.get("error", {}).get("param")) == param, err.value.body


def test_required_with_parallel_calls_off_makes_one_call(oai):
    zone = {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 14}},
        "required": ["zone"], "additionalProperties": False}}}
    kw = dict(model=MODEL, messages=ASK, tools=[zone], tool_choice="required", n=4,
              temperature=1.0, seed=5, max_tokens=200)
    free = oai.chat.completions.create(**kw).choices
    one = oai.chat.completions.create(parallel_tool_calls=False, **kw).choices
    assert max(len(c.message.tool_calls or []) for c in free) > 1  # the switch has work to do
    assert all(c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1 for c in one)
