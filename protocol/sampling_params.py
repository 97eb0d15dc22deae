"""`SamplingParams`: how one request is decoded.

Owns: the per-request decoding options and their validation. Every check raises
`InvalidRequestError` naming the field, so a bad value fails at the edge (client or
coordinator) instead of deep inside the engine. Never imports torch.

To add an option: add a field with a default (old peers keep working), validate it in
`__post_init__`, and let `from_dict` accept it; the sampler reads it by name.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Optional

from .errors import InvalidRequestError
from .fields import MAX_TOKEN_ID
from .structured import StructuredOutputsParams

MAX_LOGPROBS = 20
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_LEN = 512
MAX_LOGIT_BIAS_ENTRIES = 256  # the wire's maps hold at most 256 keys (fields.MAX_MAP_ITEMS)
MAX_COUNT = 2**31 - 1  # counts (max_tokens, top_k, ...): what any engine can mean, and fits the wire


def _check_number(name: str, value: Any, *, lo=None, hi=None, lo_open=False, integer=False):
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind):
        want = "an integer" if integer else "a number"
        raise InvalidRequestError(f"{name} must be {want}, got {value!r}")
    if not integer and not math.isfinite(value):
        raise InvalidRequestError(f"{name} must be finite, got {value!r}")
    if lo is not None and (value <= lo if lo_open else value < lo):
        op = ">" if lo_open else ">="
        raise InvalidRequestError(f"{name} must be {op} {lo}, got {value!r}")
    if hi is not None and value > hi:
        raise InvalidRequestError(f"{name} must be <= {hi}, got {value!r}")


def _check_logit_bias(bias: Any) -> Optional[dict[int, float]]:
    if bias is None:
        return None
    if not isinstance(bias, dict):
        raise InvalidRequestError(f"logit_bias must be a map of token id to bias, got {bias!r}",
                                  param="logit_bias")
    if len(bias) > MAX_LOGIT_BIAS_ENTRIES:
        raise InvalidRequestError(f"logit_bias has {len(bias)} entries; at most "
                                  f"{MAX_LOGIT_BIAS_ENTRIES}", param="logit_bias")
    out = {}
    for k, v in bias.items():
        tid = k
        if isinstance(k, str):
            try:
                tid = int(k)
            except ValueError:
                raise InvalidRequestError(f"logit_bias keys must be token ids, got {k!r}",
                                          param="logit_bias") from None
        if isinstance(tid, bool) or not isinstance(tid, int) or not 0 <= tid <= MAX_TOKEN_ID:
            raise InvalidRequestError(f"logit_bias keys must be token ids, got {k!r}", param="logit_bias")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not -100 <= v <= 100:
            raise InvalidRequestError(f"logit_bias values must be numbers in [-100, 100], got {v!r} "
                                      f"for token {tid}", param="logit_bias")
        out[tid] = float(v)
    return out or None


@dataclass
class SamplingParams:
    """Decoding options of one request. `temperature == 0` means greedy."""

    temperature: float = 1.0
    top_k: int = 0  # 0 or -1: no top-k cut
    top_p: float = 1.0
    min_p: float = 0.0
    max_tokens: int = 16
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: Optional[int] = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    no_repeat_ngram_size: int = 0
    logprobs: Optional[int] = None  # top-N alternatives per token; 0 = only the sampled one
    # With logprobs: each entry also carries `{token_id: bytes}`, the raw bytes of the sampled
    # token and of each alternative (what OpenAI's `token` and `bytes` fields are made of; the
    # HTTP gateway asks for them). Off by default: it costs the text stage a lookup per token.
    logprob_bytes: bool = False
    # True: a prompt plus max_tokens longer than the replica's max_model_len is refused (as the
    # OpenAI API and vLLM refuse it) instead of ending with "length" at the context limit. The
    # HTTP gateway sets it whenever max_tokens is the client's number or OpenAI's default.
    max_tokens_strict: bool = False
    # The output constrained to a JSON schema, regex, choice or grammar (protocol/structured.py);
    # a map on the wire.
    structured_outputs: Optional[StructuredOutputsParams] = None
    # Token id -> a number in [-100, 100] added to its logit every step (OpenAI's logit_bias;
    # -100 in effect bans the token). String keys (the wire, JSON) are read as ids.
    logit_bias: Optional[dict[int, float]] = None

    def __post_init__(self):
        _check_number("temperature", self.temperature, lo=0.0)
        _check_number("top_k", self.top_k, lo=-1, hi=MAX_COUNT, integer=True)
        if self.top_k == -1:
            self.top_k = 0
        _check_number("top_p", self.top_p, lo=0.0, lo_open=True, hi=1.0)
        _check_number("min_p", self.min_p, lo=0.0, hi=1.0)
        _check_number("max_tokens", self.max_tokens, lo=1, hi=MAX_COUNT, integer=True)
        _check_number("min_tokens", self.min_tokens, lo=0, hi=MAX_COUNT, integer=True)
        if self.min_tokens > self.max_tokens:
            raise InvalidRequestError(
                f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not isinstance(self.stop, (list, tuple)) or not all(isinstance(s, str) for s in self.stop):
            raise InvalidRequestError(f"stop must be a string or a list of strings, got {self.stop!r}")
        self.stop = list(self.stop)
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidRequestError(f"stop has {len(self.stop)} strings; at most {MAX_STOP_STRINGS}")
        for s in self.stop:
            if not s or len(s) > MAX_STOP_STRING_LEN:
                raise InvalidRequestError(
                    f"each stop string must have 1..{MAX_STOP_STRING_LEN} characters, got {s!r}")
        if not isinstance(self.stop_token_ids, (list, tuple)):
            raise InvalidRequestError(f"stop_token_ids must be a list of integers, got {self.stop_token_ids!r}")
        for t in self.stop_token_ids:
            _check_number("stop_token_ids[]", t, lo=0, hi=MAX_TOKEN_ID, integer=True)
        self.stop_token_ids = list(self.stop_token_ids)
        if not isinstance(self.ignore_eos, bool):
            raise InvalidRequestError(f"ignore_eos must be true or false, got {self.ignore_eos!r}")
        if not isinstance(self.max_tokens_strict, bool):
            raise InvalidRequestError(f"max_tokens_strict must be true or false, got {self.max_tokens_strict!r}")
        if self.seed is not None:
            _check_number("seed", self.seed, lo=0, hi=2**63 - 1, integer=True)
        _check_number("repetition_penalty", self.repetition_penalty, lo=0.0, lo_open=True)
        _check_number("presence_penalty", self.presence_penalty, lo=-2.0, hi=2.0)
        _check_number("frequency_penalty", self.frequency_penalty, lo=-2.0, hi=2.0)
        _check_number("no_repeat_ngram_size", self.no_repeat_ngram_size, lo=0, hi=MAX_COUNT,
                      integer=True)
        if self.logprobs is not None:
            _check_number("logprobs", self.logprobs, lo=0, hi=MAX_LOGPROBS, integer=True)
        if not isinstance(self.logprob_bytes, bool):
            raise InvalidRequestError(f"logprob_bytes must be true or false, got {self.logprob_bytes!r}")
        self.structured_outputs = StructuredOutputsParams.from_value(self.structured_outputs)
        self.logit_bias = _check_logit_bias(self.logit_bias)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0 or self.no_repeat_ngram_size > 0)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        if self.structured_outputs is not None:
            d["structured_outputs"] = self.structured_outputs.to_dict()
        if self.logit_bias is not None:  # the wire's maps have string keys
            d["logit_bias"] = {str(k): v for k, v in self.logit_bias.items()}
        return d

    @classmethod
    def from_dict(cls, data: Any) -> "SamplingParams":
        """Build from a wire/user map; unknown keys are an error (typos must not pass silently)."""
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise InvalidRequestError(f"sampling params must be a map, got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(str(k) for k in data if k not in names)
        if unknown:
            raise InvalidRequestError(f"unknown sampling parameter(s): {', '.join(unknown)}")
        try:
            return cls(**data)
        except TypeError as exc:  # e.g. non-str keys
            raise InvalidRequestError(f"bad sampling params: {exc}") from None
