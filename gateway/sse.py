"""Server-sent events for streamed completions.

Owns: the SSE framing (`data: <json>\\n\\n`, ending with `data: [DONE]\\n\\n`), the per-delta
chunk JSON (plain dicts and one `json.dumps`, no pydantic model per event), and `EventStream`,
the ASGI response of a streamed generation shared by completions and chat. It submits the
generation and waits for the first delta itself: a choice that fails before producing anything
raises `APIError`, which the app's handler turns into a reply with the right HTTP status since
nothing was sent yet. Then it sends the headers and the first chunk and streams the rest:
deltas queued together go out in one write, an error event when a choice fails after the stream
began, the usage chunk, then `[DONE]`. A client that goes away ends the stream and cancels its
requests on the cluster (`Generation.interrupt` / `close`), also before its first token.

Why not Starlette's `StreamingResponse`: it starts the response in a new task of an anyio task
group (plus a task that watches for the disconnect), which put task-group set-up and an extra
loop turn between the first token and its write; here the only work between the first token and
the socket is formatting that token. Never imports torch.
"""

from __future__ import annotations

import asyncio
import json
from typing import Callable

from starlette.responses import Response

from .generation import ClientGone, Generation, wait_for_disconnect

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


class EventStream(Response):
    """The reply of a streamed `Generation` (an ASGI app). `make_chunk(choice, delta, final)`
    returns one chunk's JSON text (or None to skip it), `make_usage_chunk(usage)` the final
    usage chunk's; `include_usage` asks for that chunk. Always closes `gen` when done."""

    media_type = "text/event-stream"

    def __init__(self, gen: Generation, make_chunk: Callable, make_usage_chunk: Callable,
                 include_usage: bool):
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-cache", "X-Accel-Buffering": "no",
                           "X-Request-Id": gen.response_id})
        self.gen = gen
        self.make_chunk = make_chunk
        self.make_usage_chunk = make_usage_chunk
        self.include_usage = include_usage

    async def __call__(self, scope, receive, send) -> None:
        gen = self.gen
        watcher = asyncio.ensure_future(wait_for_disconnect(receive))
        watcher.add_done_callback(gen.interrupt_when_done)
        try:
            # Submit last, then wait at once: see `Generation.prepare`. An `APIError` from here
            # on to the first event reaches the app's handler (nothing was sent yet).
            gen.start()
            first = await gen.first_event()
            started = False
            async for body, last in self._bodies(first):
                message = {"type": "http.response.body", "body": body, "more_body": not last}
                if not started:
                    started = True
                    await send({"type": "http.response.start", "status": self.status_code,
                                "headers": self.raw_headers})
                await send(message)  # the last one also ends the response: one write
        except ClientGone:
            pass  # nobody reads the rest; `close` cancels what still runs
        finally:
            watcher.cancel()
            gen.close()

    async def _bodies(self, first):
        """The stream's HTTP writes as (body, last): SSE frames of every delta of the
        generation, those that were queued together joined into one write (the frames and their
        order are the same as one write each); the last one ends with `[DONE]`."""
        gen, make_chunk = self.gen, self.make_chunk
        frames: list[bytes] = []
        event, failed = first, False
        while True:
            choice, delta = event
            if delta.finished and delta.finish_reason not in ("stop", "length"):
                if delta.token_ids or delta.text:
                    frames.append(sse(make_chunk(choice, delta, final=False)))
                err = gen.error_of(delta)
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
                    yield b"".join(frames), False
                    frames.clear()
                event = await gen.next_event()
        if not failed and self.include_usage:
            frames.append(sse(self.make_usage_chunk(gen.usage())))
        frames.append(DONE)
        yield b"".join(frames), True
