"""protocol/chat.py on the wire: tools and tool-call history in SUBMIT and DISPATCH survive the
codec, bad shapes are refused naming the field (a `ProtocolError` from a peer, an
`InvalidRequestError` from a user's OpenAI-form input), and the client refuses them before
anything is sent."""

from __future__ import annotations

import json

import pytest

from infer_cluster.client import InferenceClient
from infer_cluster.protocol import InvalidRequestError, ProtocolError
from infer_cluster.protocol import codec
from infer_cluster.protocol.chat import (ChatTool, ToolCall, messages_from_openai,
                                         tools_from_openai)
from infer_cluster.protocol.messages import ChatMessage, DispatchRequest, SubmitRequest

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
]


def test_openai_forms_round_trip_through_submit_and_dispatch():
    messages, tools = messages_from_openai(HISTORY), tools_from_openai([WEATHER])
    assert messages[1] == ChatMessage(role="assistant", content="", tool_calls=[
        ToolCall(id="call_1", name="get_weather", arguments='{"city": "Paris"}')])
    assert messages[2].tool_call_id == "call_1" and messages[0].tool_calls is None
    sub = codec.decode(codec.encode(SubmitRequest(request_id="r", messages=messages, tools=tools)))
    assert sub.messages == messages and sub.tools == tools
    disp = codec.decode(codec.encode(DispatchRequest(request_id="1.0", messages=sub.messages,
                                                     tools=sub.tools)))
    assert [t.to_openai() for t in disp.tools] == [WEATHER]
    assert disp.messages[1].tool_calls[0].to_openai() == HISTORY[1]["tool_calls"][0]
    # plain turns keep their old wire form (no new keys), and a request without tools has none
    assert messages[0].to_dict() == {"role": "user", "content": "Weather in Paris?"}
    assert "tools" not in SubmitRequest(request_id="r", messages=messages).to_wire()


def _wire(**fields):
    return {**SubmitRequest(request_id="r", messages=[ChatMessage(role="user", content="x")]).to_wire(),
            **fields}


@pytest.mark.parametrize("fields, match", [
    (dict(tools=[{"name": "f", "parameters": "not json"}]), r"tools\[0\]\.parameters"),
    (dict(tools=[{"name": "f", "parameters": "[1]"}]), r"tools\[0\]\.parameters .*object"),
    (dict(tools=[{"description": "no name"}]), r"tools\[0\].*'name'"),
    (dict(tools=[{"name": "f"}] * 129), r"tools has 129 items"),
    (dict(tools={"name": "f"}), r"tools must be a list"),
    (dict(messages=[{"role": "assistant", "tool_calls": [{"arguments": "{}"}]}]),
     r"messages\[0\]\.tool_calls\[0\].*'name'"),
    (dict(messages=[{"role": "assistant", "tool_calls": [{"name": "f", "arguments": {}}]}]),
     r"messages\[0\]\.tool_calls\[0\]\.arguments must be a string"),
    (dict(messages=[{"role": "user", "content": "x", "tool_calls": [{"name": "f"}]}]),
     "only assistant messages"),
    (dict(messages=[{"role": "tool", "content": "x", "tool_call_id": 7}]),
     r"messages\[0\]\.tool_call_id must be a string"),
    (dict(messages=None, prompt="x", tools=[{"name": "f"}]), "tools are for chat requests"),
])
def test_bad_wire_shapes_name_the_field(fields, match):
    with pytest.raises(ProtocolError, match=match):
        SubmitRequest.from_wire(_wire(**fields))


def test_deep_parameters_text_is_refused_not_a_crash():
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(ProtocolError, match=r"parameters"):
        SubmitRequest.from_wire(_wire(tools=[{"name": "f", "parameters": deep}]))


@pytest.mark.parametrize("messages, tools, match, param", [
    ([{"role": "user", "content": "x", "tool_calls": []}], None, r"messages\[0\]\.tool_calls", "messages"),
    ([{"role": "assistant", "tool_calls": [{"type": "function", "function": {"arguments": "{}"}}]}],
     None, r"messages\[0\]\.tool_calls\[0\]\.function\.name must be a string", "messages"),
    ([{"role": "assistant", "tool_calls": [{"function": {"name": "f"}, "extra": 1}]}], None,
     "unknown key", "messages"),
    ([{"role": "user", "content": "x", "name": "bob"}], None, r"messages\[0\] must be a map", "messages"),
    ([{"role": "user", "content": "x"}], [{"type": "function", "function": {"name": ""}}],
     r"tools\[0\]\.function\.name must have 1\.\.", "tools"),
    ([{"role": "user", "content": "x"}], [{"type": "retrieval"}], r"tools\[0\] must be", "tools"),
    ([{"role": "user", "content": "x"}],
     [{"type": "function", "function": {"name": "f", "parameters": "[]"}}],
     r"tools\[0\]\.function\.parameters must be a JSON object", "tools"),
])
def test_bad_openai_forms_name_the_field(messages, tools, match, param):
    with pytest.raises(InvalidRequestError, match=match) as err:
        messages_from_openai(messages)
        tools_from_openai(tools)
    assert err.value.param == param


def test_arguments_may_be_a_map_and_tools_keep_their_schema():
    (m,) = messages_from_openai([{"role": "assistant", "tool_calls": [
        {"function": {"name": "f", "arguments": {"a": [1, 2]}}}]}])
    assert json.loads(m.tool_calls[0].arguments) == {"a": [1, 2]} and m.tool_calls[0].id == ""
    (t,) = tools_from_openai([{"type": "function", "function": {"name": "f"}}])
    assert t == ChatTool(name="f") and t.to_openai()["function"]["parameters"]["type"] == "object"
    assert tools_from_openai([]) is None and tools_from_openai(None) is None


def test_client_refuses_bad_tools_before_sending():
    # nothing listens there: a refusal that reached the socket would wait for connect_timeout
    with InferenceClient("tcp://127.0.0.1:9", connect_timeout=30.0) as client:
        with pytest.raises(InvalidRequestError, match=r"tools\[0\]\.function\.parameters"):
            client.chat([{"role": "user", "content": "x"}],
                        tools=[{"type": "function", "function": {"name": "f", "parameters": 3}}])
        with pytest.raises(InvalidRequestError, match="tools are for chat requests"):
            client._submit("x", None, None, 0, None, None, tools=[WEATHER])
        assert client.num_in_flight == 0
