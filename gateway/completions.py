"""`POST /v1/completions`: prompts (text, token ids, or a batch) in, text out.

Owns: the route, building `CompletionResponse` / stream chunks from a `Generation`, and the
choice order (prompt-major: choice `i` is prompt `i // n`, sample `i % n`, as OpenAI does).
Never imports torch.
"""

from __future__ import annotations

import time
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import Response

from .errors import json_reply
from .generation import Generation, openai_finish_reason
from .logprobs import completion_logprobs
from .params import completion_params, completion_prompts, per_choice
from .schemas import CompletionChoice, CompletionRequest, CompletionResponse
from .sse import ChunkFormat, EventStream, event_json
from .structured import param_names as structured_param_names

router = APIRouter()


@router.post("/v1/completions", response_model=None)
async def create_completion(body: CompletionRequest, request: Request):
    return await reply(body, request.app.state, request.receive)


async def reply(body: CompletionRequest, state, receive):
    """The reply (an ASGI response) to a validated request; raises `APIError`. Shared by the
    FastAPI route and the lean ASGI path (`fastpath.py`); `state` is the app's state, `receive`
    the ASGI receive callable (to notice a client that goes away)."""
    backend, metrics, config = state.backend, state.metrics, state.config
    model = backend.check_can_serve(body.model)
    params = completion_params(body, config.max_n)
    prompts = completion_prompts(body, config.max_batch)
    response_id = f"cmpl-{uuid.uuid4().hex}"
    gen = Generation.prepare(backend, metrics, prompts, per_choice(params, body.n), body.n,
                             stream=body.stream, chat=False, response_id=response_id,
                             param_names=structured_param_names(body))
    created = int(time.time())
    if body.stream:  # submitted by the response itself (`EventStream`)
        return _stream(gen, body, model, response_id, created)
    gen.start()
    if not await gen.collect(receive):
        return Response(status_code=499)  # nobody reads it; the requests were cancelled
    want_logprobs = body.logprobs is not None
    choices = []
    for c in gen.choices:
        out = c.handle.output
        choices.append(CompletionChoice(
            index=c.index, text=out.text, finish_reason=openai_finish_reason(out.finish_reason),
            logprobs=completion_logprobs(out.token_ids, out.logprobs, 0) if want_logprobs else None))
    return json_reply(CompletionResponse(id=response_id, created=created, model=model,
                                         choices=choices, usage=gen.usage()), response_id)


def _stream(gen: Generation, body: CompletionRequest, model: str, response_id: str,
            created: int):
    want_logprobs = body.logprobs is not None

    fmt = ChunkFormat(response_id, "text_completion", created, model)

    def make_chunk(choice, delta, final: bool) -> str:
        finish_reason = openai_finish_reason(delta.finish_reason) if final else None
        if want_logprobs:  # rare: the schema models write the logprobs
            logprobs = completion_logprobs(delta.token_ids, delta.logprobs, choice.text_len)
            choice.text_len += len(delta.text)
            return event_json(CompletionResponse(
                id=response_id, created=created, model=model,
                choices=[CompletionChoice(index=choice.index, text=delta.text, logprobs=logprobs,
                                          finish_reason=finish_reason)]))
        choice.text_len += len(delta.text)
        return fmt.chunk({"index": choice.index, "text": delta.text, "logprobs": None,
                          "finish_reason": finish_reason})

    def make_usage_chunk(usage) -> str:
        return event_json(CompletionResponse(id=response_id, created=created, model=model,
                                             choices=[], usage=usage))

    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return EventStream(gen, make_chunk, make_usage_chunk, include_usage)
