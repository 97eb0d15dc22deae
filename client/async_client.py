"""`AsyncInferenceClient`: the `InferenceClient` surface for asyncio code.

Owns: the asyncio adapters. By default replies arrive on the one IO thread of an inner
`InferenceClient` and are handed to the event loop through one inbox per loop: the first
delta after a drain wakes the loop with `call_soon_threadsafe`, later ones ride along (one
wake-up per burst, not per token). With `on_loop=True` (the HTTP gateway) there is no IO
thread: the socket work runs on the loop that created the client (`client/loop_io.py`), a
submit goes straight to the socket and a reply is handed over in place, with no thread
wake-up or GIL hand-off either way. Nothing here blocks the loop and nothing polls. Never
imports torch.

Usage::

    async with AsyncInferenceClient("tcp://127.0.0.1:5555") as client:
        handle = client.submit("Hello", SamplingParams(max_tokens=16))
        async for delta in handle.stream():
            print(delta.text, end="")
        out = await handle.result()
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from typing import AsyncIterator, Optional

from infer_cluster.protocol import RequestDelta, RequestOutput, RequestStatus

from .client import InferenceClient
from .handle import RequestHandle


class _LoopInbox:
    """Deltas from the IO thread to one event loop. The IO thread appends; only the first
    append after a drain wakes the loop (`call_soon_threadsafe` writes to the loop's wake-up
    pipe), so a burst of deltas costs one wake-up and one callback, not one per token.
    Order is kept: one FIFO for every handle of the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._loop_thread = threading.get_ident()  # made on the loop (`_new_handle`)
        self._lock = threading.Lock()
        self._items: list = []
        self._scheduled = False

    def put(self, handle: "AsyncRequestHandle", delta: RequestDelta) -> None:  # IO thread
        with self._lock:
            self._items.append((handle, delta))
            if self._scheduled:
                return
            if threading.get_ident() == self._loop_thread:  # the loop's own socket work
                on_loop = True
            else:
                on_loop, self._scheduled = False, True
        if on_loop:
            self._drain()
        else:
            self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:  # event loop
        with self._lock:
            items, self._items = self._items, []
            self._scheduled = False
        for handle, delta in items:
            handle._put(delta)


class AsyncRequestHandle:
    def __init__(self, loop: asyncio.AbstractEventLoop, queue: Optional[asyncio.Queue] = None,
                 inbox: Optional[_LoopInbox] = None):
        self._loop = loop
        self._queue: asyncio.Queue = queue if queue is not None else asyncio.Queue()
        self._final: asyncio.Future = loop.create_future()
        self._handle: Optional[RequestHandle] = None
        self._inbox = inbox if inbox is not None else _LoopInbox(loop)

    def _on_delta(self, delta: RequestDelta) -> None:  # IO thread
        self._inbox.put(self, delta)

    def _put(self, delta: RequestDelta) -> None:  # event loop
        self._queue.put_nowait(delta)
        if delta.finished and not self._final.done():
            self._final.set_result(None)

    @property
    def request_id(self) -> str:
        return self._handle.request_id

    @property
    def status(self) -> RequestStatus:
        return self._handle.status

    @property
    def output(self) -> RequestOutput:
        return self._handle.output

    @property
    def submitted_at(self) -> float:
        return self._handle.submitted_at

    @property
    def first_token_at(self) -> Optional[float]:
        return self._handle.first_token_at

    @property
    def finished_at(self) -> Optional[float]:
        return self._handle.finished_at

    def done(self) -> bool:
        return self._handle.done()

    def cancel(self) -> bool:
        return self._handle.cancel()

    async def result(self, timeout: Optional[float] = None) -> RequestOutput:
        """Like `RequestHandle.result`: the output, or the typed error for "error" endings."""
        try:
            await asyncio.wait_for(asyncio.shield(self._final), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"request {self.request_id!r} has not finished after {timeout} s") from None
        return self._handle._final_output()

    async def stream(self) -> AsyncIterator[RequestDelta]:
        while True:
            delta = await self._queue.get()
            yield delta
            if delta.finished:
                return


class AsyncInferenceClient:
    def __init__(self, address: str = "tcp://127.0.0.1:5555", *, on_loop: bool = False, **kwargs):
        """`kwargs` as for `InferenceClient`. `on_loop=True`: no IO thread, the socket work runs
        on the running loop this is created on; use the client from that loop (other threads
        may still call it) and close it before the loop ends."""
        if on_loop:
            try:
                kwargs["io_loop"] = asyncio.get_running_loop()
            except RuntimeError:
                raise RuntimeError("AsyncInferenceClient(on_loop=True) must be created on the "
                                   "event loop that will use it, while it runs") from None
        self._client = InferenceClient(address, **kwargs)
        self._inboxes = weakref.WeakKeyDictionary()  # event loop -> its _LoopInbox

    def _new_handle(self, stream_queue: Optional[asyncio.Queue]) -> AsyncRequestHandle:
        loop = asyncio.get_running_loop()
        inbox = self._inboxes.get(loop)
        if inbox is None:
            inbox = self._inboxes[loop] = _LoopInbox(loop)
        return AsyncRequestHandle(loop, stream_queue, inbox)

    @property
    def address(self) -> str:
        return self._client.address

    def submit(self, prompt, sampling_params=None, request_id=None, priority=0,
               timeout=None, stream_queue: Optional[asyncio.Queue] = None) -> AsyncRequestHandle:
        """Non-blocking (the send is queued to the IO thread); call from inside the loop.

        `stream_queue`: deliver this request's deltas to a queue shared with other requests
        (tell them apart by `delta.request_id`), to merge several streams without a task per
        request; `stream()` must then not be used on the handle."""
        handle = self._new_handle(stream_queue)
        handle._handle = self._client._submit(prompt, sampling_params, request_id, priority,
                                              timeout, handle._on_delta)
        return handle

    def chat(self, messages, sampling_params=None, request_id=None, priority=0,
             timeout=None, stream_queue: Optional[asyncio.Queue] = None,
             tools=None) -> AsyncRequestHandle:
        """`InferenceClient.chat` for asyncio: the replica renders `messages` (and `tools`)
        with its model's chat template. `stream_queue` as for `submit`."""
        handle = self._new_handle(stream_queue)
        handle._handle = self._client._submit(None, sampling_params, request_id, priority,
                                              timeout, handle._on_delta, messages=messages,
                                              tools=tools)
        return handle

    async def generate(self, prompts, sampling_params=None, timeout=None) -> list[RequestOutput]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = (list(sampling_params) if isinstance(sampling_params, (list, tuple))
                  else [sampling_params] * len(prompts))
        handles = [self.submit(p, sp, timeout=timeout) for p, sp in zip(prompts, params)]
        await asyncio.gather(*(h._final for h in handles))
        return [h.output for h in handles]

    async def status(self, timeout: float = 5.0) -> dict:
        return await asyncio.get_running_loop().run_in_executor(None, self._client.status, timeout)

    async def control(self, action: str, replica: Optional[str] = None, timeout: float = 5.0) -> dict:
        return await asyncio.get_running_loop().run_in_executor(
            None, self._client.control, action, replica, timeout)

    async def resize(self, replica: str, num_kv_blocks: Optional[int] = None,
                     kv_cache_dtype: Optional[str] = None, timeout: float = 130.0) -> dict:
        return await asyncio.get_running_loop().run_in_executor(
            None, self._client.resize, replica, num_kv_blocks, kv_cache_dtype, timeout)

    async def aclose(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self._client.close)

    def close(self) -> None:
        self._client.close()

    async def __aenter__(self) -> "AsyncInferenceClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()
