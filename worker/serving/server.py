"""`EngineServer`: one `DynamicEngine` in one process, served to the coordinator over ZMQ.

Owns: the replica's two threads and what crosses between them.
  * IO thread (`ReplicaIO`, `worker/serving/replica_io.py`): the DEALER socket to the coordinator, HELLO
    (protocol version + capacity) until acknowledged, heartbeats with load, coordinator-silence
    detection. It never calls the engine; it hands decoded commands to the engine loop through
    a queue and forwards the loop's encoded outputs.
  * Engine loop (the caller of `serve_forever`): admits DISPATCHed requests, aborts, runs
    `engine.step()` and hands every step's raw deltas (token ids, no text) to the text thread,
    applies PAUSE / RESUME / DRAIN / SHUTDOWN.
  * Text thread (`TextWorker`, `worker/text/text_stage.py`): detokenizes, applies stop strings, and
    encodes and sends each step's deltas as one STEP_OUTPUT, so tokenizer cost stays off the
    step; it runs while the engine loop waits on the device (`worker/text/host_idle.py`), not
    between a step's launches. Stop strings come back to the engine loop, which ends those requests before the
    step after next (at most one step of tokens is computed and dropped). It blocks on its queue only while it has nothing to step, so socket work
    never stalls a step and an idle replica does not spin.
Never trusts the wire: requests are re-validated (`SamplingParams.from_dict`, engine checks) and
a bad one ends with an error delta instead of taking the loop down.

To handle a new coordinator command: add its kind to `ENGINE_COMMANDS` in `replica_io.py` and a
method `_on_<name>` here registered in `self._handlers`.
"""

from __future__ import annotations

import logging
import queue
import time
from dataclasses import dataclass
from typing import Optional

from infer_cluster.protocol import EngineError, InferClusterError, SamplingParams
from infer_cluster.protocol.kinds import ControlKind, RequestKind
from infer_cluster.protocol.messages import (DispatchRequest, ReplicaLoad, ReplicaState,
                               ReplicaStateChange, ResizeDone, ResizeKV, StepOutput, delta_wire)

from infer_cluster.worker.text.chat import prompt_of
from infer_cluster.worker.serving.replica_io import REREGISTERED, ReplicaIO
from infer_cluster.worker.text.host_idle import HostIdle
from infer_cluster.worker.text.text_stage import TextStage, TextWorker

log = logging.getLogger("infer_cluster.replica")

_WAKE = "wake"  # inbox item that only interrupts an idle wait
_DISCARD = object()  # text-thread batch whose output nobody wants (only its state is dropped)
LOAD_READ_INTERVAL = 0.05  # seconds between engine.stats() reads while stepping


@dataclass
class ServerConfig:
    coordinator: str = "tcp://127.0.0.1:5556"  # the coordinator's replica port
    name: str = "replica"
    heartbeat_interval: float = 0.5   # until the coordinator's HELLO_ACK says otherwise
    coordinator_timeout: float = 10.0  # silent coordinator -> drop requests, register again
    drain_timeout: float = 30.0       # graceful stop: wait this long for in-flight requests
    idle_wait: float = 0.5            # longest block on the command queue when idle
    auth: Optional[str] = None        # key folder with the replica keypair (client/auth.py)

    def __post_init__(self):
        if not self.coordinator.startswith(("tcp://", "ipc://", "inproc://")):
            raise ValueError(f"coordinator must be an address like tcp://HOST:PORT, got {self.coordinator!r}")
        if not self.name:
            raise ValueError("name must not be empty")
        for field_name in ("heartbeat_interval", "coordinator_timeout", "drain_timeout", "idle_wait"):
            if getattr(self, field_name) <= 0:
                raise ValueError(f"{field_name} must be > 0, got {getattr(self, field_name)}")


