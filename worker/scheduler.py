"""`Scheduler`: decides, each step, which tokens of which requests get computed. Plain Python.

Owns: the waiting and running queues, the per-step token budget (`max_num_batched_tokens`,
shared by decodes and chunked prefills, vLLM v1 style), `max_num_seqs`, FCFS with optional
priority (lower value first), prefix-cache lookups at admission, preemption by recompute when
blocks run out (the newest / lowest-priority running request goes first), and token-level stop
checks after sampling. Its only product is a `SchedulerOutput`; the model runner sees nothing
else of it. Must never import torch.

To extend (e.g. a new admission policy): change `_admit_waiting`; keep `running` sorted by
`Request.sort_key` so the preemption victim is always its tail.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Optional

from infer_cluster.protocol import FinishReason, OutOfMemoryError, RequestStatus

from .block_allocator import NO_PARENT, BlockAllocator, hash_block, hash_full_blocks
from .request import Request


@dataclass
class ScheduledRequest:
    """One request's share of a step: compute KV for `token_ids` at positions from
    `start_position`; if `needs_sample`, the last row's logits pick the next token."""

    request_id: str
    token_ids: list[int]
    start_position: int
    block_ids: list[int]
    needs_sample: bool


@dataclass
class SchedulerOutput:
    requests: list[ScheduledRequest] = field(default_factory=list)
    num_batched_tokens: int = 0
    preempted_ids: list[str] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.requests


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Scheduler:
    def __init__(self, allocator: BlockAllocator, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int):
        self.allocator = allocator
        self.block_size = allocator.block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.requests: dict[str, Request] = {}
        self.waiting: list[Request] = []   # sorted by sort_key
        self.running: list[Request] = []   # sorted by sort_key; tail = first preemption victim
        self.num_preemptions = 0
        self.prefix_cache_hit_tokens = 0
        self.failed_at_admission: list[Request] = []  # ended by schedule(); the engine reports them

    # -- queue management ---------------------------------------------------------------------

    def max_blocks_for(self, req: Request) -> int:
        """Blocks the request needs at its longest (prompt + every allowed output token)."""
        longest = min(req.num_prompt_tokens + req.params.max_tokens, self.max_model_len)
        return _cdiv(max(longest, req.num_tokens), self.block_size)

    def add(self, req: Request) -> None:
        """Queue a request. Raises `OutOfMemoryError` if it could never fit the KV pool, even
        alone — admitting it would only loop on preemption."""
        need = self.max_blocks_for(req)
        if need > self.allocator.num_blocks:
            raise OutOfMemoryError(
                f"request {req.request_id} needs up to {need} KV blocks "
                f"({req.num_prompt_tokens} prompt + {req.params.max_tokens} max_tokens) but the pool "
                f"has {self.allocator.num_blocks}; lower max_tokens or enlarge the KV cache")
        self.requests[req.request_id] = req
        bisect.insort(self.waiting, req, key=lambda r: r.sort_key)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, req: Request, status: RequestStatus, reason: str, error: Optional[dict] = None) -> None:
        """End a request: free its blocks and take it out of the queues."""
        if req.is_finished:
            return
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.allocator.free(req.block_ids)
        req.block_ids = []
        req.transition(status)
        req.finish_reason = reason
        req.error = error
        del self.requests[req.request_id]

    def abort(self, request_id: str) -> Optional[Request]:
        req = self.requests.get(request_id)
        if req is not None:
            self.finish(req, RequestStatus.ABORTED, FinishReason.ABORT.value)
        return req

    # -- scheduling -----------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            if not self._reserve_blocks(req, num_new, out):
                break  # req itself was preempted (it was the tail): nothing after it remains
            self._emit(req, num_new, out)
            budget -= num_new
            i += 1
        if not out.preempted_ids:
            budget = self._admit_waiting(budget, out)
        out.num_batched_tokens = self.max_num_batched_tokens - budget
        return out

    def _reserve_blocks(self, req: Request, num_new: int, out: SchedulerOutput) -> bool:
        """Make room for `num_new` more tokens of a running request, preempting from the tail
        of `running`. Returns False if `req` itself had to be preempted."""
        need = _cdiv(req.num_computed_tokens + num_new, self.block_size) - len(req.block_ids)
        while not self.allocator.can_allocate(need):
            victim = self.running[-1]
            self._preempt(victim, out)
            if victim is req:
                return False
        req.block_ids.extend(self.allocator.allocate(need))
        return True

    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        self.running.remove(req)
        self.allocator.free(req.block_ids)
        req.block_ids = []
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        req.transition(RequestStatus.PREEMPTED)
        self.num_preemptions += 1
        out.preempted_ids.append(req.request_id)
        bisect.insort(self.waiting, req, key=lambda r: r.sort_key)

    def _admit_waiting(self, budget: int, out: SchedulerOutput) -> int:
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            req.block_hashes = hash_full_blocks(req.all_token_ids, self.block_size, req.block_hashes)
            # The last token is always computed: its logits choose the next token.
            max_cached = (req.num_tokens - 1) // self.block_size
            cached = self.allocator.lookup_prefix(req.block_hashes[:max_cached])
            num_cached_tokens = len(cached) * self.block_size
            num_new = min(req.num_tokens - num_cached_tokens, budget)
            need = _cdiv(num_cached_tokens + num_new, self.block_size) - len(cached)
            revived = sum(1 for b in cached if self.allocator.ref_count[b] == 0)
            if not self.allocator.can_allocate(need + revived):
                if not self.running:  # alone and still no room: it can never run
                    self.finish(req, RequestStatus.FAILED, FinishReason.ERROR.value, OutOfMemoryError(
                        f"request {req.request_id} does not fit in the free KV blocks").to_dict())
                    self.failed_at_admission.append(req)
                    continue
                break
            self.allocator.share(cached)
            req.block_ids = cached + self.allocator.allocate(need)
            req.num_computed_tokens = num_cached_tokens
            req.num_registered_blocks = len(cached)
            if req.num_preemptions == 0:
                req.num_cached_tokens = num_cached_tokens
                self.prefix_cache_hit_tokens += num_cached_tokens
            self.waiting.pop(0)
            req.transition(RequestStatus.RUNNING)
            bisect.insort(self.running, req, key=lambda r: r.sort_key)
            self._emit(req, num_new, out)
            budget -= num_new
        return budget

    def _emit(self, req: Request, num_new: int, out: SchedulerOutput) -> None:
        start = req.num_computed_tokens
        tokens = req.all_token_ids[start:start + num_new]
        out.requests.append(ScheduledRequest(
            request_id=req.request_id, token_ids=tokens, start_position=start,
            block_ids=list(req.block_ids), needs_sample=start + num_new == req.num_tokens))

    # -- after the forward pass ---------------------------------------------------------------

    def update(self, out: SchedulerOutput, sampled: dict[str, int]) -> tuple[list[Request], list[Request]]:
        """Advance computed counts, cache newly full blocks, append sampled tokens and apply the
        token-level stop rules. Returns (requests that got a token, requests that finished)."""
        advanced, finished = [], []
        for s in out.requests:
            req = self.requests.get(s.request_id)
            if req is None or req.status is not RequestStatus.RUNNING:
                continue  # aborted or preempted after scheduling
            req.num_computed_tokens += len(s.token_ids)
            self._cache_full_blocks(req)
            if not s.needs_sample:
                continue
            token = sampled[s.request_id]
            req.append_token(token)
            advanced.append(req)
            reason = self._stop_reason(req, token)
            if reason is not None:
                self.finish(req, RequestStatus.FINISHED, reason)
                finished.append(req)
        return advanced, finished

    def _cache_full_blocks(self, req: Request) -> None:
        if not self.allocator.enable_prefix_caching:
            return
        bs = self.block_size
        num_full = req.num_computed_tokens // bs
        if num_full <= req.num_registered_blocks:
            return
        hashes = req.block_hashes
        for idx in range(len(hashes), num_full):  # only the newly full blocks are hashed
            parent = hashes[-1] if hashes else NO_PARENT
            hashes.append(hash_block(parent, req.all_token_ids[idx * bs:(idx + 1) * bs]))
        for idx in range(req.num_registered_blocks, num_full):
            self.allocator.register(req.block_ids[idx], hashes[idx])
        req.num_registered_blocks = num_full

    def _stop_reason(self, req: Request, token: int) -> Optional[str]:
        p = req.params
        num_out = len(req.output_token_ids)
        if num_out >= p.min_tokens:
            if (not p.ignore_eos and token in req.eos_token_ids) or token in p.stop_token_ids:
                return FinishReason.STOP.value
        if num_out >= p.max_tokens or req.num_tokens >= self.max_model_len:
            return FinishReason.LENGTH.value
        return None
