"""`RequestHandle`: one submitted request as its submitter sees it.

Owns: the request's client-side state (status, the output folded from deltas, the stream queue,
timing for benchmarks) and the blocking accessors `result()`, `stream()`, `done()`, `cancel()`.
Deltas are delivered by the client's IO thread through `_deliver`; everything else may be
called from any thread. It never touches a socket itself (`cancel` asks the client to send).
Never imports torch.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Iterator, Optional

from infer_cluster.protocol import RequestDelta, RequestOutput, RequestStatus, error_from_code

_STATUS_BY_FINISH = {"stop": RequestStatus.FINISHED, "length": RequestStatus.FINISHED,
                     "abort": RequestStatus.ABORTED}


class RequestHandle:
    def __init__(self, client, request_id: str, prompt: Optional[str],
                 prompt_token_ids: Optional[list],
                 listener: Optional[Callable[[RequestDelta], None]] = None):
        self.request_id = request_id
        self._client = client
        self._lock = threading.Lock()
        self._output = RequestOutput(request_id=request_id,
                                     prompt_token_ids=list(prompt_token_ids or []), prompt=prompt)
        self._queue: "queue.SimpleQueue[RequestDelta]" = queue.SimpleQueue()
        self._done = threading.Event()
        self._status = RequestStatus.WAITING
        self._listener = listener
        self.submitted_at = time.monotonic()
        self.first_token_at: Optional[float] = None
        self.finished_at: Optional[float] = None

    # -------------------------------------------------------------- IO-thread side

    def _deliver(self, delta: RequestDelta, prompt_token_ids: Optional[list] = None) -> bool:
        """Fold one delta in; returns True when it was the final one. Ignores anything after
        the final (the contract is exactly one final per request)."""
        with self._lock:
            if self._done.is_set():
                return False
            now = time.monotonic()
            if delta.token_ids and self.first_token_at is None:
                self.first_token_at = now
            if prompt_token_ids is not None:
                self._output.prompt_token_ids = list(prompt_token_ids)
            self._output.apply(delta)
            if delta.finished:
                self._status = _STATUS_BY_FINISH.get(delta.finish_reason, RequestStatus.FAILED)
                self.finished_at = now
            elif self._status is RequestStatus.WAITING and delta.token_ids:
                self._status = RequestStatus.RUNNING
        self._queue.put(delta)
        if self._listener is not None:
            self._listener(delta)
        if delta.finished:
            self._done.set()
        return delta.finished

    # -------------------------------------------------------------- public

    @property
    def status(self) -> RequestStatus:
        return self._status

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        return self._done.wait(timeout)

    @property
    def output(self) -> RequestOutput:
        """The output so far (complete once `done()`)."""
        return self._output

    def result(self, timeout: Optional[float] = None) -> RequestOutput:
        """Block until the request ends; return its `RequestOutput` (the fields of the offline
        `LLM.generate` outputs). Ends with `finish_reason` "stop", "length", "abort" or
        "timeout" return normally; "error" raises the typed error (with `.output` attached).
        Raises `TimeoutError` if it has not ended after `timeout` seconds."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.request_id!r} has not finished after {timeout} s")
        return self._final_output()

    def _final_output(self) -> RequestOutput:
        out = self._output
        if out.finish_reason == "error":
            err = out.error or {}
            exc = error_from_code(err.get("code", "internal"),
                                  err.get("message", "request failed"), err.get("param"))
            exc.output = out
            raise exc
        return out

    def stream(self, timeout: Optional[float] = None) -> Iterator[RequestDelta]:
        """Yield deltas (new token ids, text, logprobs) as they arrive, ending with the final
        one (`finish_reason` set). Deltas are consumed: iterate one stream per handle.
        `timeout` bounds the wait for each next delta (`TimeoutError`)."""
        while True:
            try:
                delta = self._queue.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"no delta for request {self.request_id!r} in {timeout} s") from None
            yield delta
            if delta.finished:
                return

    def cancel(self) -> bool:
        """Ask the cluster to abort the request (its KV blocks are freed at once). Returns
        False if it had already ended. The final delta has `finish_reason` "abort"."""
        if self._done.is_set():
            return False
        self._client._send_cancel(self.request_id)
        return True

    def __repr__(self) -> str:
        return f"RequestHandle({self.request_id!r}, status={self._status.name})"
