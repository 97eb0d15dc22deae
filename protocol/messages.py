"""Every wire message as a typed dataclass, one per kind.

Owns: the structs that cross a socket (client <-> coordinator <-> replica), their `to_wire()`
(a plain map with `"v"` and `"k"`) and `from_wire()` (validates types, ranges and sizes, raises
`ProtocolError` saying which field of which message is wrong). `MESSAGE_TYPES` maps each kind to
its struct; the import-time check at the bottom fails if a kind has no struct or two.
Never imports torch, never pickles, never trusts a field it has not checked.
The structs embedded in messages (capacity, load, deltas, errors) and the shared field checkers
live in `payloads.py`, the chat structs (messages, tool calls, tools) in `chat.py`; the ones
callers use are re-exported here, so every wire type still imports from this module.

To add a message: add its kind in `protocol/kinds.py`, then a `@dataclass(kw_only=True)` class
here deriving from `Message` with `KIND = ...` and each field declared with `wire(checker)`.
New fields on an existing message must have defaults (old peers omit them; unknown keys are
ignored), so adding one needs no version bump.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, ClassVar, Optional

from .errors import ProtocolError
from .fields import (MAX_NAME_CHARS, MAX_TEXT_CHARS, Struct, boolean, integer, list_of, number,
                     one_of, optional, plain_map, string, struct, token_ids as token_id_list, wire,
                     _type_name)
from .kinds import (ALL_KINDS, PROTOCOL_VERSION, ConnectionKind, ControlKind, LifecycleKind,
                    ReplyKind, RequestKind, kind_from_number)
from .chat import MAX_CHAT_MESSAGES, MAX_TOOLS, ChatMessage, ChatTool, ToolCall  # noqa: F401
from .payloads import (CONTROL_ACTIONS, COUNT, KV_CACHE_DTYPES, NAME, PRIORITY, REPLICA_STATES,
                       REQUEST_ID, ReplicaCapacity, ReplicaLoad, ReplicaState)
# Re-exported: callers import every wire type from this module.
from .payloads import DeltaPayload, ErrorInfo, delta_wire  # noqa: F401


# ---------------------------------------------------------------- message base

@dataclass(kw_only=True)
class Message(Struct):
    """A struct that travels as one frame: `{"v": version, "k": kind, **fields}`."""

    KIND: ClassVar[enum.IntEnum]

    def to_wire(self) -> dict:
        data = self.to_dict()
        data["v"] = PROTOCOL_VERSION
        data["k"] = int(self.KIND)
        return data

    @classmethod
    def from_wire(cls, data: Any) -> "Message":
        """Validate a decoded map and build the message of its kind.

        Called on `Message` it accepts any kind; on a subclass, only that kind."""
        if not isinstance(data, dict):
            raise ProtocolError(f"a message must be a map, got {_type_name(data)}")
        version = data.get("v")
        if type(version) is not int or version != PROTOCOL_VERSION:
            raise ProtocolError(
                f"peer speaks protocol version {version!r}, this side speaks {PROTOCOL_VERSION}; "
                "run the same infer-cluster release on clients, coordinator and replicas")
        number_ = data.get("k")
        if isinstance(number_, bool) or not isinstance(number_, int):
            raise ProtocolError(f"message kind must be an integer, got {_type_name(number_)}")
        kind = kind_from_number(number_)
        if kind is None:
            raise ProtocolError(f"unknown message kind {number_}; the peer may be newer than this side")
        target = MESSAGE_TYPES[kind]
        if cls is not Message and target is not cls:
            raise ProtocolError(f"expected a {cls.KIND.name} message, got {kind.name}")
        return target.from_dict(data, kind.name)


# ---------------------------------------------------------------- connection

@dataclass(kw_only=True)
class Hello(Message):
    KIND = ConnectionKind.HELLO
    replica_name: str = wire(string(MAX_NAME_CHARS, min_len=1))
    capacity: ReplicaCapacity = wire(struct(ReplicaCapacity))
    pid: int = wire(COUNT, default=0)
    host: str = wire(NAME, default="")
    # Same value on HELLO retries of one registration attempt, so a retry that crosses the
    # HELLO_ACK is recognised as a duplicate instead of a re-registration.
    session: str = wire(string(64), default="")


@dataclass(kw_only=True)
class HelloAck(Message):
    KIND = ConnectionKind.HELLO_ACK
    coordinator: str = wire(NAME, default="")
    heartbeat_interval: float = wire(number(0.01, 3600.0), default=1.0)
    num_replicas: int = wire(COUNT, default=0)
    model: str = wire(NAME, default="")
    instance: str = wire(string(64), default="")  # see Pong


@dataclass(kw_only=True)
class Heartbeat(Message):
    KIND = ConnectionKind.HEARTBEAT
    state: str = wire(one_of(*REPLICA_STATES), default=ReplicaState.ACTIVE.value)
    load: ReplicaLoad = wire(struct(ReplicaLoad), default_factory=ReplicaLoad)


@dataclass(kw_only=True)
class HeartbeatAck(Message):
    KIND = ConnectionKind.HEARTBEAT_ACK


@dataclass(kw_only=True)
class ClientHello(Message):
    KIND = ConnectionKind.CLIENT_HELLO
    client_name: str = wire(NAME, default="")


@dataclass(kw_only=True)
class Ping(Message):
    KIND = ConnectionKind.PING


@dataclass(kw_only=True)
class Pong(Message):
    KIND = ConnectionKind.PONG
    # Random per coordinator process: a client that sees it change knows its in-flight
    # requests died with the previous coordinator.
    instance: str = wire(string(64), default="")


@dataclass(kw_only=True)
class Goodbye(Message):
    KIND = ConnectionKind.GOODBYE
    reason: str = wire(string(4096), default="")


@dataclass(kw_only=True)
class Reregister(Message):
    KIND = ConnectionKind.REREGISTER
    reason: str = wire(string(4096), default="")


# ---------------------------------------------------------------- requests

def _check_one_prompt(msg) -> None:
    given = (msg.prompt is not None) + (msg.prompt_token_ids is not None) + (msg.messages is not None)
    if given != 1:
        raise ProtocolError(f"{msg.KIND.name} {msg.request_id!r} needs exactly one of "
                            "'prompt' (text), 'prompt_token_ids' and 'messages' (chat)")
    if msg.tools is not None and msg.messages is None:
        raise ProtocolError(f"{msg.KIND.name} {msg.request_id!r} has 'tools' but no 'messages': "
                            "tools are for chat requests")


# The functions a chat request offers the model, rendered into its chat template.
_TOOLS = optional(list_of(struct(ChatTool), MAX_TOOLS))


@dataclass(kw_only=True)
class SubmitRequest(Message):
    """A client's request. `sampling_params` is checked by `SamplingParams.from_dict` at the
    coordinator (bad values are an `invalid_request` reply, not a protocol error)."""

    KIND = RequestKind.SUBMIT
    request_id: str = wire(REQUEST_ID)
    prompt: Optional[str] = wire(optional(string(MAX_TEXT_CHARS)), default=None)
    prompt_token_ids: Optional[list] = wire(optional(token_id_list()), default=None)
    sampling_params: dict = wire(plain_map(), default_factory=dict)
    priority: int = wire(PRIORITY, default=0)
    timeout: Optional[float] = wire(optional(number(0.001, 7 * 24 * 3600.0)), default=None)
    # A chat conversation instead of a prompt, rendered by the replica's chat template.
    messages: Optional[list] = wire(optional(list_of(struct(ChatMessage), MAX_CHAT_MESSAGES)),
                                    default=None)
    tools: Optional[list] = wire(_TOOLS, default=None)

    def validate(self) -> None:
        _check_one_prompt(self)


@dataclass(kw_only=True)
class CancelRequest(Message):
    KIND = RequestKind.CANCEL
    request_id: str = wire(REQUEST_ID)


@dataclass(kw_only=True)
class DispatchRequest(Message):
    """Coordinator -> replica. `resume_token_ids` are tokens the client already has (from a
    replica that died); the engine treats them as generated and emits only what follows."""

    KIND = RequestKind.DISPATCH
    request_id: str = wire(REQUEST_ID)
    prompt: Optional[str] = wire(optional(string(MAX_TEXT_CHARS)), default=None)
    prompt_token_ids: Optional[list] = wire(optional(token_id_list()), default=None)
    sampling_params: dict = wire(plain_map(), default_factory=dict)
    priority: int = wire(PRIORITY, default=0)
    resume_token_ids: list = wire(token_id_list(), default_factory=list)
    # A chat conversation instead of a prompt, rendered by the replica's chat template.
    messages: Optional[list] = wire(optional(list_of(struct(ChatMessage), MAX_CHAT_MESSAGES)),
                                    default=None)
    tools: Optional[list] = wire(_TOOLS, default=None)

    def validate(self) -> None:
        _check_one_prompt(self)


@dataclass(kw_only=True)
class AbortRequest(Message):
    KIND = RequestKind.ABORT
    request_ids: list = wire(list_of(REQUEST_ID))


# ---------------------------------------------------------------- replies

@dataclass(kw_only=True)
class DeltaReply(Message):
    """Coordinator -> client: deltas of that client's requests (batched per engine step)."""

    KIND = ReplyKind.DELTA
    deltas: list = wire(list_of(struct(DeltaPayload)), default_factory=list)


