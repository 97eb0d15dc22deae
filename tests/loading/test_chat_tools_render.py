"""Tools and tool-call history through the replica's chat rendering (worker/text/chat.py):
SmolLM2-135M-Instruct's real tokenizer, whose ChatML template ignores `tools`, gets them as a
system instruction and its history as `<tool_call>` / `<tool_response>` text; a small tokenizer
whose template uses `tools` gets them, and the structured history, as they are; a template that
refuses the role "tool" gets tool results as a user turn. The replica's own path (a DISPATCH
decoded from the wire) renders the same ids."""

from __future__ import annotations

import json

import pytest

from infer_cluster.protocol import InvalidRequestError, codec
from infer_cluster.protocol.chat import messages_from_openai, tools_from_openai
from infer_cluster.protocol.messages import DispatchRequest
from infer_cluster.worker.text.chat import prompt_of, render_chat

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
HISTORY = ASK + [
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
]


def render(tok, messages, tools=None) -> str:
    wire_tools = tools_from_openai(tools)
    ids = render_chat(tok, [m.to_dict() for m in messages_from_openai(messages)],
                      [t.to_openai() for t in wire_tools] if wire_tools else None)
    return tok.decode(ids)


@pytest.fixture(scope="module")
def smollm2_tokenizer(hf_smollm2_tokenizer):
    tok = hf_smollm2_tokenizer
    assert "tools" not in tok.chat_template and "tool_calls" not in tok.chat_template
    return tok


def test_smollm2_gets_the_tools_as_a_system_instruction(smollm2_tokenizer):
    tok = smollm2_tokenizer
    plain = render(tok, ASK)
    assert plain.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    text = render(tok, ASK, [WEATHER])
    assert text.startswith("<|im_start|>system\n") and "named SmolLM" not in text
    assert f"<tools>\n{json.dumps(WEATHER)}\n</tools>" in text
    assert "<tool_call>" in text and '"arguments"' in text
    assert text.endswith("<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n")
    merged = render(tok, [{"role": "system", "content": "Be brief."}, *ASK], [WEATHER])
    assert merged.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert merged.count("<|im_start|>system") == 1 and f"{json.dumps(WEATHER)}" in merged


def test_smollm2_renders_tool_call_history_as_text(smollm2_tokenizer):
    tok = smollm2_tokenizer
    for tools in ([WEATHER], None):  # also without tools (tool_choice "none" on a later turn)
        text = render(tok, HISTORY, tools)
        assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
                '{"city": "Paris"}}\n</tool_call><|im_end|>\n') in text
        assert "<|im_start|>tool\n<tool_response>\n18 C, sunny\n</tool_response><|im_end|>\n" in text
        assert text.endswith("<|im_start|>assistant\n")
    both = render(tok, [*ASK, {"role": "assistant", "content": "Checking.", "tool_calls":
                               HISTORY[1]["tool_calls"] * 2}])
    assert "<|im_start|>assistant\nChecking.\n<tool_call>\n" in both and both.count("</tool_call>") == 2


def test_the_replica_path_renders_the_same(smollm2_tokenizer):
    tok = smollm2_tokenizer
    msg = codec.decode(codec.encode(DispatchRequest(
        request_id="1.0", messages=messages_from_openai(HISTORY), tools=tools_from_openai([WEATHER]))))
    assert tok.decode(prompt_of(msg, tok)) == render(tok, HISTORY, [WEATHER])
    assert len(prompt_of(msg, tok)) > len(tok.encode(render(tok, HISTORY), add_special_tokens=False))


TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTOOLS:{% for t in tools %} {{ t.function.name }}"
    "={{ t.function.parameters | tojson }}{% endfor %}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}CALL {{ c.id }} {{ c.function.name }} "
    "{{ c.function.arguments | tojson }}{% endfor %}{% else %}{{ m.content }}{% endif %}"
    "{%- if m.role == 'tool' %} FOR {{ m.tool_call_id }}{% endif %}<|im_end|>\n{% endfor %}"
    "{{ '<|im_start|>assistant\n' }}")
NO_TOOL_ROLE = (
    "{% for m in messages %}{% if m.role not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('roles are system, user and assistant') }}{% endif %}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{{ '<|im_start|>assistant\n' }}")


@pytest.fixture(scope="module")
def small_tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    from infer_cluster.worker.loading.embedded import build_tokenizer
    path = tmp_path_factory.mktemp("tok")
    build_tokenizer(path)
    return AutoTokenizer.from_pretrained(path)


def test_a_template_that_uses_tools_gets_them_as_they_are(small_tokenizer):
    tok = small_tokenizer
    tok.chat_template = TOOL_TEMPLATE
    text = render(tok, HISTORY, [WEATHER])
    params = json.dumps(WEATHER["function"]["parameters"])
    assert text.startswith(f"<|im_start|>system\nTOOLS: get_weather={params}<|im_end|>\n")
    # arguments reach the template as a map (tojson writes an object, not a quoted string)
    assert '<|im_start|>assistant\nCALL call_1 get_weather {"city": "Paris"}<|im_end|>' in text
    assert "<|im_start|>tool\n18 C, sunny FOR call_1<|im_end|>" in text
    assert "<tool_call>" not in text and "# Tools" not in text
    assert not render(tok, ASK).startswith("<|im_start|>system")  # no tools: none given


def test_a_template_without_a_tool_role_gets_the_results_as_a_user_turn(small_tokenizer):
    tok = small_tokenizer
    tok.chat_template = NO_TOOL_ROLE
    second = {"role": "tool", "tool_call_id": "call_2", "content": "rain"}
    text = render(tok, [*HISTORY, second], [WEATHER])
    assert ("<|im_start|>user\n<tool_response>\n18 C, sunny\n</tool_response>\n"
            "<tool_response>\nrain\n</tool_response><|im_end|>\n<|im_start|>assistant\n") in text
    assert "<|im_start|>tool" not in text and "<tools>" in text
    tok.chat_template = "{{ raise_exception('never') }}"
    with pytest.raises(InvalidRequestError, match="rejected the messages: never"):
        render(tok, HISTORY, [WEATHER])


def test_several_chats_tokenize_in_one_batch_as_each_alone(smollm2_tokenizer):
    """`render_chats` (LLM.chat's path) tokenizes all conversations in one batch call; the ids
    are each conversation's own `render_chat`, with tools and history too."""
    from infer_cluster.worker.text.chat import render_chats
    convs = [ASK, HISTORY, [{"role": "system", "content": "Be brief."},
                            {"role": "user", "content": "Rewrite: the cat sat on the mat. " * 40}]]
    wire = [[m.to_dict() for m in messages_from_openai(c)] for c in convs]
    tools = [WEATHER]
    for t in (None, tools):
        alone = [render_chat(smollm2_tokenizer, w, t) for w in wire]
        assert render_chats(smollm2_tokenizer, wire, t) == alone
    with pytest.raises(InvalidRequestError, match="chat template"):
        render_chats(type("NoTemplate", (), {"chat_template": None})(), wire)
