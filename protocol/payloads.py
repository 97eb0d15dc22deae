"""The structs carried inside wire messages, and the field specs they share.

Owns: `ReplicaState`, the embedded structs (`ErrorInfo`, `ReplicaCapacity`, `ReplicaLoad`,
`MetricsInfo`, `DeltaPayload`), the hand-written fast encoder `delta_wire` (one per running
request per step, kept equal to `DeltaPayload` by a unit test) and the reusable field checkers
(`REQUEST_ID`, `COUNT`, ...). `messages.py` builds every message from these and re-exports
them. The chat structs (`ChatMessage`, `ChatTool`, ...) are chat.py's. Never imports torch,
never pickles.

To extend: a struct used by more than one message goes here; fields are only ever added, with
defaults.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional

from .errors import ProtocolError
from .fields import (MAX_ID_CHARS, MAX_LIST_ITEMS, MAX_NAME_CHARS, MAX_TEXT_CHARS, Struct,
                     integer, list_of, number, one_of, optional, string, struct,
                     token_ids as token_id_list, wire, _type_name, _w)
from .outputs import FinishReason, RequestDelta, RequestMetrics
# Re-exported: the chat structs live in chat.py.
from .chat import MAX_CHAT_MESSAGES, ChatMessage  # noqa: F401


class ReplicaState(str, enum.Enum):
    """A replica's lifecycle as the replica reports it and the coordinator tracks it."""

    STARTING = "starting"    # connected, HELLO not yet acknowledged
    ACTIVE = "active"        # takes new requests
    PAUSED = "paused"        # keeps its requests but does not step or take new ones
    DRAINING = "draining"    # finishes in-flight requests, takes no new ones
    DRAINED = "drained"      # draining finished; idle until RESUME or SHUTDOWN
    STOPPING = "stopping"    # exiting
    DEAD = "dead"            # coordinator only: heartbeat timeout, socket gone or GOODBYE


REQUEST_ID = string(MAX_ID_CHARS, min_len=1)
NAME = string(MAX_NAME_CHARS)
COUNT = integer(0, 1 << 62)
PRIORITY = integer(-(1 << 31), (1 << 31) - 1)
SECONDS = number(0.0, 7 * 24 * 3600.0)
FINISH_REASONS = tuple(r.value for r in FinishReason)
REPLICA_STATES = tuple(s.value for s in ReplicaState)
CONTROL_ACTIONS = ("pause", "resume", "drain", "shutdown")
KV_CACHE_DTYPES = ("auto", "int8")  # the engine's `kv_cache_dtype` choices (worker/config.py)
WALL_TIME = number(0.0)  # seconds since the epoch
MAX_SPEC_POSITIONS = 64  # proposals a row may carry, by position (the engine allows 32: worker/spec_decode/config.py)


MAX_TOKEN_BYTES = 1024  # a token's raw bytes in a logprob entry (`SamplingParams.logprob_bytes`)


def _logprob_data(depth: int = 0):
    """Logprob entries are nested lists / maps of numbers keyed by token id (int) or string,
    and of tokens' raw bytes (`SamplingParams.logprob_bytes`)."""
    inner = _logprob_data(depth + 1) if depth < 4 else None

    def check(value, where):
        if value is None or isinstance(value, (int, float, str, bool)):
            return value
        if isinstance(value, bytes):
            if len(value) > MAX_TOKEN_BYTES:
                raise ProtocolError(f"{_w(where)} holds {len(value)} bytes for a token; at most "
                                    f"{MAX_TOKEN_BYTES}")
            return value
        if inner is None:
            raise ProtocolError(f"{_w(where)} is nested too deeply")
        if isinstance(value, list):
            if len(value) > MAX_LIST_ITEMS:
                raise ProtocolError(f"{_w(where)} has {len(value)} items; at most {MAX_LIST_ITEMS}")
            return [inner(v, where) for v in value]
        if isinstance(value, dict):
            if len(value) > MAX_LIST_ITEMS:
                raise ProtocolError(f"{_w(where)} has {len(value)} keys; at most {MAX_LIST_ITEMS}")
            for k in value:
                if isinstance(k, bool) or not isinstance(k, (int, str)):
                    raise ProtocolError(f"{_w(where)} keys must be token ids, got {_type_name(k)}")
            return {k: inner(v, where) for k, v in value.items()}
        raise ProtocolError(f"{_w(where)} holds an unsupported value of type {_type_name(value)}")
    return check


