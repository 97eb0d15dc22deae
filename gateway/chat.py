"""`POST /v1/chat/completions`: a conversation in, the assistant's reply out.

Owns: the route and the chat response / chunk shapes. The messages (and, for tool_choice
"auto", the tools) travel to the replica, which renders them with its model's chat template
(`worker/text/chat.py`); a model without one ends the request with `invalid_request`, which
reaches the caller as a 400. What `tools` does to the request and the reply is `tools.py`'s;
the calls of an "auto" reply are parsed out of its text by `tool_parser.py`. Never imports
torch.
"""

from __future__ import annotations

import time
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import Response

from .errors import json_reply
from .generation import Generation, openai_finish_reason
from .logprobs import chat_logprobs
from .params import chat_messages, chat_params, per_choice
from .schemas import (ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest,
                      ChatCompletionResponse, ChatDelta, ChatMessageOut)
from .sse import ChunkFormat, EventStream, event_json
from .structured import param_names as structured_param_names
from .tool_parser import ToolCallParser, parse_tool_calls
from .tools import ToolStream, tool_plan

router = APIRouter()


@router.post("/v1/chat/completions", response_model=None)
async def create_chat_completion(body: ChatCompletionRequest, request: Request):
    return await reply(body, request.app.state, request.receive)


async def reply(body: ChatCompletionRequest, state, receive):
    """The reply (an ASGI response) to a validated request; raises `APIError`. Shared by the
    FastAPI route and the lean ASGI path (`fastpath.py`); `state` is the app's state, `receive`
    the ASGI receive callable (to notice a client that goes away)."""
    backend, metrics, config = state.backend, state.metrics, state.config
    model = backend.check_can_serve(body.model)
    params = chat_params(body, config.max_n, backend.max_model_len)
    plan = tool_plan(body)  # checked by chat_params already
    forced = plan is not None and not plan.is_auto
    names = {"structured_outputs.json": "tools"} if forced else structured_param_names(body)
    response_id = f"chatcmpl-{uuid.uuid4().hex}"
    cap = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    gen = Generation.prepare(backend, metrics, [chat_messages(body)], per_choice(params, body.n),
                             body.n, stream=body.stream, chat=True, response_id=response_id,
                             param_names={"prompt": "messages", "max_tokens": cap,
                                          **names},
                             tools=plan.tools if plan is not None else None)
    created = int(time.time())
    if body.stream:  # submitted by the response itself (`EventStream`)
        return _stream(gen, body, model, response_id, created, plan)
    gen.start()
    if not await gen.collect(receive):
        return Response(status_code=499)  # nobody reads it; the requests were cancelled
    choices = []
    for c in gen.choices:
        out = c.handle.output
        finish = openai_finish_reason(out.finish_reason)
        if plan is not None and plan.is_auto:
            content, calls = parse_tool_calls(out.text, plan.names, plan.parallel)
            message = ChatMessageOut(content=content, tool_calls=calls or None)
        else:
            calls = plan.calls(out.text) if plan is not None and finish == "stop" else None
            message = (ChatMessageOut(content=None, tool_calls=calls) if calls
                       else ChatMessageOut(content=out.text))
        choices.append(ChatChoice(
            index=c.index, message=message, finish_reason="tool_calls" if calls else finish,
            logprobs=chat_logprobs(out.token_ids, out.logprobs) if body.logprobs else None))
    return json_reply(ChatCompletionResponse(id=response_id, created=created, model=model,
                                             choices=choices, usage=gen.usage()), response_id)


def _stream(gen: Generation, body: ChatCompletionRequest, model: str, response_id: str,
            created: int, plan=None):
    started: set[int] = set()
    fmt = ChunkFormat(response_id, "chat.completion.chunk", created, model)
    tool_streams: dict[int, ToolStream] = {}

    def make_tool_chunk(choice, delta, final: bool):
        ts = tool_streams.setdefault(choice.index, ToolStream(plan))
        ok = final and openai_finish_reason(delta.finish_reason) == "stop"
        calls = ts.delta(delta.text, final, ok)
        if calls is None and not final:
            return None
        out = {"content": None, "tool_calls": calls}
        if choice.index not in started:
            started.add(choice.index)
            out = {"role": "assistant", **out}
        finish = None
        if final:
            finish = "tool_calls" if ok and (plan.name is not None or calls) else \
                openai_finish_reason(delta.finish_reason)
            if finish != "tool_calls" and plan.name is None:
                out["content"] = ts.text  # a cut-off array is no call: its text, as it came
        return fmt.chunk({"index": choice.index, "delta": out, "logprobs": None, "finish_reason": finish})

    parsers: dict[int, ToolCallParser] = {}

    def make_auto_chunk(choice, delta, final: bool):
        """Content until a `<tool_call>` starts, each call whole once its block closes."""
        parser = parsers.get(choice.index)
        if parser is None:
            parser = parsers[choice.index] = ToolCallParser(plan.names, plan.parallel)
        content, calls = parser.feed(delta.text)
        if final:
            rest, more = parser.finish()
            content, calls = content + rest, calls + more
        if not content and not calls and not final and not body.logprobs:
            return None  # held back: it may be the start of a call
        out = {"content": content or None}
        if calls:
            out["tool_calls"] = calls
        if choice.index not in started:
            started.add(choice.index)
            out = {"role": "assistant", **out}
        finish = None
        if final:
            finish = "tool_calls" if parser.num_calls else openai_finish_reason(delta.finish_reason)
        logprobs = (chat_logprobs(delta.token_ids, delta.logprobs).model_dump(mode="json")
                    if body.logprobs else None)
        return fmt.chunk({"index": choice.index, "delta": out, "logprobs": logprobs,
                          "finish_reason": finish})

    def make_chunk(choice, delta, final: bool) -> str:
        if plan is not None:
            return (make_auto_chunk if plan.is_auto else make_tool_chunk)(choice, delta, final)
        role = None
        if choice.index not in started:  # the first chunk of a choice names the role
            started.add(choice.index)
            role = "assistant"
        finish_reason = openai_finish_reason(delta.finish_reason) if final else None
        if body.logprobs:  # rare: the schema models write the logprobs
            return event_json(ChatCompletionChunk(
                id=response_id, created=created, model=model,
                choices=[ChatChunkChoice(index=choice.index,
                                         delta=ChatDelta(role=role, content=delta.text),
                                         logprobs=chat_logprobs(delta.token_ids, delta.logprobs),
                                         finish_reason=finish_reason)]))
        return fmt.chunk({"index": choice.index, "delta": {"role": role, "content": delta.text},
                          "logprobs": None, "finish_reason": finish_reason})

    def make_usage_chunk(usage) -> str:
        return event_json(ChatCompletionChunk(id=response_id, created=created, model=model,
                                              choices=[], usage=usage))

    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return EventStream(gen, make_chunk, make_usage_chunk, include_usage)
