"""Chat conversations on the wire: the turns (`ChatMessage`), the tool calls an assistant turn
made (`ToolCall`), and the tools a request offers the model (`ChatTool`).

Owns: their shapes and size limits, and the conversion from OpenAI's dict forms (a user's
`messages` and `tools`) into these structs, where each fault is an `InvalidRequestError` naming
the field (`messages[2].tool_calls[0].name`, `tools[1].function.parameters`). Only the replica
renders a conversation (it has the tokenizer); `to_openai` gives it back the OpenAI form the chat
templates read. Never imports torch, never pickles.

A tool's `parameters` schema and a call's `arguments` travel as JSON text, so the wire maps stay
shallow whatever the schema's depth (as `StructuredOutputsParams.json` does).
To extend: add a field with a default here, read it in `from_openai`, write it in `to_openai`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from .errors import InvalidRequestError, ProtocolError
from .fields import (MAX_ID_CHARS, MAX_NAME_CHARS, MAX_TEXT_CHARS, Struct, list_of, optional,
                     string, struct, wire, _w)
from .structured import MAX_SPEC_CHARS

MAX_CHAT_MESSAGES = 4096
MAX_TOOLS = 128            # OpenAI's limit on a request's tools
MAX_TOOL_CALLS = 128       # calls in one assistant turn
MAX_DESCRIPTION_CHARS = 64 * 1024


def json_object_text(max_len: int = MAX_SPEC_CHARS):
    """A checker: JSON text of an object (a map), at most `max_len` characters."""
    check_string = string(max_len)

    def check(value, where):
        check_string(value, where)
        try:
            parsed = json.loads(value)
        except (ValueError, RecursionError):
            raise ProtocolError(f"{_w(where)} must be JSON text of an object; it is not JSON") from None
        if not isinstance(parsed, dict):
            raise ProtocolError(f"{_w(where)} must be JSON text of an object, got a "
                                f"{type(parsed).__name__}")
        return value
    return check


@dataclass(kw_only=True)
class ToolCall(Struct):
    """One function call of an assistant turn; `arguments` is JSON text, as OpenAI sends it."""

    id: str = wire(string(MAX_ID_CHARS), default="")
    name: str = wire(string(MAX_NAME_CHARS, min_len=1))
    arguments: str = wire(string(MAX_SPEC_CHARS), default="{}")

    def to_openai(self) -> dict:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(kw_only=True)
class ChatMessage(Struct):
    """One turn of a chat request; the replica renders the list with its tokenizer's chat
    template (only the replica has the tokenizer). `tool_calls`: the calls an assistant turn
    made; `tool_call_id`: the call a `tool` turn answers."""

    role: str = wire(string(64, min_len=1))
    content: str = wire(string(MAX_TEXT_CHARS), default="")
    tool_calls: Optional[list] = wire(optional(list_of(struct(ToolCall), MAX_TOOL_CALLS)),
                                      default=None)
    tool_call_id: Optional[str] = wire(optional(string(MAX_ID_CHARS)), default=None)

    def validate(self) -> None:
        if self.tool_calls is not None and self.role != "assistant":
            raise ProtocolError(f"a {self.role!r} message carries tool_calls; only assistant "
                                "messages do")


@dataclass(kw_only=True)
class ChatTool(Struct):
    """A function the model may call: its name, description and `parameters` JSON schema (as
    JSON text of an object)."""

    name: str = wire(string(MAX_NAME_CHARS, min_len=1))
    description: str = wire(string(MAX_DESCRIPTION_CHARS), default="")
    parameters: str = wire(json_object_text(), default='{"type": "object", "properties": {}}')

    def to_openai(self) -> dict:
        """OpenAI's `{"type": "function", "function": {...}}`, as chat templates read it."""
        fn: dict[str, Any] = {"name": self.name}
        if self.description:
            fn["description"] = self.description
        fn["parameters"] = json.loads(self.parameters)
        return {"type": "function", "function": fn}


# ----------------------------------------------------------------- from OpenAI's dict forms

def _bad(where: str, why: str) -> InvalidRequestError:
    return InvalidRequestError(f"{where} {why}", param=where.split("[", 1)[0])


def _text(value, where: str, max_len: int, min_len: int = 0) -> str:
    if not isinstance(value, str):
        raise _bad(where, f"must be a string, got {'null' if value is None else type(value).__name__}")
    if not min_len <= len(value) <= max_len:
        raise _bad(where, f"must have {min_len}..{max_len} characters, got {len(value)}")
    return value


