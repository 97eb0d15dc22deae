"""What a request produces: status, finish reasons, streamed deltas and final outputs.

Owns: `RequestStatus` (the request lifecycle), `FinishReason`, `RequestDelta` (what one engine
step adds to one request) and `RequestOutput` (the whole result), and `RequestMetrics` (when the replica saw a request arrive,
first schedule it, make its first token and end it). These are plain data that the
offline `LLM`, the replica, the coordinator and the client all share; each has `to_dict` /
`from_dict` so it can ride inside a wire message. Never imports torch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Optional


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED = 3
    ABORTED = 4
    FAILED = 5

    @property
    def is_finished(self) -> bool:
        return self >= RequestStatus.FINISHED


# Allowed lifecycle transitions; anything else is a bug in the scheduler.
REQUEST_TRANSITIONS: dict[RequestStatus, frozenset[RequestStatus]] = {
    RequestStatus.WAITING: frozenset({RequestStatus.RUNNING, RequestStatus.ABORTED, RequestStatus.FAILED}),
    RequestStatus.RUNNING: frozenset({RequestStatus.PREEMPTED, RequestStatus.FINISHED,
                                      RequestStatus.ABORTED, RequestStatus.FAILED}),
    RequestStatus.PREEMPTED: frozenset({RequestStatus.RUNNING, RequestStatus.ABORTED, RequestStatus.FAILED}),
    RequestStatus.FINISHED: frozenset(),
    RequestStatus.ABORTED: frozenset(),
    RequestStatus.FAILED: frozenset(),
}


class FinishReason(str, enum.Enum):
    STOP = "stop"        # EOS, a stop token or a stop string
    LENGTH = "length"    # max_tokens or max_model_len reached
    ABORT = "abort"      # cancelled by the client or the operator
    ERROR = "error"      # failed; `error` on the output says why
    TIMEOUT = "timeout"  # the request's deadline passed


@dataclass
class RequestMetrics:
    """A request's timing on the replica that ran it (wall clock, `time.time()` seconds; compare
    times of one request only: replicas' clocks may differ). Rides on the final delta.

    `first_scheduled_time`: first admitted into a step (its prefill starts); `first_token_time`:
    the step that sampled its first new token ended; `finish_time`: it ended (for a stop string
    found by the text stage: when the text stage found it). A field is None when the request
    never got there (e.g. aborted while waiting)."""

    arrival_time: float
    first_scheduled_time: Optional[float] = None
    first_token_time: Optional[float] = None
    finish_time: Optional[float] = None

    @property
    def queue_time(self) -> Optional[float]:
        """Seconds from arrival to first schedule."""
        return None if self.first_scheduled_time is None else self.first_scheduled_time - self.arrival_time

    @property
    def prefill_time(self) -> Optional[float]:
        """Seconds from first schedule to the first token (the prompt's prefill, chunks included)."""
        if self.first_token_time is None or self.first_scheduled_time is None:
            return None
        return self.first_token_time - self.first_scheduled_time

    @property
    def time_to_first_token(self) -> Optional[float]:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    def to_dict(self) -> dict:
        d = {"arrival_time": self.arrival_time}
        for name in ("first_scheduled_time", "first_token_time", "finish_time"):
            value = getattr(self, name)
            if value is not None:
                d[name] = value
        return d

    @classmethod
    def from_dict(cls, d: Optional[dict]) -> Optional["RequestMetrics"]:
        if d is None:
            return None
        return cls(arrival_time=d["arrival_time"], first_scheduled_time=d.get("first_scheduled_time"),
                   first_token_time=d.get("first_token_time"), finish_time=d.get("finish_time"))


@dataclass
class RequestDelta:
    """What one step added to one request. `finish_reason` set means this is its last delta."""

    request_id: str
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    # One entry per token: [sampled_logprob, {alt_id: logprob}], and with
    # `SamplingParams.logprob_bytes` a third item, {token_id: bytes} for the sampled token and
    # each alternative.
    logprobs: Optional[list] = None
    finish_reason: Optional[str] = None
    error: Optional[dict] = None  # {"code", "message"} when finish_reason == "error"
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_cached_tokens_host: int = 0  # prompt tokens copied back from the host KV tier
    metrics: Optional[RequestMetrics] = None  # on the final delta (see `RequestMetrics`)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def to_dict(self) -> dict:
        d = {"request_id": self.request_id, "token_ids": list(self.token_ids), "text": self.text}
        if self.logprobs is not None:
            d["logprobs"] = self.logprobs
        if self.finish_reason is not None:
            d["finish_reason"] = self.finish_reason
            d["num_prompt_tokens"] = self.num_prompt_tokens
            d["num_cached_tokens"] = self.num_cached_tokens
            d["num_cached_tokens_host"] = self.num_cached_tokens_host
        if self.error is not None:
            d["error"] = self.error
        if self.metrics is not None:
            d["metrics"] = self.metrics.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "RequestDelta":
        return cls(request_id=d["request_id"], token_ids=list(d.get("token_ids", [])),
                   text=d.get("text", ""), logprobs=d.get("logprobs"),
                   finish_reason=d.get("finish_reason"), error=d.get("error"),
                   num_prompt_tokens=d.get("num_prompt_tokens", 0),
                   num_cached_tokens=d.get("num_cached_tokens", 0),
                   num_cached_tokens_host=d.get("num_cached_tokens_host", 0),
                   metrics=RequestMetrics.from_dict(d.get("metrics")))


class _JoinedText:
    """`RequestOutput.text`: stored as the pieces `apply` appended, joined when read. Appending
    to one growing string copies the whole text at every token, quadratic in the output's
    length (7.7 us an append over a 32,000-token output against 0.2 over 1,000, dev CPU); a
    stream reads `text` far less often than it appends. Reading or assigning it behaves as a
    plain string field (a dataclass field whose default is ``""``)."""

    def __get__(self, obj, owner=None) -> str:
        if obj is None:
            return ""  # the dataclass field's default
        parts = obj.__dict__["_text_parts"]
        if len(parts) != 1:
            obj.__dict__["_text_parts"] = parts = ["".join(parts)]
        return parts[0]

    def __set__(self, obj, value: str) -> None:
        obj.__dict__["_text_parts"] = [value]


@dataclass
class RequestOutput:
    """The whole result of one request (what `LLM.generate` and `RequestHandle.result` return)."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = _JoinedText()  # type: ignore[assignment]  (a str; see _JoinedText)
    finish_reason: Optional[str] = None
    logprobs: Optional[list] = None
    num_cached_tokens: int = 0
    error: Optional[dict] = None
    prompt: Optional[str] = None
    # Prompt tokens served per tier (DashInfer's prefix_len_gpu / prefix_len_cpu):
    # `num_cached_tokens` from the device pool, this from the host tier.
    num_cached_tokens_host: int = 0
    metrics: Optional[RequestMetrics] = None  # from the final delta; None if no replica ended it

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def apply(self, delta: RequestDelta) -> None:
        """Fold one delta into this output (used by clients that stream)."""
        self.token_ids.extend(delta.token_ids)
        if delta.text:
            self.__dict__["_text_parts"].append(delta.text)  # joined when read (_JoinedText)
        if delta.logprobs is not None:
            if self.logprobs is None:
                self.logprobs = []
            self.logprobs.extend(delta.logprobs)  # in place: a new list per token is O(n^2)
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason
            self.error = delta.error
            self.num_cached_tokens = delta.num_cached_tokens
            self.num_cached_tokens_host = delta.num_cached_tokens_host
            self.metrics = delta.metrics

    def to_dict(self) -> dict:
        return {"request_id": self.request_id, "prompt_token_ids": list(self.prompt_token_ids),
                "token_ids": list(self.token_ids), "text": self.text,
                "finish_reason": self.finish_reason, "logprobs": self.logprobs,
                "num_cached_tokens": self.num_cached_tokens, "error": self.error,
                "prompt": self.prompt, "num_cached_tokens_host": self.num_cached_tokens_host,
                "metrics": self.metrics.to_dict() if self.metrics is not None else None}

    @classmethod
    def from_dict(cls, d: dict) -> "RequestOutput":
        out = cls(**{k: d.get(k) for k in ("request_id", "prompt_token_ids", "token_ids", "text",
                                             "finish_reason", "logprobs", "num_cached_tokens",
                                             "error", "prompt")},
                  num_cached_tokens_host=d.get("num_cached_tokens_host") or 0)
        out.metrics = RequestMetrics.from_dict(d.get("metrics"))
        return out
