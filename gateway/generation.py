"""One HTTP generation request as a set of cluster requests ("choices"), and their results.

Owns: submitting every choice (prompts x n; `prepare`, then `start`) through the backend's
`AsyncInferenceClient`, waiting for all of them (non-streaming) or merging their deltas into
one ordered event stream (streaming: one shared asyncio queue, no task per choice;
already-queued deltas are taken without waiting so the stream can write them together;
`interrupt` wakes a waiting stream with `ClientGone`), turning a failed or aborted choice into
an `APIError`, exact usage counting, cancelling every unfinished choice when the HTTP client
goes away or the response ends early, and recording each choice in the metrics. It formats
nothing: `completions.py` / `chat.py` build the response bodies, `sse.py` writes the stream.
Never imports torch.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Optional

from infer_cluster.protocol import InferClusterError, RequestDelta

from .errors import APIError
from .schemas import Usage

log = logging.getLogger("infer_cluster.gateway")

_OPENAI_FINISH = {"stop": "stop", "length": "length"}


def openai_finish_reason(reason: Optional[str]) -> Optional[str]:
    """OpenAI's value for a successful ending (others are reported as errors)."""
    return _OPENAI_FINISH.get(reason, reason)


@dataclass
class Choice:
    index: int
    prompt_index: int
    handle: object  # AsyncRequestHandle
    num_prompt_tokens: int = 0
    text_len: int = 0         # characters streamed so far (completion logprobs' text_offset)
    finish_reason: Optional[str] = None
    recorded: bool = False