@dataclass(kw_only=True)
class StepOutput(Message):
    """Replica -> coordinator: every delta one engine step produced, plus the current load."""

    KIND = ReplyKind.STEP_OUTPUT
    # Decoded: DeltaPayload structs. To send, the replica may pass `delta_wire` maps instead.
    deltas: list = wire(list_of(struct(DeltaPayload)), default_factory=list)
    load: Optional[ReplicaLoad] = wire(optional(struct(ReplicaLoad)), default=None)


@dataclass(kw_only=True)
class ErrorReply(Message):
    """A message could not be accepted. `request_id` is set when the error is about a request
    that is not tracked (otherwise the request ends with an error delta instead)."""

    KIND = ReplyKind.ERROR
    code: str = wire(string(64, min_len=1))
    message: str = wire(string(64 * 1024), default="")
    request_id: Optional[str] = wire(optional(REQUEST_ID), default=None)


@dataclass(kw_only=True)
class StatusReply(Message):
    KIND = ReplyKind.STATUS_REPLY
    coordinator: dict = wire(plain_map(), default_factory=dict)
    replicas: list = wire(list_of(plain_map(), 4096), default_factory=list)


@dataclass(kw_only=True)
class ControlReply(Message):
    KIND = ReplyKind.CONTROL_REPLY
    ok: bool = wire(boolean(), default=True)
    message: str = wire(string(64 * 1024), default="")
    replicas: list = wire(list_of(NAME, 4096), default_factory=list)
    # RESIZE: the replica's capacity after the change (None for the other actions).
    capacity: Optional[ReplicaCapacity] = wire(optional(struct(ReplicaCapacity)), default=None)


