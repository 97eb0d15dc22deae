"""`InferenceClient`: submit requests to an infer-cluster coordinator and get results back.

Owns: the public client API (`submit` -> `RequestHandle`, `generate`, `status`, `control`,
`close`), request-id bookkeeping, and routing each reply from the IO thread to its handle.
Thread-safe: any thread may submit, wait, stream or cancel; all socket work happens on the one IO
thread (`client/io_thread.py`). Never imports torch (the client runs where no GPU stack is).

Connecting: until the coordinator first answers, every call waits at most `connect_timeout`
seconds and then fails with `UnreachableError` saying why (nothing listening, the replica port,
a refused key, auth on one side only); a refused key or a wrong port fails at once.
Auth: `auth=DIR` (a folder from `infer-cluster keygen`, full or exported) makes the socket a CURVE
client with the `client` key (or `admin`, whichever the folder has; `auth_role` picks).

Usage::

    with InferenceClient("tcp://127.0.0.1:5555") as client:
        handle = client.submit("Hello", SamplingParams(max_tokens=32, temperature=0))
        for delta in handle.stream():
            print(delta.text, end="", flush=True)
"""

from __future__ import annotations

import collections
import logging
import threading
import time
import uuid
from concurrent.futures import Future
from typing import Callable, Optional, Sequence, Union

import zmq

from infer_cluster.protocol import (InvalidRequestError, NoReplicaError, OverloadedError, ProtocolError,
                                    RequestDelta, RequestOutput, SamplingParams, UnreachableError)
from infer_cluster.protocol import codec
from infer_cluster.protocol.chat import messages_from_openai, tools_from_openai
from infer_cluster.protocol.fields import MAX_TOKEN_ID
from infer_cluster.protocol.kinds import ConnectionKind, ReplyKind
from infer_cluster.protocol.messages import (CancelRequest, ChatMessage, ControlRequest, DeltaPayload,
                               Message, ResizeRequest, StatusRequest, SubmitRequest)

from . import auth as _auth
from .handle import RequestHandle
from .io_thread import ClientIO, check_address
from .loop_io import LoopIO

log = logging.getLogger("infer_cluster.client")

Prompt = Union[str, Sequence[int]]


def _check_prompt(prompt) -> tuple[Optional[str], Optional[list]]:
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidRequestError("the prompt is empty")
        return prompt, None
    if isinstance(prompt, (list, tuple)):
        ids = list(prompt)
        if not ids:
            raise InvalidRequestError("the prompt is empty")
        if not all(type(t) is int and 0 <= t <= MAX_TOKEN_ID for t in ids):
            raise InvalidRequestError(f"a token-id prompt must be a list of integers in "
                                      f"0..{MAX_TOKEN_ID}")
        return None, ids
    raise InvalidRequestError(f"the prompt must be a string or a list of token ids, "
                              f"got {type(prompt).__name__}")


def _check_messages(messages) -> list[ChatMessage]:
    """Chat turns as OpenAI's `{"role", "content"}` maps (assistant turns may carry
    `tool_calls`, tool turns `tool_call_id`), or `ChatMessage`s."""
    return messages_from_openai(messages)


def _check_params(sampling_params) -> SamplingParams:
    if sampling_params is None:
        return SamplingParams()
    if isinstance(sampling_params, SamplingParams):
        return sampling_params
    if isinstance(sampling_params, dict):
        return SamplingParams.from_dict(sampling_params)
    raise InvalidRequestError(f"sampling_params must be SamplingParams or a dict, "
                              f"got {type(sampling_params).__name__}")


