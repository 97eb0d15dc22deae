"""Tools and tool-call history for chat templates that do not know them.

Owns: the Hermes/Qwen-style fallback. Many chat templates (SmolLM2's ChatML one among them)
ignore `tools` and cannot write an assistant turn's `tool_calls`. For those the replica says
it in text instead: the functions' signatures as JSON inside `<tools></tools>` and how to call
them (a JSON object `{"name", "arguments"}` inside `<tool_call></tool_call>`) in the first
system message (added if there is none); an assistant turn's calls as `<tool_call>` blocks
after its content; a tool turn's content inside `<tool_response></tool_response>`. The gateway
parses the same blocks out of the reply (gateway/tool_parser.py).
Also: the OpenAI message form for templates that do know tools (`template_messages`).
Never imports torch; never renders (worker/text/chat.py does).
"""

from __future__ import annotations

import json
from typing import Optional

TOOLS_INSTRUCTION = """\
# Tools

You can call functions to help answer the user. Their signatures, as JSON, are listed between \
<tools> and </tools>:
<tools>
{tools}
</tools>

To call a function, write a JSON object with the function's name and its arguments between \
<tool_call> and </tool_call>, one block per call:
<tool_call>
{{"name": "<function name>", "arguments": {{"<parameter>": <value>}}}}
</tool_call>
Write no other text around a call. When no function is needed, answer in plain text."""


def mentions(tokenizer, word: str) -> bool:
    """Whether the tokenizer's chat template (or one of its named templates) uses `word`."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        return any(word in t for t in template.values() if isinstance(t, str))
    return isinstance(template, str) and word in template


def _arguments(text: str):
    """A call's arguments as the map templates expect (OpenAI sends JSON text); text that is
    not a JSON object stays text."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return text
    return value if isinstance(value, dict) else text


def template_messages(messages: list[dict]) -> list[dict]:
    """Wire-form messages (`ChatMessage.to_dict()`: flat `tool_calls`) in the OpenAI form that
    tool-aware templates read, with each call's `arguments` as a map (as transformers documents
    and vLLM passes them)."""
    out = []
    for m in messages:
        m = dict(m)
        calls = m.get("tool_calls")
        if calls:
            m["tool_calls"] = [{"id": c.get("id", ""), "type": "function",
                                "function": {"name": c["name"],
                                             "arguments": _arguments(c.get("arguments", "{}"))}}
                               for c in calls]
        out.append(m)
    return out


def call_block(name: str, arguments: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": _arguments(arguments)},
                                        ensure_ascii=False) + "\n</tool_call>"


def history_as_text(messages: list[dict]) -> list[dict]:
    """Wire-form messages with tool calls and tool results written as text: an assistant turn's
    calls follow its content as `<tool_call>` blocks, a tool turn's content is wrapped in
    `<tool_response>`; roles are kept and only `role` and `content` remain."""
    out = []
    for m in messages:
        content = m.get("content") or ""
        if m.get("tool_calls"):
            blocks = [call_block(c["name"], c.get("arguments", "{}")) for c in m["tool_calls"]]
            content = "\n".join(([content] if content else []) + blocks)
        elif m["role"] == "tool":
            content = f"<tool_response>\n{content}\n</tool_response>"
        out.append({"role": m["role"], "content": content})
    return out


def with_tools_instruction(messages: list[dict], tools: list[dict]) -> list[dict]:
    """`messages` with the tools instruction at the end of the first system (or developer)
    message, or as a new first system message."""
    text = TOOLS_INSTRUCTION.format(
        tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
    if messages and messages[0]["role"] in ("system", "developer"):
        first = dict(messages[0])
        first["content"] = (first.get("content") or "") + "\n\n" + text
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def tool_turns_as_user(messages: list[dict]) -> Optional[list[dict]]:
    """For a template that refuses the role "tool": consecutive tool turns merged into one
    user turn (their `<tool_response>` blocks one after another, as Qwen's template writes
    them). None when there is no tool turn (nothing to change)."""
    if not any(m["role"] == "tool" for m in messages):
        return None
    out: list[dict] = []
    for m in messages:
        if m["role"] == "tool" and out and out[-1].get("_tool"):
            out[-1]["content"] += "\n" + m["content"]
        elif m["role"] == "tool":
            out.append({"role": "user", "content": m["content"], "_tool": True})
        else:
            out.append(m)
    return [{k: v for k, v in m.items() if k != "_tool"} for m in out]