# ---------------------------------------------------------------- control

@dataclass(kw_only=True)
class Pause(Message):
    KIND = ControlKind.PAUSE
    reason: str = wire(string(4096), default="")


@dataclass(kw_only=True)
class Resume(Message):
    KIND = ControlKind.RESUME
    reason: str = wire(string(4096), default="")


@dataclass(kw_only=True)
class Drain(Message):
    KIND = ControlKind.DRAIN
    reason: str = wire(string(4096), default="")


@dataclass(kw_only=True)
class Shutdown(Message):
    KIND = ControlKind.SHUTDOWN
    graceful: bool = wire(boolean(), default=True)
    reason: str = wire(string(4096), default="")


@dataclass(kw_only=True)
class StatusRequest(Message):
    KIND = ControlKind.STATUS


@dataclass(kw_only=True)
class ControlRequest(Message):
    """Client (operator) -> coordinator: apply `action` to one replica (by name) or to all."""

    KIND = ControlKind.CONTROL
    action: str = wire(one_of(*CONTROL_ACTIONS))
    replica: Optional[str] = wire(optional(NAME), default=None)


def _check_resize(msg) -> None:
    if msg.num_kv_blocks is None and msg.kv_cache_dtype is None:
        raise ProtocolError(f"{msg.KIND.name} needs num_kv_blocks, kv_cache_dtype or both")


@dataclass(kw_only=True)
class ResizeRequest(Message):
    """Client (operator) -> coordinator: give one replica a new KV pool (block count and/or
    storage dtype). Answered with a CONTROL_REPLY carrying the new capacity."""

    KIND = ControlKind.RESIZE
    replica: str = wire(string(MAX_NAME_CHARS, min_len=1))
    num_kv_blocks: Optional[int] = wire(optional(integer(1, 1 << 40)), default=None)
    kv_cache_dtype: Optional[str] = wire(optional(one_of(*KV_CACHE_DTYPES)), default=None)

    def validate(self) -> None:
        _check_resize(self)


@dataclass(kw_only=True)
class ResizeKV(Message):
    """Coordinator -> replica: apply a resize between steps, answer with RESIZE_DONE `ticket`."""

    KIND = ControlKind.RESIZE_KV
    ticket: str = wire(string(64, min_len=1))
    num_kv_blocks: Optional[int] = wire(optional(integer(1, 1 << 40)), default=None)
    kv_cache_dtype: Optional[str] = wire(optional(one_of(*KV_CACHE_DTYPES)), default=None)

    def validate(self) -> None:
        _check_resize(self)


# ---------------------------------------------------------------- lifecycle

@dataclass(kw_only=True)
class ReplicaStateChange(Message):
    KIND = LifecycleKind.REPLICA_STATE
    state: str = wire(one_of(*REPLICA_STATES))
    reason: str = wire(string(4096), default="")


@dataclass(kw_only=True)
class ResizeDone(Message):
    """Replica -> coordinator: the outcome of RESIZE_KV `ticket`; the capacity and load now
    (unchanged when `ok` is false)."""

    KIND = LifecycleKind.RESIZE_DONE
    ticket: str = wire(string(64, min_len=1))
    ok: bool = wire(boolean(), default=True)
    message: str = wire(string(64 * 1024), default="")
    capacity: Optional[ReplicaCapacity] = wire(optional(struct(ReplicaCapacity)), default=None)
    load: Optional[ReplicaLoad] = wire(optional(struct(ReplicaLoad)), default=None)


def _build_message_types() -> dict[enum.IntEnum, type[Message]]:
    """Every kind has exactly one struct (SGLang-style import-time check)."""
    table: dict[enum.IntEnum, type[Message]] = {}

    def walk(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from walk(sub)

    for cls in walk(Message):
        kind = cls.__dict__.get("KIND")
        if kind is None:
            raise RuntimeError(f"{cls.__name__} derives from Message but declares no KIND")
        if kind in table:
            raise RuntimeError(f"{kind!r} has two structs: {table[kind].__name__}, {cls.__name__}")
        table[kind] = cls
    missing = [k for k in ALL_KINDS if k not in table]
    if missing:
        raise RuntimeError(f"message kinds without a struct: {missing}")
    return table


MESSAGE_TYPES: dict[enum.IntEnum, type[Message]] = _build_message_types()