class InferenceClient:
    """A connection to one coordinator. Cheap requests, one socket, one IO thread."""

    def __init__(self, address: str = "tcp://127.0.0.1:5555", *, name: str = "",
                 heartbeat_interval: float = 1.0, coordinator_timeout: float = 30.0,
                 max_frame_bytes: int = codec.DEFAULT_MAX_FRAME_BYTES, socket_hwm: int = 100_000,
                 auth: _auth.AuthArg = None, auth_role: Optional[str] = None,
                 connect_timeout: float = 5.0, io_loop=None):
        """`auth`: a key folder (or `AuthKeys`); None = no auth. `auth_role`: "client" or
        "admin" (default: client if the folder has its secret key, else admin). `io_loop`: do
        the socket work on this running asyncio loop instead of an IO thread (`client/loop_io.py`;
        create the client on that loop). Raises ValueError (bad address, bad timing) or
        `AuthError` (unusable key folder)."""
        if heartbeat_interval <= 0 or coordinator_timeout <= heartbeat_interval:
            raise ValueError("need 0 < heartbeat_interval < coordinator_timeout")
        if not connect_timeout > 0:
            raise ValueError(f"connect_timeout must be > 0 seconds, got {connect_timeout!r}")
        self.address = check_address(address)
        keys = _auth.resolve(auth)
        role = None
        if keys is not None:
            if auth_role is not None and auth_role not in _auth.CLIENT_PORT_ROLES:
                raise ValueError(f"auth_role must be one of {_auth.CLIENT_PORT_ROLES}, "
                                 f"got {auth_role!r}")
            role = keys.pick_role((auth_role,) if auth_role else ("client", "admin"))
            keys.need_public("coordinator")
        self.auth_role = role
        self.connect_timeout = connect_timeout
        # Calls made before the coordinator first answered: key -> (deadline, fail(message)).
        self._awaiting_connect: dict[object, tuple[float, Callable[[str], None]]] = {}
        # Submits zmq refused before the coordinator first answered (request id, payload): sent
        # again once it answers, unless the connect check failed them first.
        self._unsent: list[tuple[str, bytes]] = []
        self.max_frame_bytes = max_frame_bytes
        self._ctx = zmq.Context(io_threads=1)
        self._lock = threading.Lock()
        self._handles: dict[str, RequestHandle] = {}
        self._waiters: dict[int, collections.deque] = {
            ReplyKind.STATUS_REPLY: collections.deque(), ReplyKind.CONTROL_REPLY: collections.deque()}
        self.model: str = ""
        self.num_replicas: int = 0
        self.last_error: Optional[Exception] = None
        self._instance = ""
        self._closed = False
        io_args = (self._ctx, address, name or "client", self._on_message, self._on_silence,
                   heartbeat_interval, coordinator_timeout, socket_hwm, max_frame_bytes)
        try:
            hooks = dict(on_connect_tick=self._on_connect_tick, on_dropped=self._on_dropped)
            self._io = (ClientIO(*io_args, keys=keys, role=role or "client", **hooks) if io_loop is None
                        else LoopIO(io_loop, *io_args, keys=keys, role=role or "client", **hooks))
        except Exception:
            self._closed = True
            self._ctx.term()
            raise
        self._io.start()

    # -------------------------------------------------------------- requests

    def submit(self, prompt: Prompt, sampling_params: Union[SamplingParams, dict, None] = None,
               request_id: Optional[str] = None, priority: int = 0,
               timeout: Optional[float] = None) -> RequestHandle:
        """Send one request; returns at once with its handle. `prompt` is text or token ids;
        `timeout` (seconds) is a deadline enforced by the coordinator (finish_reason
        "timeout", KV freed). Raises `InvalidRequestError` for bad input."""
        return self._submit(prompt, sampling_params, request_id, priority, timeout, None)

    def chat(self, messages: Sequence[dict], sampling_params: Union[SamplingParams, dict, None] = None,
             request_id: Optional[str] = None, priority: int = 0,
             timeout: Optional[float] = None, tools: Optional[Sequence[dict]] = None) -> RequestHandle:
        """Like `submit`, for a conversation: `messages` is a list of `{"role", "content"}`
        maps that the replica renders with its model's chat template (a model without one
        ends the request with `InvalidRequestError`). `tools`: OpenAI's list of
        `{"type": "function", "function": {"name", "description", "parameters"}}`, rendered
        into the template (or, where the template ignores tools, into a system instruction);
        the calls the model writes are in the output text (`<tool_call>` blocks)."""
        return self._submit(None, sampling_params, request_id, priority, timeout, None,
                            messages=messages, tools=tools)

    def _submit(self, prompt, sampling_params, request_id, priority, timeout,
                listener: Optional[Callable[[RequestDelta], None]],
                messages: Optional[Sequence] = None,
                tools: Optional[Sequence] = None) -> RequestHandle:
        chat_tools = None
        if messages is not None:
            if prompt is not None:
                raise InvalidRequestError("give either a prompt or chat messages, not both")
            chat, text, ids = _check_messages(messages), None, None
            chat_tools = tools_from_openai(tools)
        else:
            if tools is not None:
                raise InvalidRequestError("tools are for chat requests (`chat`), not prompts")
            chat = None
            text, ids = _check_prompt(prompt)
        params = _check_params(sampling_params)
        rid = request_id if request_id is not None else uuid.uuid4().hex
        if not isinstance(rid, str) or not 0 < len(rid) <= 256:
            raise InvalidRequestError("request_id must be a string of 1..256 characters")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise InvalidRequestError(f"priority must be an integer, got {priority!r}")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or not timeout > 0):
            raise InvalidRequestError(f"timeout must be a positive number of seconds, got {timeout!r}")
        msg = SubmitRequest(request_id=rid, prompt=text, prompt_token_ids=ids,
                            sampling_params=params.to_dict(), priority=priority,
                            timeout=float(timeout) if timeout is not None else None,
                            messages=chat, tools=chat_tools)
        try:
            payload = codec.encode(msg, self.max_frame_bytes)
        except ProtocolError as exc:
            raise InvalidRequestError(str(exc)) from None
        handle = RequestHandle(self, rid, text, ids, listener)
        with self._lock:
            if self._closed:
                raise RuntimeError("the client is closed")
            if rid in self._handles:
                raise InvalidRequestError(f"request id {rid!r} is already in flight on this client")
            self._handles[rid] = handle
            self._await_connect(rid, lambda why: self._fail_handle(rid, why))
        self._io.send(payload)
        return handle

    def generate(self, prompts: Union[Prompt, Sequence[Prompt]], sampling_params=None,
                 timeout: Optional[float] = None) -> list[RequestOutput]:
        """Submit a batch and wait for all; outputs in input order. Like the offline
        `LLM.generate`, a failed request is an output with `finish_reason == "error"`."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = (list(sampling_params) if isinstance(sampling_params, (list, tuple))
                  else [sampling_params] * len(prompts))
        if len(params) != len(prompts):
            raise InvalidRequestError(f"got {len(params)} sampling params for {len(prompts)} prompts")
        handles = [self.submit(p, sp, timeout=timeout) for p, sp in zip(prompts, params)]
        for h in handles:
            h.wait()
        return [h.output for h in handles]

    def _send_cancel(self, request_id: str) -> None:
        self._io.send(codec.encode(CancelRequest(request_id=request_id)))

    # -------------------------------------------------------------- operator calls

    def _call(self, msg: Message, reply_kind: int, timeout: float):
        future: Future = Future()
        with self._lock:
            self._waiters[reply_kind].append(future)
            self._await_connect(future, lambda why: self._fail_waiter(reply_kind, future, why))
        self._io.send(codec.encode(msg))
        try:
            return future.result(timeout)
        except TimeoutError:
            self._fail_waiter(reply_kind, future, "")
            raise TimeoutError(f"no reply from the coordinator at {self.address} in {timeout} s; "
                               "is it running?") from None

    # -------------------------------------------------------------- connecting

    def _await_connect(self, key, fail: Callable[[str], None]) -> None:
        """Under the lock: until the coordinator first answers, `key` fails after
        connect_timeout (checked by the IO thread's `_on_connect_tick`)."""
        if not self._io.is_connected:
            self._awaiting_connect[key] = (time.monotonic() + self.connect_timeout, fail)

    def _on_connect_tick(self, now: float, refusal: Optional[str]) -> None:  # IO thread
        with self._lock:
            due = [(k, fail) for k, (deadline, fail) in self._awaiting_connect.items()
                   if refusal or now >= deadline]
            for k, _ in due:
                del self._awaiting_connect[k]
            if due:  # refused submits of requests that end here are not sent later
                failed = {k for k, _ in due}
                self._unsent = [(rid, p) for rid, p in self._unsent if rid not in failed]
        if due:
            why = self._io.describe_no_answer(self.connect_timeout)
            log.debug("%s", why)  # the caller gets it as UnreachableError
            for _, fail in due:
                fail(why)

    def _fail_handle(self, request_id: str, why: str, error=UnreachableError) -> None:
        with self._lock:
            handle = self._handles.pop(request_id, None)
        if handle is not None:
            handle._deliver(RequestDelta(request_id=request_id, finish_reason="error",
                                         error=error(why).to_dict()))

    def _on_dropped(self, payload) -> None:  # IO thread (or the event loop)
        """zmq would not queue `payload`. Once connected that means the send queue holds
        `socket_hwm` messages the coordinator has not read: a request in it ends now with an
        `overloaded` error instead of waiting for an answer that cannot come. Before the first
        answer it means no connection has worked yet (see below). A dropped cancel leaves the
        request to run."""
        try:
            msg = codec.decode(payload, self.max_frame_bytes)
        except ProtocolError:
            return
        if not isinstance(msg, SubmitRequest):
            return
        with self._lock:
            if not self._io.is_connected:
                # No connection has worked yet: a refused handshake drops zmq's pipe, so this is
                # a connect failure, not a full queue. The connect check fails the request with
                # its reason, or it goes out when the coordinator first answers.
                self._unsent.append((msg.request_id, payload))
                return
        self._fail_handle(msg.request_id, (
            f"request {msg.request_id} was not sent: {self._io.hwm} messages already wait in "
            f"this client's queue to the coordinator at {self.address}, which is not reading "
            "them (overloaded or stopped); retry later"), OverloadedError)

    def _fail_waiter(self, reply_kind: int, future: Future, why: str) -> None:
        with self._lock:
            try:
                self._waiters[reply_kind].remove(future)
            except ValueError:
                return  # answered meanwhile
            self._awaiting_connect.pop(future, None)
        if why:
            future.set_exception(UnreachableError(why))

    def status(self, timeout: float = 5.0) -> dict:
        """Cluster status: {"coordinator": {...stats}, "replicas": [{...per replica}]}."""
        reply = self._call(StatusRequest(), ReplyKind.STATUS_REPLY, timeout)
        return {"coordinator": reply.coordinator, "replicas": reply.replicas}

    def control(self, action: str, replica: Optional[str] = None, timeout: float = 5.0) -> dict:
        """pause / resume / drain / shutdown one replica (by name) or all of them."""
        reply = self._call(ControlRequest(action=action, replica=replica),
                           ReplyKind.CONTROL_REPLY, timeout)
        return {"ok": reply.ok, "message": reply.message, "replicas": reply.replicas}

    def resize(self, replica: str, num_kv_blocks: Optional[int] = None,
               kv_cache_dtype: Optional[str] = None, timeout: float = 130.0) -> dict:
        """Give replica `replica` a new KV pool (blocks and/or `auto`/`int8` storage) while it
        serves; its requests that do not fit are recomputed, none fails. Returns {"ok",
        "message", "replicas", "capacity"} (capacity: the replica's, after the change)."""
        reply = self._call(ResizeRequest(replica=replica, num_kv_blocks=num_kv_blocks,
                                         kv_cache_dtype=kv_cache_dtype),
                           ReplyKind.CONTROL_REPLY, timeout)
        return {"ok": reply.ok, "message": reply.message, "replicas": reply.replicas,
                "capacity": reply.capacity.to_dict() if reply.capacity is not None else None}

    @property
    def num_in_flight(self) -> int:
        with self._lock:
            return len(self._handles)

    # -------------------------------------------------------------- IO-thread callbacks

    def _on_message(self, msg: Message) -> None:
        kind = msg.KIND
        if not self._io.is_connected:
            if kind is ReplyKind.ERROR and msg.code == "protocol" and msg.request_id is None:
                # e.g. the replica port answering CLIENT_HELLO: waiting cannot fix that.
                self._io.refusal = f"the coordinator at {self.address} refused: {msg.message}"
                return
            with self._lock:
                self._io.is_connected = True
                self._awaiting_connect.clear()
                unsent = [payload for rid, payload in self._unsent if rid in self._handles]
                self._unsent.clear()
            for payload in unsent:
                self._io.send_now(payload)
        if kind is ReplyKind.DELTA:
            for payload in msg.deltas:
                self._deliver(payload)
        elif kind in self._waiters:
            with self._lock:
                waiter = self._waiters[kind].popleft() if self._waiters[kind] else None
            if waiter is not None:
                waiter.set_result(msg)
        elif kind is ReplyKind.ERROR:
            self._on_error(msg)
        elif kind is ConnectionKind.PONG:
            self._check_instance(msg.instance)
        elif kind is ConnectionKind.HELLO_ACK:
            self._check_instance(msg.instance)
            self.model, self.num_replicas = msg.model, msg.num_replicas
            # Ping at least as often as this coordinator needs to keep our requests alive.
            self._io.heartbeat_interval = min(self._io.heartbeat_interval, msg.heartbeat_interval)
        else:
            log.warning("ignoring unexpected %s from the coordinator", kind.name)

    def _check_instance(self, instance: str) -> None:
        """A new coordinator process (restart) does not know our in-flight requests."""
        if not instance:
            return
        if self._instance and instance != self._instance:
            self._fail_all(f"the coordinator at {self.address} restarted; its requests were lost")
        self._instance = instance

    def _deliver(self, payload: DeltaPayload) -> None:
        with self._lock:
            handle = self._handles.get(payload.request_id)
        if handle is None:
            return  # cancelled-and-closed or unknown: nothing waits for it
        if handle._deliver(payload.to_delta(), payload.prompt_token_ids):
            with self._lock:
                self._handles.pop(payload.request_id, None)

    def _on_error(self, msg) -> None:
        log.warning("coordinator error (%s): %s", msg.code, msg.message)
        self.last_error = ProtocolError(msg.message) if msg.code == "protocol" else None
        if msg.request_id is not None:
            self._deliver(DeltaPayload.from_delta(RequestDelta(
                request_id=msg.request_id, finish_reason="error",
                error={"code": msg.code, "message": msg.message})))

    def _on_silence(self, seconds: float) -> None:
        """The coordinator has been silent too long: end every open request with an error
        rather than let callers wait forever."""
        self._fail_all(f"lost contact with the coordinator at {self.address} "
                       f"({seconds:.0f} s silent)")

    def _fail_all(self, message: str) -> None:
        with self._lock:
            handles = list(self._handles.values())
            self._handles.clear()
        if handles:
            log.error("%s; failing %d request(s)", message, len(handles))
        error = NoReplicaError(message).to_dict()
        for h in handles:
            h._deliver(RequestDelta(request_id=h.request_id, finish_reason="error", error=error))

    # -------------------------------------------------------------- lifecycle

    def close(self) -> None:
        """Abort what is still running (the coordinator frees its KV blocks) and disconnect."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            handles = list(self._handles.values())
            self._handles.clear()
        self._io.stop()
        for h in handles:
            h._deliver(RequestDelta(request_id=h.request_id, finish_reason="abort"))
        self._ctx.term()

    def __enter__(self) -> "InferenceClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            if not self._closed:
                self.close()
        except Exception:
            pass
