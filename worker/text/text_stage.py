"""`TextStage`: the engine's token ids become text, off the step.

Owns: one `IncrementalDetokenizer` per request, stop strings and their hold-back, and the
bookkeeping that keeps "exactly one final per request" true when text runs behind the engine.
Plain Python over a tokenizer; never touches torch or the scheduler.

The engine emits *raw* deltas: new token ids, logprobs, finish info, no text. `process()`
turns them into the deltas a client sees and returns the ids of requests whose text hit a stop
string. The caller tells the engine (`DynamicEngine.stop_requests`), which ends them and emits
a final delta of its own; this stage swallows that final and any delta of a stopped request
that the engine produced before it learned of the stop. So the client's output is the same
whether text runs inline (offline `LLM`: stops apply in the same step) or on a helper thread
(the replica: stops apply one step later, so at most one step of tokens is computed and
dropped per stopped request).

Semantics kept from the inline engine: the final delta of a stop string carries the token that
completed it (a delta of several tokens, from speculative decoding, loses those after it) and
text cut just before the stop string; a stop string completed by the token
that also hit `max_tokens` / EOS reports `stop`; resumed requests replay delivered tokens one
push at a time so held-back text comes out with the first new token.

`TextWorker` runs a `TextStage` on its own thread for the replica: the engine loop hands it
registrations and step outputs in order and goes straight to the next step. Given a `HostIdle`
(worker/text/host_idle.py), it runs each batch while the engine's thread waits on the device.

Metrics (`RequestMetrics`): the engine puts them on a request's first-token delta and on its
final. This stage keeps the first-token copy and strips it from non-final deltas (clients get
metrics once, on the final); when a stop string ends a request here, the final it makes gets
that copy with `finish_time` set to now, so both kinds of final carry metrics.

To extend: per-request text features (e.g. `include_stop_str_in_output`) belong in
`_RequestText`; anything the engine must learn goes back through the stop list.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import queue
import threading
import time
from typing import Callable, Optional, Sequence

from infer_cluster.protocol import EngineError, FinishReason, RequestDelta, RequestMetrics

from infer_cluster.worker.text.host_idle import HostIdle
from infer_cluster.worker.text.detokenizer import IncrementalDetokenizer
from infer_cluster.worker.text.logprob_rows import resolve_logprobs
from infer_cluster.worker.text.token_bytes import TokenBytes

log = logging.getLogger(__name__)

_STOP_WINS = (FinishReason.LENGTH.value, FinishReason.STOP.value)


class TextStage:
    def __init__(self, tokenizer, byte_table=None):
        self.tokenizer = tokenizer
        self.byte_table = byte_table
        self._detok: dict[str, IncrementalDetokenizer] = {}
        self._stopped: set[str] = set()  # stopped here; the engine's final is still to come
        self._metrics: dict[str, RequestMetrics] = {}  # from the first-token delta, until the final
        self._token_bytes: Optional[TokenBytes] = None  # built on the first request that asks
        self._want_bytes: set[str] = set()  # requests whose logprob entries carry token bytes

    def add(self, request_id: str, prompt_ids: Sequence[int], stop: Sequence[str] = (),
            resume_ids: Sequence[int] = (), logprob_bytes: bool = False) -> None:
        """Register a request before its first delta is processed. `logprob_bytes`: its logprob
        entries, if it has any, get a third item, `{token_id: bytes}`
        (`SamplingParams.logprob_bytes`)."""
        detok = IncrementalDetokenizer(self.tokenizer, prompt_ids, stop, byte_table=self.byte_table)
        for token in resume_ids:
            detok.push([token])  # held-back text of the lost replica comes out with the next token
        self._detok[request_id] = detok
        self._stopped.discard(request_id)
        self._metrics.pop(request_id, None)
        if logprob_bytes:
            if self._token_bytes is None:
                self._token_bytes = TokenBytes(self.tokenizer, self.byte_table)
            self._want_bytes.add(request_id)
        else:
            self._want_bytes.discard(request_id)

    def process(self, deltas: Sequence[RequestDelta]) -> tuple[list[RequestDelta], list[str]]:
        """Raw engine deltas -> client deltas (with text), and the ids that just hit a stop
        string while the engine still runs them."""
        out: list[RequestDelta] = []
        stops: list[str] = []
        resolve_logprobs(deltas)  # the engine leaves logprob entries for this thread to build
        for d in deltas:
            if d.logprobs and d.request_id in self._want_bytes:
                self._add_token_bytes(d)
            if d.finish_reason is not None:
                self._want_bytes.discard(d.request_id)
            detok = self._detok.get(d.request_id)
            if detok is None:
                if d.request_id in self._stopped:
                    if d.finish_reason is not None:
                        self._stopped.discard(d.request_id)  # the engine has let it go too
                    continue
                out.append(d)  # never registered (refused before admission): as it is
                continue
            is_final = d.finish_reason is not None
            if d.metrics is not None and not is_final:
                self._metrics[d.request_id] = d.metrics
                d.metrics = None
            try:
                if len(d.token_ids) > 1 and detok.stop:  # a speculative burst: stop inside it?
                    text, stopped = _push_burst(detok, d, is_final)
                else:
                    text, stopped = detok.push(d.token_ids, final=is_final)
            except Exception as exc:  # a tokenizer bug ends this request, never the stage
                log.exception("detokenizing request %s failed", d.request_id)
                text, stopped = "", True
                d.error = EngineError(f"detokenizing failed: {type(exc).__name__}: {exc}").to_dict()
                if is_final:
                    d.finish_reason = FinishReason.ERROR.value
            d.text = d.text + text
            if stopped and not is_final:
                d.finish_reason = FinishReason.ERROR.value if d.error else FinishReason.STOP.value
                self._stopped.add(d.request_id)
                stops.append(d.request_id)
                del self._detok[d.request_id]
                metrics = self._metrics.pop(d.request_id, None)
                if metrics is not None:
                    d.metrics = dataclasses.replace(metrics, finish_time=time.time())
            elif is_final:
                if d.error is None and stopped and d.finish_reason in _STOP_WINS:
                    d.finish_reason = FinishReason.STOP.value
                d.text += detok.flush()
                del self._detok[d.request_id]
                self._metrics.pop(d.request_id, None)
            else:
                d.num_prompt_tokens = d.num_cached_tokens = d.num_cached_tokens_host = 0  # final only
            out.append(d)
        return out, stops

    def _add_token_bytes(self, d: RequestDelta) -> None:
        """Each logprob entry of `d` (one per token) gets `{token_id: bytes}` for its sampled
        token and alternatives."""
        entry_bytes = self._token_bytes.entry_bytes
        for t, e in zip(d.token_ids, d.logprobs):
            if e is not None:  # a list this delta owns (built by `resolve_logprobs` or the engine)
                e.append(entry_bytes(t, e[1] if len(e) > 1 and e[1] else ()))

    def __len__(self) -> int:
        return len(self._detok)


def _push_burst(detok: IncrementalDetokenizer, d: RequestDelta, final: bool) -> tuple[str, bool]:
    """Push a delta of several tokens (speculative decoding) one token at a time; a stop string
    completed by one of them drops the tokens (and logprobs) after it from the delta, as if the
    request had made one token a step."""
    pieces = []
    for i, token in enumerate(d.token_ids):
        last = i == len(d.token_ids) - 1
        text, stopped = detok.push([token], final=final and last)
        pieces.append(text)
        if stopped:
            if not last:
                d.token_ids = d.token_ids[:i + 1]
                if d.logprobs is not None:
                    d.logprobs = d.logprobs[:i + 1]
            return "".join(pieces), True
    return "".join(pieces), False


class TextWorker(threading.Thread):
    """A `TextStage` on its own thread. `emit(deltas, extra)` is called on this thread with
    every processed batch (the replica encodes and sends it); stops are collected for the
    engine loop, which takes them with `take_stops()` before its next step."""

    # The most a batch waits for the engine's thread to go idle (`HostIdle`) before it runs
    # anyway: a step that never waits on the device, or an engine with nothing left to do.
    IDLE_WAIT_S = 0.002

    def __init__(self, stage: TextStage, emit: Callable[[list, object], None], name: str = "text",
                 idle: Optional[HostIdle] = None):
        super().__init__(name=name, daemon=True)
        self.stage = stage
        self._emit = emit
        # Batches run while the engine's thread waits (`idle` open), not between its launches.
        self.idle = idle
        self._inbox: "queue.SimpleQueue" = queue.SimpleQueue()
        self._stops: list[str] = []
        self._stops_lock = threading.Lock()
        self._progress = threading.Condition()
        self._num_submitted = 0
        self._num_done = 0
        self.error: Optional[BaseException] = None

    def add(self, request_id: str, prompt_ids, stop, resume_ids, logprob_bytes: bool = False) -> None:
        self._inbox.put(("add", (request_id, list(prompt_ids), list(stop), list(resume_ids),
                                 logprob_bytes)))

    def submit(self, deltas: list, extra=None) -> None:
        with self._progress:
            self._num_submitted += 1
        self._inbox.put(("deltas", (deltas, extra)))

    def wait_until_behind(self, max_batches: int, timeout: float = 5.0) -> bool:
        """Block until at most `max_batches` submitted batches are unprocessed. The engine loop
        calls this with 1 before each step: text lags one step, so a stop string found in step
        n's tokens ends its request before step n+2 (one step of tokens wasted, no more), and a
        tokenizer slower than the engine applies back-pressure instead of an unbounded queue."""
        with self._engine_idle(), self._progress:
            return self._progress.wait_for(
                lambda: self._num_submitted - self._num_done <= max_batches or self.error is not None,
                timeout)

    def _engine_idle(self):
        """Open `idle` while the engine's thread waits here (no-op without one)."""
        return self.idle.idle() if self.idle is not None else contextlib.nullcontext()

    def take_stops(self) -> list[str]:
        if not self._stops:
            return []
        with self._stops_lock:
            stops, self._stops = self._stops, []
        return stops

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything handed over so far has been emitted."""
        done = threading.Event()
        self._inbox.put(("mark", done))
        with self._engine_idle():
            return done.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        self._inbox.put(("close", None))
        if self.is_alive():
            self.join(timeout)

    def run(self) -> None:
        while True:
            kind, item = self._inbox.get()
            if kind == "close":
                return
            if kind == "mark":
                item.set()
                continue
            try:
                if kind == "add":
                    self.stage.add(*item)
                else:
                    deltas, extra = item
                    if self.idle is not None:
                        self.idle.wait_open(self.IDLE_WAIT_S)
                    out, stops = self.stage.process(deltas)
                    if stops:
                        with self._stops_lock:
                            self._stops.extend(stops)
                    if out:
                        self._emit(out, extra)
                    with self._progress:
                        self._num_done += 1
                        self._progress.notify_all()
            except Exception as exc:  # sending failed: the replica's loop sees .error and exits
                log.exception("text stage failed")
                with self._progress:
                    self.error = exc
                    self._progress.notify_all()
                return
