"""The engine's replies per request: `token_delta` (the tokens a step gave a request, with
their logprobs and, on the first token and at the end, its metrics) and `final_delta` (the
final reply of a request that ended without a new token: aborted, failed, cut by a stop string).

Owns the shape of a `RequestDelta` as the engine emits it. Token counts ride on every delta,
since text may end the request at any of them; metrics ride on the first token's delta (a text
stage that ends the request on a stop string later finishes them) and on the final one.
Plain Python; the engine counts the tokens and drops the request's state.
"""

from __future__ import annotations

import time
from typing import Optional

from infer_cluster.protocol import RequestDelta, RequestMetrics

from infer_cluster.worker.sched.request import Request


def request_metrics(req: Request, finish_time: Optional[float]) -> RequestMetrics:
    return RequestMetrics(req.arrival_time, req.first_scheduled_time, req.first_token_time, finish_time)


def token_delta(req: Request, logprobs: Optional[list], now: float) -> RequestDelta:
    """The delta of a request that advanced: its tokens not emitted yet (marked emitted here),
    their logprob entries, and the finish info once it ended."""
    new_ids = req.output_token_ids[req.num_emitted_tokens:]
    req.num_emitted_tokens = len(req.output_token_ids)
    delta = RequestDelta(req.request_id, new_ids, "", logprobs, None, None, req.num_prompt_tokens,
                         req.num_cached_tokens, num_cached_tokens_host=req.num_cached_tokens_host)
    if req.first_token_time is None:
        req.first_token_time = now
        delta.metrics = request_metrics(req, None)
    if req.is_finished:
        delta.finish_reason = req.finish_reason
        delta.metrics = request_metrics(req, now)
    return delta


def step_logprobs(req: Request, entry, burst: bool) -> Optional[list]:
    """A request's logprob entries for its delta: `entry` of a one-token step, or (`burst`: a
    verify step) the entries of the tokens its stop rules kept, of those verified."""
    if entry is None:
        return None
    return entry[:len(req.output_token_ids) - req.num_emitted_tokens] if burst else [entry]


def final_delta(req: Request) -> RequestDelta:
    return RequestDelta(req.request_id, [], "", None, req.finish_reason, req.error,
                        req.num_prompt_tokens, req.num_cached_tokens,
                        num_cached_tokens_host=req.num_cached_tokens_host,
                        metrics=request_metrics(req, time.time()))