class EngineServer:
    def __init__(self, engine, config: ServerConfig, context=None):
        self.engine = engine
        self.config = config
        self.state = ReplicaState.ACTIVE
        self._inbox: "queue.SimpleQueue" = queue.SimpleQueue()
        capacity = engine.capacity()
        self.io = ReplicaIO(config, capacity, self._inbox, self._load_snapshot, lambda: self.state,
                            context=context)
        self._load = self._read_load()
        self._prompt_ids: dict[str, list] = {}  # sent with each request's first delta
        # An engine that makes its own text (detokenize=True) is served as is; otherwise text
        # runs on its own thread here.
        self.text: Optional[TextWorker] = None
        if getattr(engine, "text", None) is None:
            # Text runs while the engine's thread waits on the device (worker/text/host_idle.py).
            engine.host_idle = HostIdle()
            self.text = TextWorker(TextStage(engine.tokenizer, engine.byte_table), self._send_deltas,
                                   name=f"text-{config.name}", idle=engine.host_idle)
            engine.defer_logprobs = True  # built on the text thread (worker/text/logprob_rows.py)
        self._stop_requested = False
        self._stop_graceful = True
        self._stop_deadline: Optional[float] = None
        self._exit_when_drained = False
        self.exit_reason = ""
        self.num_steps = 0
        self._next_load_read = 0.0
        self.seconds_in_engine = 0.0
        self.seconds_in_server = 0.0
        self._handlers = {
            RequestKind.DISPATCH: self._on_dispatch,
            RequestKind.ABORT: self._on_abort,
            ControlKind.PAUSE: self._on_pause,
            ControlKind.RESUME: self._on_resume,
            ControlKind.DRAIN: self._on_drain,
            ControlKind.SHUTDOWN: self._on_shutdown,
            ControlKind.RESIZE_KV: self._on_resize_kv,
            REREGISTERED: self._on_reregistered,
        }

    # ------------------------------------------------------------------ control from outside

    def request_stop(self, graceful: bool = True) -> None:
        """Safe from signal handlers and other threads: graceful drains first."""
        self._stop_graceful = self._stop_graceful and graceful
        self._stop_requested = True
        self._inbox.put((_WAKE, None))  # SimpleQueue.put is safe inside a signal handler

    # ------------------------------------------------------------------ the loop

    def serve_forever(self) -> str:
        """Run until SHUTDOWN, a stop request, or a fatal refusal; returns why it stopped."""
        self.io.start()
        if self.text is not None:
            self.text.start()
        log.info("replica %s serving %s; connecting to %s", self.config.name,
                 self.engine.model_name, self.config.coordinator)
        try:
            while not self._should_exit():
                self._check_drained()
                if self.exit_reason:
                    break
                busy = self.engine.has_unfinished_requests() and self.state is not ReplicaState.PAUSED
                self._drain_inbox(block=not busy)
                if self.io.fatal_error:
                    self.exit_reason = self.io.fatal_error
                    break
                if self.text is not None and self.text.error is not None:
                    self.exit_reason = f"text thread failed: {self.text.error}"
                    break
                if self.state is not ReplicaState.PAUSED and self.engine.has_unfinished_requests():
                    self._step()
        finally:
            self._shutdown()
        return self.exit_reason

    def _should_exit(self) -> bool:
        if self.exit_reason:
            return True
        if self._stop_requested:
            if not self._stop_graceful:
                self.exit_reason = "stopped"
                return True
            now = time.monotonic()
            if self._stop_deadline is None:
                self._stop_deadline = now + self.config.drain_timeout
                self._begin_drain("stop requested", exit_after=True)
            elif now > self._stop_deadline:
                self.exit_reason = f"drain timeout ({self.config.drain_timeout:g} s)"
                return True
        return False

    def _drain_inbox(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=self.config.idle_wait) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, msg = item
            handler = self._handlers.get(kind)
            if handler is not None:
                handler(msg)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _step(self) -> None:
        if self.text is not None:
            self.text.wait_until_behind(1)
            stops = self.text.take_stops()
            if stops:
                self.engine.stop_requests(stops)
        t0 = time.perf_counter()
        try:
            deltas = self.engine.step()
        except Exception as exc:  # an engine bug must end requests, not strand them
            log.exception("engine step raised; failing every request on this replica")
            deltas = self._fail_all(EngineError(f"replica {self.config.name}: engine step failed: "
                                                f"{type(exc).__name__}: {exc}"))
        t1 = time.perf_counter()
        self.num_steps += 1
        # Heartbeats are far apart, so the load is read at most every LOAD_READ_INTERVAL while
        # busy, and always once the engine goes idle (so an idle replica never reports stale KV use).
        if t1 >= self._next_load_read or not self.engine.has_unfinished_requests():
            self._load = self._read_load()
            self._next_load_read = t1 + LOAD_READ_INTERVAL
        if deltas:
            self._output(deltas)
        # What serving adds to each step, reported at exit: should stay a few % of step time.
        self.seconds_in_engine += t1 - t0
        self.seconds_in_server += time.perf_counter() - t1

    def _output(self, deltas: list) -> None:
        """Hand deltas on: to the text thread (which sends them), or straight out."""
        if self.text is not None:
            self.text.submit(deltas, self._load)
        else:
            self._send_deltas(deltas, self._load)

    def _send_deltas(self, deltas: list, load) -> None:
        if load is _DISCARD:
            return
        pop = self._prompt_ids.pop
        self.io.send(StepOutput(deltas=[delta_wire(d, pop(d.request_id, None)) for d in deltas],
                                load=load if load is not None else self._load))

    def _discard_engine_finals(self) -> None:
        """Step once to collect the engine's finals of requests already answered (or that nobody
        tracks any more); the text stage still sees them so its per-request state goes too."""
        try:
            deltas = self.engine.step()
        except Exception:
            log.exception("engine step raised while discarding finals")
            return
        if self.text is not None and deltas:
            self.text.submit(deltas, _DISCARD)

    def _fail_all(self, error: InferClusterError) -> list:
        from infer_cluster.protocol import RequestDelta
        deltas = []
        for rid in list(self._active_request_ids()):
            self.engine.abort(rid)
            deltas.append(RequestDelta(request_id=rid, finish_reason="error", error=error.to_dict()))
        if self.text is not None:
            # The error finals go out first; the text stage then ends these requests, and the
            # engine's own abort finals below find nothing left to report.
            self.text.submit(deltas, self._load)
            deltas = []
        self._discard_engine_finals()
        return deltas

    def _active_request_ids(self) -> list:
        requests = getattr(getattr(self.engine, "scheduler", None), "requests", {})
        return list(requests)

    # ------------------------------------------------------------------ load

    def _read_load(self) -> ReplicaLoad:
        s = self.engine.stats()
        return ReplicaLoad(num_running=s.get("num_running", 0), num_waiting=s.get("num_waiting", 0),
                           num_requests=s.get("num_running", 0) + s.get("num_waiting", 0),
                           num_free_blocks=s.get("num_free_blocks", 0),
                           num_total_blocks=s.get("num_total_blocks", 0),
                           num_preemptions=s.get("num_preemptions", 0),
                           prefix_cache_hit_tokens=s.get("prefix_cache_hit_tokens", 0),
                           num_generated_tokens=s.get("num_generated_tokens", 0),
                           num_host_blocks=s.get("num_host_blocks", 0),
                           num_host_used_blocks=s.get("num_host_used_blocks", 0),
                           prefix_cache_hit_tokens_host=s.get("prefix_cache_hit_tokens_host", 0),
                           num_swapped_out=s.get("num_swapped_out", 0),
                           num_prefilling=s.get("num_prefilling", 0),
                           num_generating=s.get("num_generating", 0),
                           num_spec_draft_tokens=s.get("num_spec_draft_tokens", 0),
                           num_spec_accepted_tokens=s.get("num_spec_accepted_tokens", 0),
                           spec_draft_tokens_per_position=list(s.get("spec_draft_tokens_per_position", [])),
                           spec_accepted_tokens_per_position=list(s.get("spec_accepted_tokens_per_position", [])))

    def _load_snapshot(self) -> ReplicaLoad:
        return self._load  # replaced (never mutated) by the engine loop, so safe to read

    # ------------------------------------------------------------------ handlers

    def _send_error(self, request_id: str, error: InferClusterError) -> None:
        self._output([_error_delta(request_id, error)])  # in order with the step outputs

    def _on_dispatch(self, msg: DispatchRequest) -> None:
        try:
            params = SamplingParams.from_dict(msg.sampling_params)
            prompt = prompt_of(msg, self.engine.tokenizer)  # text, token ids, or rendered chat
            rid = self.engine.add_request(prompt, params, msg.request_id, msg.priority,
                                          resume_token_ids=msg.resume_token_ids or None)
        except InferClusterError as exc:
            log.info("request %s refused: %s", msg.request_id, exc)
            self._send_error(msg.request_id, exc)
            return
        except Exception as exc:
            log.exception("request %s: add_request raised", msg.request_id)
            self._send_error(msg.request_id, EngineError(f"{type(exc).__name__}: {exc}"))
            return
        self._prompt_ids[rid] = self.engine.prompt_token_ids(rid)
        if self.text is not None:
            self.text.add(rid, self._prompt_ids[rid], params.stop, msg.resume_token_ids or (),
                          logprob_bytes=params.logprob_bytes)
        if msg.resume_token_ids:
            log.info("resuming request %s after %d delivered token(s)", rid, len(msg.resume_token_ids))

    def _on_abort(self, msg) -> None:
        for rid in msg.request_ids:
            if self.engine.abort(rid):
                log.debug("aborted request %s", rid)

    def _on_resize_kv(self, msg: ResizeKV) -> None:
        """Between steps (the engine loop runs handlers only there): a new KV pool. Requests
        that do not fit go back to waiting; none ends. The answer carries the new capacity."""
        try:
            capacity = self.engine.reset_cache(msg.num_kv_blocks, msg.kv_cache_dtype)
        except InferClusterError as exc:
            ok, message = False, str(exc)
        except Exception as exc:  # a device fault while reallocating: report it, keep serving
            log.exception("replica %s: resize failed", self.config.name)
            ok, message = False, f"{type(exc).__name__}: {exc}"
        else:
            ok = True
            message = (f"KV pool now {capacity['num_total_blocks']} blocks of "
                       f"{capacity['block_size']} tokens ({capacity['kv_cache_dtype']})")
            self.io.set_capacity(capacity)
        log.info("replica %s: resize to %s blocks / %s: %s", self.config.name,
                 msg.num_kv_blocks or "same bytes", msg.kv_cache_dtype or "same dtype", message)
        if self.text is not None:
            self.text.flush()  # step outputs with the old load go out before the answer
        self._load = self._read_load()
        self.io.send(ResizeDone(ticket=msg.ticket, ok=ok, message=message,
                                capacity=self.io.capacity, load=self._load))

    def _set_state(self, state: ReplicaState, reason: str) -> None:
        if state is self.state:
            return
        log.info("replica %s: %s -> %s (%s)", self.config.name, self.state.value, state.value, reason)
        self.state = state
        self.io.send(ReplicaStateChange(state=state.value, reason=reason))

    def _on_pause(self, msg) -> None:
        self._set_state(ReplicaState.PAUSED, msg.reason or "paused")

    def _on_resume(self, msg) -> None:
        self._exit_when_drained = False
        self.io.closing = False
        self._set_state(ReplicaState.ACTIVE, msg.reason or "resumed")

    def _begin_drain(self, reason: str, exit_after: bool) -> None:
        self._exit_when_drained = self._exit_when_drained or exit_after
        if self._exit_when_drained and not self.engine.has_unfinished_requests():
            # Exiting with nothing in flight: `serve` stops the coordinator together with the
            # replicas, so it may be gone before this state change; losing it loses nothing.
            self.io.closing = True
        self._set_state(ReplicaState.DRAINING, reason)

    def _on_drain(self, msg) -> None:
        self._begin_drain(msg.reason or "drain", exit_after=False)

    def _on_shutdown(self, msg) -> None:
        if msg.graceful:
            self._begin_drain(msg.reason or "shutdown", exit_after=True)
        else:
            self.exit_reason = f"shutdown: {msg.reason or 'requested'}"

    def _on_reregistered(self, msg) -> None:
        """The coordinator forgot us (restart, or it declared us dead): what we hold has been
        re-routed or failed there, so finishing it would only waste KV and compute."""
        ids = self._active_request_ids()
        for rid in ids:
            self.engine.abort(rid)
        self._prompt_ids.clear()
        if ids:
            log.warning("dropped %d request(s) after re-registering (%s)", len(ids), msg)
            self._discard_engine_finals()  # nobody tracks these ids any more

    def _check_drained(self) -> None:
        if self.state is ReplicaState.DRAINING and not self.engine.has_unfinished_requests():
            if self._exit_when_drained:  # nothing left to lose: only the closing notes can drop
                self.io.closing = True
                self.exit_reason = self.exit_reason or "drained"
            self._set_state(ReplicaState.DRAINED, "no requests left")

    def _shutdown(self) -> None:
        n = len(self._active_request_ids())
        reason = self.exit_reason or "stopped"
        if n:
            log.warning("exiting with %d request(s) in flight; the coordinator re-routes them", n)
        self.state = ReplicaState.STOPPING
        if self.text is not None:
            if not self.text.flush(timeout=5.0):
                log.warning("text thread did not finish its queue within 5 s")
            self.text.close()
        self.io.stop(goodbye=reason)
        log.info("replica %s stopped: %s (%d steps; %.2f s in engine.step, %.2f s sending outputs)",
                 self.config.name, reason, self.num_steps, self.seconds_in_engine,
                 self.seconds_in_server)


def _error_delta(request_id: str, error: InferClusterError):
    from infer_cluster.protocol import RequestDelta
    return RequestDelta(request_id=request_id, finish_reason="error", error=error.to_dict())