@dataclass
class Generation:
    """Choices of one HTTP request; `choices[i]` answers prompt `i // n`, sample `i % n`."""

    backend: object
    metrics: object
    choices: list[Choice] = field(default_factory=list)
    queue: Optional[asyncio.Queue] = None
    _by_rid: dict = field(default_factory=dict)
    _closed: bool = False
    _interrupted: bool = False

    _plan: Optional[tuple] = None  # (prompts, params per choice, n, chat, tools) until `start`
    # The cluster's names of request fields -> this endpoint's (chat: "prompt" is "messages"),
    # for the `param` of an error reply.
    param_names: dict = field(default_factory=dict)
    _started: bool = False
    response_id: str = ""  # the HTTP reply's id; choice i is cluster request f"{id}-{i}"

    @classmethod
    def prepare(cls, backend, metrics, prompts: list, params_per_choice: list, n: int,
                stream: bool, chat: bool, response_id: str,
                param_names: Optional[dict] = None, tools: Optional[list] = None) -> "Generation":
        """The choices of one HTTP request, not yet on the cluster: `start` submits them. A
        stream starts them last, right before it waits (`sse.EventStream`), so no set-up work
        runs between the submit and the event loop going idle: the client's IO thread needs
        the GIL to forward the submit, and gets it only then. Choice i travels as cluster
        request `{response_id}-{i}`, so the coordinator's log lines name the id the HTTP caller
        got. `param_names`: see the field. `tools`: the `ChatTool`s a chat's template gets."""
        return cls(backend, metrics, queue=asyncio.Queue() if stream else None,
                   _plan=(prompts, params_per_choice, n, chat, tools), response_id=response_id,
                   param_names=param_names or {})

    def _tag(self, err: APIError) -> APIError:
        """`err` carrying this reply's id (its `X-Request-Id` header), its `param` in this
        endpoint's words."""
        err.request_id = self.response_id
        err.param = self.param_names.get(err.param, err.param)
        return err

    def error_of(self, delta: RequestDelta) -> APIError:
        """The error reply for a choice's failed final delta."""
        return self._tag(APIError.from_final(delta.finish_reason, delta.error))

    def start(self) -> None:
        """Submit every choice; raises `APIError` (nothing then stays on the cluster)."""
        prompts, params_per_choice, n, chat, tools = self._plan
        response_id = self.response_id
        client, timeout = self.backend.client, self.backend.config.request_timeout
        try:
            for p_index, prompt in enumerate(prompts):
                for k in range(n):
                    params = params_per_choice[k]
                    rid = f"{response_id}-{len(self.choices)}"
                    if chat:
                        handle = client.chat(prompt, params, request_id=rid, timeout=timeout,
                                             stream_queue=self.queue, tools=tools)
                    else:
                        handle = client.submit(prompt, params, request_id=rid, timeout=timeout,
                                               stream_queue=self.queue)
                    choice = Choice(len(self.choices), p_index, handle)
                    self.choices.append(choice)
                    self._by_rid[handle.request_id] = choice
        except InferClusterError as exc:
            self.cancel_unfinished()
            raise self._tag(APIError.from_cluster(exc)) from None
        except RuntimeError as exc:  # the client is closed: the gateway is shutting down
            self.cancel_unfinished()
            raise self._tag(APIError(f"the gateway is shutting down: {exc}", "no_replica")) from None
        self._started = True
        self.metrics.in_flight.inc()

    # ------------------------------------------------------------------ non-streaming

    async def wait_all(self, disconnected: "asyncio.Future") -> None:
        """Until every choice ended; raises `APIError` for the first failed one (the others
        are cancelled) and `ClientGone` when `disconnected` resolves first."""
        finals = [asyncio.ensure_future(c.handle.result()) for c in self.choices]
        pending = set(finals)
        try:
            while pending:
                done, pending = await asyncio.wait(pending | {disconnected},
                                                   return_when=asyncio.FIRST_COMPLETED)
                if disconnected in done:
                    raise ClientGone()
                pending.discard(disconnected)
                for task in done:
                    exc = task.exception()
                    if isinstance(exc, InferClusterError):
                        raise self._tag(APIError.from_cluster(exc))
                    if exc is not None:
                        raise exc
            for c in self.choices:
                self._settle(c, c.handle.output.finish_reason)
                if c.finish_reason not in ("stop", "length"):
                    raise self._tag(APIError.from_final(c.finish_reason, c.handle.output.error))
        finally:
            for task in finals:
                task.cancel()

    async def collect(self, receive) -> bool:
        """Non-streaming: wait for every choice (`wait_all`) while watching the HTTP client
        (`receive`: the ASGI receive callable, the body already read); False when it went away
        first (its requests are cancelled). Always closes `self`."""
        disconnected = asyncio.ensure_future(wait_for_disconnect(receive))
        try:
            await self.wait_all(disconnected)
            return True
        except ClientGone:
            return False
        finally:
            disconnected.cancel()
            self.close()

    # ------------------------------------------------------------------ streaming

    async def first_event(self) -> tuple[Choice, RequestDelta]:
        """The first delta of any choice; a choice that failed before producing anything is
        raised as `APIError` so the reply can still carry the right HTTP status."""
        choice, delta = await self.next_event()
        if delta.finished and not delta.token_ids and delta.finish_reason not in ("stop", "length"):
            raise self.error_of(delta)
        return choice, delta

    async def next_event(self) -> tuple[Choice, RequestDelta]:
        """The next delta of any choice; raises `ClientGone` once `interrupt` was called."""
        return self._take(await self.queue.get())

    def next_event_nowait(self) -> Optional[tuple[Choice, RequestDelta]]:
        """The next delta if one is already queued, else None (never waits): the stream writes
        every delta that arrived together as one HTTP chunk."""
        try:
            delta = self.queue.get_nowait()
        except asyncio.QueueEmpty:
            return None
        return self._take(delta)

    def interrupt(self) -> None:
        """The HTTP client went away: a stream waiting in `next_event` (or `first_event`) gets
        `ClientGone` now instead of the next delta. Idempotent; a no-op once closed."""
        if self.queue is not None and not self._closed and not self._interrupted:
            self._interrupted = True
            self.queue.put_nowait(_CLIENT_GONE)

    def interrupt_when_done(self, watcher: "asyncio.Future") -> None:
        """Done-callback of a `wait_for_disconnect` task: interrupt unless it was cancelled."""
        if not watcher.cancelled():
            if watcher.exception() is not None:
                log.warning("lost track of an HTTP client (%s); ending its stream",
                            watcher.exception())
            self.interrupt()

    def _take(self, delta) -> tuple[Choice, RequestDelta]:
        if delta is _CLIENT_GONE:
            raise ClientGone()
        choice = self._by_rid[delta.request_id]
        if delta.finished:
            self._settle(choice, delta.finish_reason, delta.num_prompt_tokens)
        return choice, delta

    @property
    def num_unfinished(self) -> int:
        return sum(1 for c in self.choices if c.finish_reason is None)

    # ------------------------------------------------------------------ endings

    def _settle(self, choice: Choice, reason: Optional[str], num_prompt_tokens: int = 0) -> None:
        if choice.finish_reason is not None:
            return
        choice.finish_reason = reason or "abort"
        out = choice.handle.output
        choice.num_prompt_tokens = num_prompt_tokens or len(out.prompt_token_ids)

    def usage(self) -> Usage:
        """Prompt tokens once per prompt (as the replica tokenized it), completion tokens summed
        over every choice's generated ids."""
        prompt_tokens: dict[int, int] = {}
        for c in self.choices:
            prompt_tokens[c.prompt_index] = max(prompt_tokens.get(c.prompt_index, 0),
                                                c.num_prompt_tokens or len(c.handle.output.prompt_token_ids))
        completion = sum(len(c.handle.output.token_ids) for c in self.choices)
        prompt = sum(prompt_tokens.values())
        return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)

    def cancel_unfinished(self) -> int:
        """Cancel every choice still running on the cluster; returns how many."""
        num = 0
        for c in self.choices:
            if not c.handle.done() and c.handle.cancel():
                num += 1
        return num

    def close(self) -> None:
        """End of the HTTP exchange (normal or not): cancel leftovers, record metrics once.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        if not self._started:  # never submitted, or `start` failed (and cancelled its part)
            return
        num = self.cancel_unfinished()
        if num:
            log.info("cancelled %d unfinished request(s) of a closed HTTP exchange", num)
        for c in self.choices:
            if c.recorded:
                continue
            c.recorded = True
            out = c.handle.output
            reason = c.finish_reason or out.finish_reason or "abort"
            self.metrics.observe_choice(c.handle, reason, c.num_prompt_tokens or len(out.prompt_token_ids))
        self.metrics.in_flight.dec()


class ClientGone(Exception):
    """The HTTP client disconnected before its reply was complete."""


_CLIENT_GONE = object()  # queued by `Generation.interrupt`


async def wait_for_disconnect(receive) -> None:
    """Resolves when the HTTP client goes away: `receive` is the ASGI receive callable, and the
    server sends `http.disconnect` once the body has been read and the connection closes (or the
    response is complete); event-driven, no polling."""
    while True:
        message = await receive()
        if message.get("type") == "http.disconnect":
            return
