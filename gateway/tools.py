"""Tool calls over /v1/chat/completions: `tools` with `tool_choice` "auto" (the default when
tools are given), "required", a named function, or "none".

Owns: checking `tools`, `tool_choice` and `parallel_tool_calls`, and what each choice makes of
the request and its reply (`ToolPlan`):
- "auto": the tools travel to the replica with the messages (`ChatTool`s on the wire), which
  renders them into the chat template, or into a system instruction where the template ignores
  them (worker/text/tool_prompt.py). The model decides; its `<tool_call>` blocks are parsed
  out of the text (`tool_parser.py`). A constraint of the request's own (`structured_outputs`,
  `response_format`, `guided_*`) still applies to the text.
- "required" / a named function: the output is constrained to the calls' JSON (through
  `SamplingParams.structured_outputs`, so the grammar guarantees valid arguments) and turned
  into OpenAI's `message.tool_calls` (ids `call_...`, finish_reason `"tool_calls"`), whole or as
  streamed tool-call deltas. The template is not given the tools. A named function's output is
  its arguments object; "required"'s is a JSON array of `{"name", "arguments"}` objects, one per
  call (`minItems` 1, `maxItems` 1 when `parallel_tool_calls` is false), each arguments object
  valid for its function's `parameters` schema.
- "none" (or no tools): plain text; the template is not given the tools.
Never imports torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Optional

from infer_cluster.protocol import InvalidRequestError, StructuredOutputsParams
from infer_cluster.protocol.chat import tools_from_openai

from .errors import APIError
from .tool_parser import call_id

_ANY_OBJECT = {"type": "object"}


def _bad(field_name: str, why: str) -> APIError:
    return APIError(f"{field_name}: {why}", "invalid_request", field_name)


@dataclass
class ToolPlan:
    """What the reply may or must be. `name`: the named function (None for "required" and
    "auto"); `constraint`: the forced calls' JSON (None for "auto"); `names`: the functions a
    call may name; `tools`: what the replica's template gets ("auto" only); `parallel`: more
    than one call per reply."""

    name: Optional[str]
    constraint: Optional[StructuredOutputsParams]
    names: list = field(default_factory=list)
    tools: Optional[list] = None
    parallel: bool = True

    @property
    def is_auto(self) -> bool:
        return self.constraint is None

    def calls(self, text: str) -> Optional[list[dict]]:
        """The output as OpenAI tool calls, or None when it is not a complete call (a reply cut
        by max_tokens): the caller then returns it as text."""
        try:
            value = json.loads(text)
        except ValueError:
            return None
        if self.name is not None:
            return [_call(self.name, value)] if isinstance(value, dict) else None
        if not isinstance(value, list) or not value:
            return None
        out = []
        for item in value:
            if not isinstance(item, dict) or item.get("name") not in self.names:
                return None
            out.append(_call(item["name"], item.get("arguments", {})))
        return out


def _call(name: str, arguments) -> dict:
    return {"id": call_id(), "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}


def _functions(tools) -> dict:
    """name -> parameters schema; a 400 naming `tools` for a malformed entry."""
    if not isinstance(tools, list) or not tools:
        raise _bad("tools", "must be a non-empty list of {\"type\": \"function\", \"function\": {...}}")
    out = {}
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(fn, dict):
            raise _bad("tools", f"tool {i} must be {{\"type\": \"function\", \"function\": {{\"name\", "
                                f"\"parameters\"}}}}")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise _bad("tools", f"tool {i} has no function name")
        params = fn.get("parameters", _ANY_OBJECT)
        if not isinstance(params, dict):
            raise _bad("tools", f"function {name!r}: parameters must be a JSON schema object")
        out[name] = params or _ANY_OBJECT
    return out


def tool_plan(req) -> Optional[ToolPlan]:
    """The request's tool plan, or None (no tools, or tool_choice "none"); raises `APIError`
    (400) naming `tools` or `tool_choice`."""
    choice = req.tool_choice
    if not req.tools:
        if choice not in (None, "none"):
            raise _bad("tool_choice", "needs tools")
        return None
    if choice == "none":
        return None
    functions = _functions(req.tools)
    parallel = req.parallel_tool_calls is not False
    if choice is None or choice == "auto":
        try:
            tools = tools_from_openai(req.tools)
        except InvalidRequestError as exc:
            raise _bad("tools", exc.message) from None
        return ToolPlan(None, None, list(functions), tools, parallel)
    if choice == "required":
        items = [{"type": "object", "properties": {"name": {"const": n}, "arguments": p},
                  "required": ["name", "arguments"], "additionalProperties": False}
                 for n, p in functions.items()]
        schema = {"type": "array", "minItems": 1,
                  "items": items[0] if len(items) == 1 else {"anyOf": items}}
        if not parallel:
            schema["maxItems"] = 1
        return ToolPlan(None, _constraint(schema), list(functions), parallel=parallel)
    if isinstance(choice, dict):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if choice.get("type", "function") != "function" or not isinstance(name, str):
            raise _bad("tool_choice", 'a named choice is {"type": "function", "function": {"name": ...}}')
        if name not in functions:
            raise _bad("tool_choice", f"names function {name!r}, which tools does not define")
        return ToolPlan(name, _constraint(functions[name]), [name])
    raise _bad("tool_choice", f'must be "none", "auto", "required" or a named function, '
                              f'got {choice!r}')


def _constraint(schema: dict) -> StructuredOutputsParams:
    try:
        return StructuredOutputsParams(json=schema)
    except Exception as exc:  # InvalidRequestError: a schema too large or not JSON
        raise _bad("tools", str(exc)) from None


class ToolStream:
    """One streamed choice's tool-call deltas. A named function streams its arguments as they
    come (the first delta names the call); "required" holds the array back and sends its calls
    whole with the final chunk (a partial array is not a call yet)."""

    def __init__(self, plan: ToolPlan):
        self.plan = plan
        self.text = ""
        self.call_id = call_id()
        self.started = False

    def delta(self, text: str, final: bool, finished_ok: bool) -> Optional[list[dict]]:
        """The `tool_calls` list of this chunk's delta (None: nothing to send yet)."""
        self.text += text
        if self.plan.name is not None:
            if not self.started:
                self.started = True
                return [{"index": 0, "id": self.call_id, "type": "function",
                         "function": {"name": self.plan.name, "arguments": text}}]
            return [{"index": 0, "function": {"arguments": text}}] if text else None
        if not final or not finished_ok:
            return None
        calls = self.plan.calls(self.text) or []
        return [{"index": i, **c} for i, c in enumerate(calls)] or None