# ---------------------------------------------------------------- nested structs (no kind)

@dataclass(kw_only=True)
class ErrorInfo(Struct):
    code: str = wire(string(64, min_len=1))
    message: str = wire(string(64 * 1024), default="")
    param: str = wire(string(64), default="")  # the request field at fault, "" for none

    def to_dict(self) -> dict:
        d = {"code": self.code, "message": self.message}
        if self.param:
            d["param"] = self.param
        return d


@dataclass(kw_only=True)
class ReplicaCapacity(Struct):
    """What a replica can hold; sent once in HELLO."""

    model: str = wire(NAME)
    num_total_blocks: int = wire(COUNT, default=0)
    block_size: int = wire(integer(1, 1 << 20), default=16)
    max_num_seqs: int = wire(integer(1, 1 << 30), default=1)
    max_model_len: int = wire(integer(1, 1 << 30), default=1)
    kv_cache_dtype: str = wire(string(16), default="auto")  # may change with RESIZE_KV
    speculative: str = wire(string(32), default="")  # speculative_config.method; "" = off


@dataclass(kw_only=True)
class ReplicaLoad(Struct):
    """How busy a replica is; sent with every heartbeat."""

    num_running: int = wire(COUNT, default=0)
    num_waiting: int = wire(COUNT, default=0)
    num_requests: int = wire(COUNT, default=0)
    num_free_blocks: int = wire(COUNT, default=0)
    num_total_blocks: int = wire(COUNT, default=0)
    num_preemptions: int = wire(COUNT, default=0)
    prefix_cache_hit_tokens: int = wire(COUNT, default=0)
    num_generated_tokens: int = wire(COUNT, default=0)
    tokens_per_s: float = wire(number(0.0), default=0.0)
    # host KV tier (kv_offload_gib); all 0 when it is off
    num_host_blocks: int = wire(COUNT, default=0)
    num_host_used_blocks: int = wire(COUNT, default=0)
    prefix_cache_hit_tokens_host: int = wire(COUNT, default=0)
    num_swapped_out: int = wire(COUNT, default=0)
    num_prefilling: int = wire(COUNT, default=0)  # running, prompt (or recompute) not done
    num_generating: int = wire(COUNT, default=0)  # running, making new tokens
    # speculative decoding (speculative_config); 0 and [] when it is off
    num_spec_draft_tokens: int = wire(COUNT, default=0)  # tokens proposed and verified
    num_spec_accepted_tokens: int = wire(COUNT, default=0)  # ... of which the sampler agreed with
    # the same by position in a row's proposals (index j: the (j + 1)-th proposal)
    spec_draft_tokens_per_position: list = wire(list_of(COUNT, MAX_SPEC_POSITIONS), default_factory=list)
    spec_accepted_tokens_per_position: list = wire(list_of(COUNT, MAX_SPEC_POSITIONS), default_factory=list)


@dataclass(kw_only=True)
class MetricsInfo(Struct):
    """Wire form of `RequestMetrics` (replica wall-clock seconds)."""

    arrival_time: float = wire(WALL_TIME)
    first_scheduled_time: Optional[float] = wire(optional(WALL_TIME), default=None)
    first_token_time: Optional[float] = wire(optional(WALL_TIME), default=None)
    finish_time: Optional[float] = wire(optional(WALL_TIME), default=None)


