"""What a request produces: status, finish reasons, streamed deltas and final outputs.

Owns: `RequestStatus` (the request lifecycle), `FinishReason`, `RequestDelta` (what one engine
step adds to one request) and `RequestOutput` (the whole result). These are plain data that the
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
class RequestDelta:
    """What one step added to one request. `finish_reason` set means this is its last delta."""

    request_id: str
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: Optional[list] = None  # one entry per token: [sampled_logprob, {alt_id: logprob}]
    finish_reason: Optional[str] = None
    error: Optional[dict] = None  # {"code", "message"} when finish_reason == "error"
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_cached_tokens_host: int = 0  # prompt tokens copied back from the host KV tier

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
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "RequestDelta":
        return cls(request_id=d["request_id"], token_ids=list(d.get("token_ids", [])),
                   text=d.get("text", ""), logprobs=d.get("logprobs"),
                   finish_reason=d.get("finish_reason"), error=d.get("error"),
                   num_prompt_tokens=d.get("num_prompt_tokens", 0),
                   num_cached_tokens=d.get("num_cached_tokens", 0),
                   num_cached_tokens_host=d.get("num_cached_tokens_host", 0))


@dataclass
class RequestOutput:
    """The whole result of one request (what `LLM.generate` and `RequestHandle.result` return)."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: Optional[str] = None
    logprobs: Optional[list] = None
    num_cached_tokens: int = 0
    error: Optional[dict] = None
    prompt: Optional[str] = None
    # Prompt tokens served per tier (DashInfer's prefix_len_gpu / prefix_len_cpu):
    # `num_cached_tokens` from the device pool, this from the host tier.
    num_cached_tokens_host: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def apply(self, delta: RequestDelta) -> None:
        """Fold one delta into this output (used by clients that stream)."""
        self.token_ids.extend(delta.token_ids)
        self.text += delta.text
        if delta.logprobs is not None:
            if self.logprobs is None:
                self.logprobs = []
            self.logprobs.extend(delta.logprobs)  # in place: a new list per token is O(n^2)
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason
            self.error = delta.error
            self.num_cached_tokens = delta.num_cached_tokens
            self.num_cached_tokens_host = delta.num_cached_tokens_host

    def to_dict(self) -> dict:
        return {"request_id": self.request_id, "prompt_token_ids": list(self.prompt_token_ids),
                "token_ids": list(self.token_ids), "text": self.text,
                "finish_reason": self.finish_reason, "logprobs": self.logprobs,
                "num_cached_tokens": self.num_cached_tokens, "error": self.error,
                "prompt": self.prompt, "num_cached_tokens_host": self.num_cached_tokens_host}

    @classmethod
    def from_dict(cls, d: dict) -> "RequestOutput":
        return cls(**{k: d.get(k) for k in ("request_id", "prompt_token_ids", "token_ids", "text",
                                              "finish_reason", "logprobs", "num_cached_tokens",
                                              "error", "prompt")},
                   num_cached_tokens_host=d.get("num_cached_tokens_host") or 0)