def _json_text(value, where: str, need_object: bool) -> str:
    """A map (dumped to JSON text) or JSON text; `need_object`: the text must parse to a map."""
    if isinstance(value, dict):
        try:
            value = json.dumps(value, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise _bad(where, f"is not JSON-serialisable: {exc}") from None
    value = _text(value, where, MAX_SPEC_CHARS)
    if need_object:
        try:
            parsed = json.loads(value)
        except (ValueError, RecursionError):
            raise _bad(where, "is not valid JSON") from None
        if not isinstance(parsed, dict):
            raise _bad(where, "must be a JSON object")
    return value


def tool_call_from_openai(call, where: str) -> ToolCall:
    """`{"id", "type": "function", "function": {"name", "arguments"}}`; arguments as JSON text
    (OpenAI's form) or a map."""
    if isinstance(call, ToolCall):
        return call
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or call.get("type", "function") != "function":
        raise _bad(where, 'must be {"id", "type": "function", "function": {"name", "arguments"}}')
    unknown = sorted(set(call) - {"id", "type", "function"}) + sorted(set(fn) - {"name", "arguments"})
    if unknown:
        raise _bad(where, f"has unknown key(s) {', '.join(map(str, unknown))}")
    return ToolCall(id=_text(call.get("id", ""), f"{where}.id", MAX_ID_CHARS),
                    name=_text(fn.get("name"), f"{where}.function.name", MAX_NAME_CHARS, 1),
                    arguments=_json_text(fn.get("arguments", "{}"), f"{where}.function.arguments",
                                         need_object=False))


def message_from_openai(m, where: str) -> ChatMessage:
    """One OpenAI chat message (`role`, `content`, and `tool_calls` / `tool_call_id`) as a
    `ChatMessage`; `content` may be null when the turn has tool calls."""
    if isinstance(m, ChatMessage):
        return m
    if not isinstance(m, dict) or set(m) - {"role", "content", "tool_calls", "tool_call_id"}:
        raise _bad(where, f"must be a map with the keys 'role' and 'content' (and "
                   f"'tool_calls' or 'tool_call_id'), got {m!r:.200}")
    role = _text(m.get("role"), f"{where}.role", 64, 1)
    content = m.get("content", "")
    calls = m.get("tool_calls")
    if content is None and calls:
        content = ""
    content = _text(content, f"{where}.content", MAX_TEXT_CHARS)
    tool_calls = None
    if calls is not None:
        if role != "assistant":
            raise _bad(f"{where}.tool_calls", f"is only allowed on assistant messages, not {role!r}")
        if not isinstance(calls, (list, tuple)) or len(calls) > MAX_TOOL_CALLS:
            raise _bad(f"{where}.tool_calls", f"must be a list of at most {MAX_TOOL_CALLS} calls")
        tool_calls = [tool_call_from_openai(c, f"{where}.tool_calls[{i}]") for i, c in enumerate(calls)]
    call_id = m.get("tool_call_id")
    if call_id is not None:
        call_id = _text(call_id, f"{where}.tool_call_id", MAX_ID_CHARS)
    return ChatMessage(role=role, content=content, tool_calls=tool_calls or None,
                       tool_call_id=call_id)


def messages_from_openai(messages) -> list[ChatMessage]:
    if not isinstance(messages, (list, tuple)) or not messages:
        raise InvalidRequestError("messages must be a non-empty list of {role, content} maps",
                                  param="messages")
    if len(messages) > MAX_CHAT_MESSAGES:
        raise InvalidRequestError(f"messages has {len(messages)} turns; at most {MAX_CHAT_MESSAGES}",
                                  param="messages")
    return [message_from_openai(m, f"messages[{i}]") for i, m in enumerate(messages)]


def tools_from_openai(tools) -> Optional[list[ChatTool]]:
    """OpenAI's `tools` (`[{"type": "function", "function": {"name", "description",
    "parameters"}}]`) as `ChatTool`s; None or an empty list is None."""
    if tools is None:
        return None
    if not isinstance(tools, (list, tuple)) or len(tools) > MAX_TOOLS:
        raise InvalidRequestError(f"tools must be a list of at most {MAX_TOOLS} "
                                  '{"type": "function", "function": {...}} maps', param="tools")
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if isinstance(tool, ChatTool):
            out.append(tool)
            continue
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or tool.get("type", "function") != "function":
            raise _bad(where, 'must be {"type": "function", "function": {"name", "description", '
                       '"parameters"}}')
        description = fn.get("description")
        out.append(ChatTool(
            name=_text(fn.get("name"), f"{where}.function.name", MAX_NAME_CHARS, 1),
            description=_text(description, f"{where}.function.description",
                              MAX_DESCRIPTION_CHARS) if description is not None else "",
            parameters=_json_text(fn.get("parameters") or {"type": "object", "properties": {}},
                                  f"{where}.function.parameters", need_object=True)))
    return out or None