@dataclass(kw_only=True)
class DeltaPayload(Struct):
    """One request's progress in one engine step (the wire form of `RequestDelta`)."""

    request_id: str = wire(REQUEST_ID)
    token_ids: list = wire(token_id_list(), default_factory=list)
    text: str = wire(string(MAX_TEXT_CHARS), default="")
    logprobs: Optional[list] = wire(optional(list_of(_logprob_data(), 1 << 20)), default=None)
    finish_reason: Optional[str] = wire(optional(one_of(*FINISH_REASONS)), default=None)
    error: Optional[ErrorInfo] = wire(optional(struct(ErrorInfo)), default=None)
    num_prompt_tokens: int = wire(COUNT, default=0)
    num_cached_tokens: int = wire(COUNT, default=0)
    num_cached_tokens_host: int = wire(COUNT, default=0)
    # The prompt as the engine tokenized it; sent once, with a request's first delta.
    prompt_token_ids: Optional[list] = wire(optional(token_id_list()), default=None)
    metrics: Optional[MetricsInfo] = wire(optional(struct(MetricsInfo)), default=None)

    def to_dict(self) -> dict:
        # Hand-written: one of these crosses two sockets per generated token. Fields at their
        # default are left out (the decoder restores them).
        d = {"request_id": self.request_id, "token_ids": self.token_ids, "text": self.text}
        if self.logprobs is not None:
            d["logprobs"] = self.logprobs
        if self.finish_reason is not None:
            d["finish_reason"] = self.finish_reason
        if self.error is not None:
            d["error"] = self.error.to_dict()
        if self.num_prompt_tokens:
            d["num_prompt_tokens"] = self.num_prompt_tokens
        if self.num_cached_tokens:
            d["num_cached_tokens"] = self.num_cached_tokens
        if self.num_cached_tokens_host:
            d["num_cached_tokens_host"] = self.num_cached_tokens_host
        if self.prompt_token_ids is not None:
            d["prompt_token_ids"] = self.prompt_token_ids
        if self.metrics is not None:
            d["metrics"] = self.metrics.to_dict()
        return d

    def validate(self) -> None:
        if self.error is not None and self.finish_reason is None:
            raise ProtocolError(f"delta for {self.request_id!r} has an error but no finish_reason")

    @classmethod
    def from_delta(cls, delta: RequestDelta, prompt_token_ids: Optional[list] = None) -> "DeltaPayload":
        error = None
        if delta.error is not None:
            error = ErrorInfo(code=str(delta.error.get("code", "engine")),
                              message=str(delta.error.get("message", "")),
                              param=str(delta.error.get("param") or ""))
        return cls(request_id=delta.request_id, token_ids=list(delta.token_ids), text=delta.text,
                   logprobs=delta.logprobs, finish_reason=delta.finish_reason, error=error,
                   num_prompt_tokens=delta.num_prompt_tokens,
                   num_cached_tokens=delta.num_cached_tokens,
                   num_cached_tokens_host=delta.num_cached_tokens_host, prompt_token_ids=prompt_token_ids,
                   metrics=MetricsInfo(**delta.metrics.to_dict()) if delta.metrics is not None else None)

    def to_delta(self) -> RequestDelta:
        return RequestDelta(request_id=self.request_id, token_ids=list(self.token_ids),
                            text=self.text, logprobs=self.logprobs,
                            finish_reason=self.finish_reason,
                            error=self.error.to_dict() if self.error is not None else None,
                            num_prompt_tokens=self.num_prompt_tokens,
                            num_cached_tokens=self.num_cached_tokens,
                            num_cached_tokens_host=self.num_cached_tokens_host,
                            metrics=(RequestMetrics(**self.metrics.to_dict())
                                     if self.metrics is not None else None))


def delta_wire(delta: RequestDelta, prompt_token_ids: Optional[list] = None) -> dict:
    """`DeltaPayload.from_delta(delta, prompt_token_ids).to_dict()` without building the struct:
    the replica sends one per running request per step. A unit test keeps the two identical."""
    d = {"request_id": delta.request_id, "token_ids": delta.token_ids, "text": delta.text}
    if delta.logprobs is not None:
        d["logprobs"] = delta.logprobs
    if delta.finish_reason is not None:
        d["finish_reason"] = delta.finish_reason
    if delta.error is not None:
        d["error"] = {"code": str(delta.error.get("code", "engine")),
                      "message": str(delta.error.get("message", ""))}
        if delta.error.get("param"):
            d["error"]["param"] = str(delta.error["param"])
    if delta.num_prompt_tokens:
        d["num_prompt_tokens"] = delta.num_prompt_tokens
    if delta.num_cached_tokens:
        d["num_cached_tokens"] = delta.num_cached_tokens
    if delta.num_cached_tokens_host:
        d["num_cached_tokens_host"] = delta.num_cached_tokens_host
    if prompt_token_ids is not None:
        d["prompt_token_ids"] = prompt_token_ids
    if delta.metrics is not None:
        d["metrics"] = delta.metrics.to_dict()
    return d
