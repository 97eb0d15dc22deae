"""Turning an OpenAI request body into infer-cluster prompts and `SamplingParams`.

Owns: the parameter mapping (OpenAI names and defaults -> `SamplingParams` fields), refusing
OpenAI options the cluster does not implement unless they are at their "off" value (the
structured-output fields are gateway/structured.py's), the prompt
forms of /v1/completions (string, token ids, or a batch of either), and per-choice seeds for
`n > 1`. Every refusal is an `APIError` (400) naming the field. Never imports torch.
"""

from __future__ import annotations

from typing import Optional, Union

from infer_cluster.protocol import InvalidRequestError, SamplingParams

from .errors import APIError
from .schemas import ChatCompletionRequest, CompletionRequest
from .structured import structured_outputs
from .tools import tool_plan

Prompt = Union[str, list[int]]

# Request fields copied to SamplingParams when given (same name, same meaning).
_PASS_THROUGH = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "top_k",
                 "min_p", "repetition_penalty", "min_tokens", "ignore_eos", "stop_token_ids")


def _unsupported(field: str, why: str) -> APIError:
    return APIError(f"{field}: {why}", "invalid_request", field)


def _common_checks(req) -> None:
    if req.stream_options is not None and not req.stream:
        raise _unsupported("stream_options", "is only allowed when stream is true")


def build_params(req, max_tokens: Optional[int], logprobs: Optional[int],
                 strict: bool = True, forced=None) -> SamplingParams:
    """`SamplingParams` for one choice; an out-of-range value is a 400 naming its field.
    `strict`: the replica refuses a prompt plus `max_tokens` past its context (a 400).
    `forced`: the structured-outputs constraint of a forced tool call (gateway/tools.py)."""
    kwargs = {name: getattr(req, name) for name in _PASS_THROUGH if getattr(req, name) is not None}
    kwargs["max_tokens_strict"] = strict
    if req.stop is not None:
        kwargs["stop"] = [req.stop] if isinstance(req.stop, str) else list(req.stop)
    if req.seed is not None:
        kwargs["seed"] = req.seed
    if max_tokens is not None:
        kwargs["max_tokens"] = max_tokens
    if logprobs is not None:
        kwargs["logprobs"] = logprobs
        kwargs["logprob_bytes"] = True  # the replica sends each token's bytes: gateway/logprobs.py
    kwargs["structured_outputs"] = structured_outputs(req)  # a 400 naming the field it came in
    if forced is not None:
        if kwargs["structured_outputs"] is not None:
            raise _unsupported("tool_choice", "a forced tool call cannot be combined with "
                               "response_format, structured_outputs or guided_*")
        kwargs["structured_outputs"] = forced
    if req.logit_bias:
        kwargs["logit_bias"] = req.logit_bias  # token-id strings; SamplingParams reads them
    try:
        return SamplingParams(**kwargs)
    except InvalidRequestError as exc:
        # SamplingParams messages start with the field's name ("top_p must be ...",
        # "stop_token_ids[] must be ...").
        first = exc.message.split(" ", 1)[0].removesuffix("[]")
        raise APIError(exc.message, "invalid_request",
                       first if first in SamplingParams.__dataclass_fields__ else None) from None


def per_choice(params: SamplingParams, n: int) -> list[SamplingParams]:
    """`n` copies; a seeded request gives choice i the seed `seed + i`, so the choices differ
    from each other and the whole response still reproduces."""
    if params.seed is None or n == 1:
        return [params] * n
    out = []
    for i in range(n):
        d = params.to_dict()
        d["seed"] = (params.seed + i) % (2**63)
        out.append(SamplingParams.from_dict(d))
    return out


def completion_prompts(req: CompletionRequest, max_batch: int) -> list[Prompt]:
    p = req.prompt
    if isinstance(p, str):
        prompts = [p]
    elif p and isinstance(p[0], int):
        prompts = [list(p)]
    else:
        prompts = list(p)
    if not prompts:
        raise APIError("prompt: must not be empty", "invalid_request", "prompt")
    if len(prompts) > max_batch:
        raise APIError(f"prompt: a batch of {len(prompts)} prompts; at most {max_batch}",
                       "invalid_request", "prompt")
    for i, one in enumerate(prompts):
        if len(one) == 0:
            where = "prompt" if len(prompts) == 1 else f"prompt.{i}"
            raise APIError(f"{where}: must not be empty", "invalid_request", where)
    return prompts


def completion_params(req: CompletionRequest, max_n: int) -> SamplingParams:
    _common_checks(req)
    if req.echo:
        raise _unsupported("echo", "is not supported (the gateway has no tokenizer)")
    if req.suffix:
        raise _unsupported("suffix", "is not supported")
    if req.best_of is not None and req.best_of != req.n:
        raise _unsupported("best_of", "must equal n (best-of ranking is not supported)")
    if req.n > max_n:
        raise APIError(f"n: at most {max_n} choices per prompt, got {req.n}", "invalid_request", "n")
    max_tokens = req.max_tokens if req.max_tokens is not None else 16  # OpenAI's default
    return build_params(req, max_tokens, req.logprobs)


def chat_params(req: ChatCompletionRequest, max_n: int, max_model_len: Optional[int]) -> SamplingParams:
    _common_checks(req)
    plan = tool_plan(req)  # "required" or a named function: the output is the calls' JSON
    if req.top_logprobs is not None and not req.logprobs:
        raise _unsupported("top_logprobs", "needs logprobs set to true")
    if req.n > max_n:
        raise APIError(f"n: at most {max_n} choices, got {req.n}", "invalid_request", "n")
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    strict = max_tokens is not None
    if max_tokens is None:
        # OpenAI chat has no output cap by default: up to the context length (the engine stops
        # at max_model_len with finish_reason "length"). A number the client gives must fit.
        max_tokens = max_model_len or 16
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    return build_params(req, max_tokens, logprobs, strict, plan.constraint if plan else None)


def chat_messages(req: ChatCompletionRequest) -> list[dict]:
    """The messages in the client's `chat` form: role and content, and an assistant turn's
    tool calls or a tool turn's call id."""
    out = []
    for m in req.messages:
        d = {"role": m.role, "content": m.text()}
        if m.tool_calls:
            d["tool_calls"] = [c.model_dump() for c in m.tool_calls]
        if m.tool_call_id is not None:
            d["tool_call_id"] = m.tool_call_id
        out.append(d)
    return out
