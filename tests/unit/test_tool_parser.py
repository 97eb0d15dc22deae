"""gateway/tool_parser.py: `<tool_call>` blocks out of free text, whole and streamed. The
streamed result, split at every character boundary of each sample (and fed a character at a
time), must equal the whole one: same content and calls. Content once sent is never taken
back, so that equality also says no part of a call went out as content."""

from __future__ import annotations

import json

import pytest

from infer_cluster.gateway.tool_parser import ToolCallParser, parse_tool_calls

NAMES = {"get_weather", "get_time"}
WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}'
TIME = '{"name": "get_time", "arguments": {"zone": 2}}'


def _calls(calls):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def _streamed(text: str, cuts, parallel: bool = True):
    parser = ToolCallParser(NAMES, parallel)
    content, calls = "", []
    bounds = [0, *cuts, len(text)]
    for a, b in zip(bounds, bounds[1:]):
        got, new = parser.feed(text[a:b])
        content += got
        calls += new
    got, new = parser.finish()
    content += got
    calls += new
    return content or None, calls


SAMPLES = {
    "plain": ("Hello there, how can I help?", "Hello there, how can I help?", []),
    "one call": (f"<tool_call>\n{WEATHER}\n</tool_call>", None,
                 [("get_weather", {"city": "Paris", "unit": "c"})]),
    "text around": (f"Let me check.\n<tool_call>{WEATHER}</tool_call>\nDone.",
                    "Let me check.\n\nDone.", [("get_weather", {"city": "Paris", "unit": "c"})]),
    "two calls": (f"<tool_call>{WEATHER}</tool_call>\n<tool_call>{TIME}</tool_call>\n", None,
                  [("get_weather", {"city": "Paris", "unit": "c"}), ("get_time", {"zone": 2})]),
    "no closing tag": (f"  <tool_call>\n{TIME}\n", None, [("get_time", {"zone": 2})]),
    "unknown tool": ('<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
                     '<tool_call>{"name": "nope", "arguments": {}}</tool_call>', []),
    "broken json": (f'Hi <tool_call>{{"name": "get_time", "arguments": {{</tool_call> {TIME}',
                    f'Hi <tool_call>{{"name": "get_time", "arguments": {{</tool_call> {TIME}', []),
    "cut json at the end": ('x <tool_call>{"name": "get_time", "argu',
                            'x <tool_call>{"name": "get_time", "argu', []),
    "tag-like text": ("a <tool and <tool_ca but no call <", "a <tool and <tool_ca but no call <", []),
    "whitespace only": ("  \n ", "  \n ", []),
    "arguments as text": ('<tool_call>{"name": "get_time", "arguments": "{\\"zone\\": 1}"}</tool_call>',
                          None, [("get_time", {"zone": 1})]),
}


@pytest.mark.parametrize("name", list(SAMPLES))
def test_whole_reply(name):
    text, content, calls = SAMPLES[name]
    got_content, got_calls = parse_tool_calls(text, NAMES)
    assert got_content == content
    assert _calls(got_calls) == calls
    for c in got_calls:
        assert c["id"].startswith("call_") and c["type"] == "function"
        assert isinstance(c["function"]["arguments"], str)
    assert len({c["id"] for c in got_calls}) == len(got_calls)


@pytest.mark.parametrize("name", list(SAMPLES))
def test_streamed_split_anywhere_equals_whole(name):
    text, content, calls = SAMPLES[name]
    for cut in range(len(text) + 1):
        got_content, got_calls = _streamed(text, [cut])
        assert (got_content, _calls(got_calls)) == (content, calls), cut
    got_content, got_calls = _streamed(text, range(1, len(text)))
    assert (got_content, _calls(got_calls)) == (content, calls)
    assert [c["index"] for c in got_calls] == list(range(len(calls)))


def test_content_is_sent_before_the_call_and_held_while_it_may_be_a_tag():
    parser = ToolCallParser(NAMES)
    assert parser.feed("Sure, ") == ("Sure,", [])  # the space waits for what follows
    assert parser.feed("let me <tool") == (" let me", [])
    assert parser.feed("_call>{") == ("", [])
    content, calls = parser.feed(TIME[1:] + "</tool_call>")
    assert content == "" and _calls(calls) == [("get_time", {"zone": 2})] and calls[0]["index"] == 0
    assert parser.finish() == ("", [])
    not_a_tag = ToolCallParser(NAMES)
    assert not_a_tag.feed("1 <tool") == ("1", [])
    assert not_a_tag.feed("s are fine") == (" <tools are fine", [])


def test_parallel_off_keeps_the_first_call_only():
    text = f"<tool_call>{WEATHER}</tool_call><tool_call>{TIME}</tool_call>"
    content, calls = parse_tool_calls(text, NAMES, parallel=False)
    assert content is None and _calls(calls) == [("get_weather", {"city": "Paris", "unit": "c"})]
    _, streamed = _streamed(text, range(3, len(text), 7), parallel=False)
    assert _calls(streamed) == _calls(calls)


def test_a_call_that_is_not_an_object_or_has_bad_arguments_stays_text():
    for body in ('["get_time"]', '{"name": "get_time", "arguments": [1]}',
                 '{"name": "get_time", "arguments": "not json"}', '{"arguments": {}}', ""):
        text = f"<tool_call>{body}</tool_call>"
        assert parse_tool_calls(text, NAMES) == (text, []), body
