"""Server-sent events for streamed completions.

Owns: the SSE framing (`data: <json>\\n\\n`, ending with `data: [DONE]\\n\\n`), the response
class that always runs the stream's cleanup when the exchange ends (Starlette stops iterating
a stream when the client disconnects but does not close the generator; ours is closed at once,
and its `finally` cancels the unfinished requests on the cluster), the per-delta chunk JSON
(plain dicts and one `json.dumps`, no pydantic model per event), and the common streaming
loop shared by completions and chat: chunk per delta (deltas queued together share one
write), an error event when a choice fails after the stream began, the usage chunk, then `[DONE]`. Never imports torch.
"""

from __future__ import annotations

import json
from typing import AsyncIterator, Callable

from starlette.responses import StreamingResponse

from .errors import APIError
from .generation import Generation

DONE = b"data: [DONE]\n\n"


def event_json(model) -> str:
    """A response model as the JSON of one event: ASCII only, because generated text may hold
    U+2028, U+2029 or U+0085, which clients that split lines with `str.splitlines` would
    otherwise take for line ends inside the event."""
    return model.model_dump_json(ensure_ascii=True)


def dump_json(value) -> str:
    """Plain JSON values (dicts, lists, str, int, None) as compact ASCII-only JSON, byte for
    byte what `event_json` writes for the same fields (but for DEL, escaped here as
    \\u007f). The per-delta chunks use this instead of a pydantic model per event."""
    return json.dumps(value, ensure_ascii=True, separators=(",", ":"))


class ChunkFormat:
    """The constant part of one stream's chunks (id, object, created, model), encoded once;
    `chunk(choice)` wraps one choice's dict as `{..., "choices": [choice], "usage": null}` -
    the same JSON as the pydantic chunk model with that one choice."""

    def __init__(self, response_id: str, obj: str, created: int, model: str):
        head = dump_json({"id": response_id, "object": obj, "created": created, "model": model})
        self._head = head[:-1] + ',"choices":['
        self._tail = '],"usage":null}'

    def chunk(self, choice: dict) -> str:
        return self._head + dump_json(choice) + self._tail


def sse(payload_json: str) -> bytes:
    return b"data: " + payload_json.encode() + b"\n\n"


class EventStream(StreamingResponse):
    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], None]):
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()  # runs the generator's finally (cancel) now
            self._on_close()  # also when the generator never started


def event_stream(gen: Generation, first, make_chunk: Callable, make_usage_chunk,
                 stream_options) -> "EventStream":
    """The streaming response of `gen`: its events as SSE, usage last when the request's
    `stream_options.include_usage` asks for it; closing the exchange closes `gen`."""
    include_usage = bool(stream_options and stream_options.include_usage)
    return EventStream(stream_events(gen, first, make_chunk, make_usage_chunk, include_usage),
                       on_close=gen.close)


async def stream_events(gen: Generation, first, make_chunk: Callable, make_usage_chunk,
                        include_usage: bool) -> AsyncIterator[bytes]:
    """Yield SSE frames for every delta of `gen`; `make_chunk(choice, delta)` returns the
    chunk's JSON text (or None to skip), `make_usage_chunk(usage)` the final usage chunk's.
    Deltas already queued when one is handled go out in the same HTTP write (one send per
    wake-up, not per token); the frames and their order are the same as one write each."""
    frames: list[bytes] = []
    try:
        event, failed = first, False
        while True:
            choice, delta = event
            if delta.finished and delta.finish_reason not in ("stop", "length"):
                if delta.token_ids or delta.text:
                    frames.append(sse(make_chunk(choice, delta, final=False)))
                err = APIError.from_final(delta.finish_reason, delta.error)
                gen.metrics.count_error(err.code, err.status)
                frames.append(sse(json.dumps(err.body())))
                gen.cancel_unfinished()
                failed = True
                break
            text = make_chunk(choice, delta, final=delta.finished)
            if text is not None:
                frames.append(sse(text))
            if not gen.num_unfinished:
                break
            event = gen.next_event_nowait()
            if event is None:
                if frames:
                    yield b"".join(frames)
                    frames.clear()
                event = await gen.next_event()
        if not failed and include_usage:
            frames.append(sse(make_usage_chunk(gen.usage())))
        frames.append(DONE)
        yield b"".join(frames)
    finally:
        gen.close()
