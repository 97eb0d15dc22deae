"""Pydantic models of the OpenAI API subset the gateway serves.

Owns: request bodies (validated by FastAPI; a bad value is a 400 naming the field, see
`errors.py`) and response bodies (completions, chat completions, their stream chunks, models,
usage, logprobs). Unknown request fields are refused (a typo must not pass silently); OpenAI
fields the cluster does not implement are accepted only at their "off" value (`params.py`).
Never imports torch.

To accept a new parameter: add the field here, then map it in `params.py`.
"""

from __future__ import annotations

import time
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

NonNegInt = Field(default=None, ge=0)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class _SamplingFields(BaseModel):
    """Parameters shared by completions and chat completions (OpenAI + vLLM extras)."""

    model_config = ConfigDict(extra="forbid")

    model: Optional[str] = None
    max_tokens: Optional[int] = Field(default=None, ge=1)
    temperature: Optional[float] = Field(default=None, ge=0.0)
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1)
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    stop: Optional[Union[str, list[str]]] = None
    seed: Optional[int] = None
    presence_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0)
    user: Optional[str] = None
    logit_bias: Optional[dict[str, float]] = None  # token id (as a string) -> bias in [-100, 100]
    # vLLM extras
    top_k: Optional[int] = Field(default=None, ge=-1)
    min_p: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: Optional[float] = Field(default=None, gt=0.0)
    min_tokens: Optional[int] = Field(default=None, ge=0)
    ignore_eos: Optional[bool] = None
    stop_token_ids: Optional[list[int]] = None
    # Structured outputs (gateway/structured.py): vLLM's extra body, and its older names
    structured_outputs: Optional[dict[str, Any]] = None
    guided_json: Optional[Union[str, dict[str, Any]]] = None
    guided_regex: Optional[str] = None
    guided_choice: Optional[list[str]] = None
    guided_grammar: Optional[str] = None


class CompletionRequest(_SamplingFields):
    # A string, a list of token ids, or a batch of either.
    prompt: Union[str, list[int], list[str], list[list[int]]]
    logprobs: Optional[int] = Field(default=None, ge=0, le=20)
    echo: bool = False          # accepted only false
    suffix: Optional[str] = None  # accepted only unset
    best_of: Optional[int] = Field(default=None, ge=1)  # accepted only == n
    response_format: Optional[dict[str, Any]] = None  # text, json_object or json_schema (as vLLM)

    @field_validator("prompt", mode="wrap")
    @classmethod
    def _one_prompt_shape(cls, value, handler):
        return _explained(value, handler, _prompt_shape_error)


def _explained(value, handler, explain):
    """A wrap validator's body: pydantic validates; only a failure is looked at again, by
    `explain(value)`, for one message naming what is wrong instead of one per branch of a
    union (no per-item Python on success). `explain` returns None to keep pydantic's message."""
    try:
        return handler(value)
    except ValidationError:
        why = explain(value)
        if why is None:
            raise
        raise ValueError(why) from None


_PROMPT_SHAPE = "a string, a list of token ids, or a list of strings or of token-id lists"


def _prompt_item_kind(item) -> Optional[str]:
    if isinstance(item, bool):
        return None
    if isinstance(item, int):
        return "token ids"
    if isinstance(item, str):
        return "strings"
    if isinstance(item, list):
        return "token-id lists"
    return None


def _prompt_shape_error(value) -> Optional[str]:
    """What is wrong with a prompt pydantic refused, or None to keep pydantic's own message."""
    if not isinstance(value, list):
        return f"must be {_PROMPT_SHAPE}, got {type(value).__name__}"
    kinds = [_prompt_item_kind(item) for item in value]
    if None in kinds:
        return f"must be {_PROMPT_SHAPE}; it holds a {type(value[kinds.index(None)]).__name__}"
    if len(set(kinds)) > 1:
        return f"must be {_PROMPT_SHAPE}, not a mix of {' and '.join(sorted(set(kinds)))}"
    for i, item in enumerate(value):
        if isinstance(item, list) and any(_prompt_item_kind(t) != "token ids" for t in item):
            return f"prompt {i} is a list, so it must hold only token ids (ints)"
    return None


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class ToolCallFunctionIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    arguments: str  # JSON text, as OpenAI returns it


class ToolCallIn(BaseModel):
    """A call an earlier assistant turn made (sent back as history)."""

    model_config = ConfigDict(extra="forbid")
    id: str = ""
    type: Literal["function"] = "function"
    function: ToolCallFunctionIn


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[ContentPart], None] = None
    name: Optional[str] = None
    tool_calls: Optional[list[ToolCallIn]] = None  # assistant turns only
    tool_call_id: Optional[str] = None              # the call a tool turn answers

    @field_validator("content", mode="wrap")
    @classmethod
    def _text_parts_only(cls, value, handler):
        return _explained(value, handler, _content_error)

    @field_validator("tool_calls")
    @classmethod
    def _assistant_only(cls, value, info):
        role = info.data.get("role")
        if value is not None and role != "assistant":
            raise ValueError(f"only assistant messages carry tool_calls, not {role!r} ones")
        return value

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


_CONTENT_SHAPE = 'a string or a list of {"type": "text", "text": "..."} parts'


def _content_error(value) -> Optional[str]:
    """What is wrong with chat content pydantic refused, or None to keep its own message."""
    if not isinstance(value, list):
        return f"must be {_CONTENT_SHAPE}, got {type(value).__name__}"
    for i, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind is not None and kind != "text":
            return f"only text content parts are supported, got a part of type {kind!r}"
        if kind is None or not isinstance(part.get("text"), str):
            return f"must be {_CONTENT_SHAPE}; part {i} is not"
    return None


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessageIn] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(default=None, ge=0, le=20)
    response_format: Optional[dict[str, Any]] = None  # text, json_object or json_schema
    tools: Optional[list[dict[str, Any]]] = None      # gateway/tools.py
    tool_choice: Optional[Union[str, dict[str, Any]]] = None  # "auto", "none", "required" or named
    parallel_tool_calls: Optional[bool] = None


# ----------------------------------------------------------------- responses

class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[Optional[float]] = Field(default_factory=list)
    top_logprobs: list[Optional[dict[str, float]]] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: Optional[CompletionLogprobs] = None
    finish_reason: Optional[str] = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Optional[Usage] = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: Optional[list[int]] = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] = Field(default_factory=list)


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: Optional[str]
    tool_calls: Optional[list[dict[str, Any]]] = None  # gateway/tools.py


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    logprobs: Optional[ChatLogprobs] = None
    finish_reason: Optional[str] = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    role: Optional[Literal["assistant"]] = None
    content: Optional[str] = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: Optional[ChatLogprobs] = None
    finish_reason: Optional[str] = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Optional[Usage] = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "infer-cluster"
    max_model_len: Optional[int] = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
