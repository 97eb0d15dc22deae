"""`SpecTokens`: the scheduler's side of speculative decoding. Plain Python; the `Scheduler`
(worker/sched/scheduler.py) extends it.

Owns: turning a request's proposals (`Request.spec_token_ids`, set by a proposer in
worker/spec_decode/ before the schedule) into extra positions of its decode row, and applying a
verified step (`update_verified`).

Scheduling (`_add_proposals`, once per step when `speculating`, after the running requests and
admissions took what they need): a decode row with proposals gets up to `len(spec_token_ids)`
more positions, within the step's token budget and using only free blocks, so proposals never
preempt a request nor keep one from being admitted. `ScheduledRequest.num_spec_tokens` says how
many; `num_computed_tokens` advances over them as over any scheduled position.

Chained steps (`chain`, worker/spec_decode/chain.py): a verify step scheduled while the verify
step before it is in flight, its positions unknown to the host: blocks for the farthest place
both steps' proposals could reach, from free blocks only; the device writes its rows.

Update (`update_verified`): each sampled row brings its new tokens (the accepted proposals
and one more), appended one at a time under the token-level stop rules (a stop inside the
burst drops the tokens after it). Then `num_computed_tokens = num_tokens - 1`: the KV of the
rejected positions is stale and is overwritten when those positions are computed again; the
blocks that held only rejected positions go back to the allocator once no chained step in
flight may write them, and only blocks full of accepted tokens are offered to the prefix cache.
Must never import torch. The engine calls `update_verified` instead of `update` when it
speculates (every step then, with or without proposals: steps are synchronous).
"""

from __future__ import annotations

from typing import Optional

from infer_cluster.protocol import RequestStatus

from infer_cluster.worker.sched.output import ScheduledRequest, SchedulerOutput
from infer_cluster.worker.sched.request import Request


class SpecTokens:
    speculating = False  # the engine sets it when it has a proposer

    def _add_proposals(self, out: SchedulerOutput, budget: int) -> int:
        """Extend the step's decode rows with their proposals; returns the budget left."""
        bs, allocator, requests = self.block_size, self.allocator, self.requests
        for s in out.requests:
            if budget <= 0:
                break
            req = requests[s.request_id]
            spec = req.spec_token_ids
            if not spec or len(s.token_ids) != 1 or not s.needs_sample or s.pending_input:
                continue
            start, blocks = s.start_position, req.block_ids
            n = min(len(spec), budget)
            need = -(-(start + 1 + n) // bs) - len(blocks)
            if need > 0:
                free = allocator.num_free_blocks
                if need > free:  # only what free blocks hold: proposals never preempt
                    n = (len(blocks) + free) * bs - start - 1
                    need = free
                if n <= 0:
                    continue
                blocks.extend(self._allocate(need, out))
                s.block_ids = blocks[:]
            s.token_ids.extend(spec[:n])
            s.num_spec_tokens = n
            req.num_computed_tokens += n
            budget -= n
        return budget

    def chain(self, reqs: list[Request], in_flight: list[int], ks: list[int]) -> Optional[SchedulerOutput]:
        """Schedule a chained verify step (worker/spec_decode/chain.py) for `reqs`, each with a
        verify step in flight of `in_flight[i]` proposals, whose outcome is not known yet: ks[i]
        proposal positions after wherever that step leaves the request. Blocks are taken for the
        farthest such position (every proposal of both steps kept), from free blocks only; None,
        changing nothing, where one would pass `max_model_len` or the free blocks are too few.
        The step's positions and input ids are placeholders (the device writes the real ones);
        its requests count one more step in flight and one more pending token each."""
        bs, need = self.block_size, []
        for req, k, k_new in zip(reqs, in_flight, ks):
            last = req.num_tokens + k + k_new  # the farthest position the chained step computes
            if last >= self.max_model_len:
                return None
            need.append(max(0, -(-(last + 1) // bs) - len(req.block_ids)))
        if sum(need) > self.allocator.num_free_blocks:
            return None
        out = SchedulerOutput()
        for req, n, k_new in zip(reqs, need, ks):
            if n:
                req.block_ids.extend(self._allocate(n, out))
            rid = req.request_id
            out.requests.append(ScheduledRequest(rid, [0] * (k_new + 1), req.num_tokens - 1, req.block_ids[:],
                                                 True, block_epoch=req.block_epoch, num_spec_tokens=k_new))
            self._busy[rid] = self._busy.get(rid, 0) + 1
            req.num_pending += 1
        out.num_batched_tokens = len(reqs) + sum(ks)
        return out

    def update_verified(self, out: SchedulerOutput, sampled: dict[str, list[int]]
                        ) -> tuple[list[Request], list[Request]]:
        """`update` for a step whose sampled rows bring lists of tokens (see the module
        docstring). Returns (requests that got tokens, requests that finished)."""
        advanced, finished = [], []
        requests, running, bs = self.requests, RequestStatus.RUNNING, self.block_size
        caching = self.allocator.enable_prefix_caching
        for s in out.requests:
            rid = s.request_id
            self.settle(rid)
            req = requests.get(rid)
            if req is None or req.status is not running:
                continue  # ended after scheduling: this step's tokens are dropped
            if not s.needs_sample:  # a prompt chunk
                computed = s.start_position + len(s.token_ids)
                if caching and computed // bs > req.num_registered_blocks:
                    self._cache_full_blocks(req, computed)
                continue
            req.num_pending -= 1
            reason = None
            for token in sampled[rid]:
                req.append_token(token)
                reason = req.stop_reason(token, self.max_model_len)
                if reason is not None:
                    break  # the burst's later tokens are dropped
            computed = req.num_tokens - 1  # the last token's KV is the next step's to compute
            # (a chained step's rows, scheduled before the step before was verified, did not
            # advance it: so it is set here for every decode row)
            req.num_computed_tokens = computed
            keep = -(-req.num_tokens // bs)
            # a chained step in flight (still busy) may write past them: they stay till then
            if len(req.block_ids) > keep and reason is None and not self._busy.get(rid):
                extra = req.block_ids[keep:]
                req.block_ids = req.block_ids[:keep]  # a new list: see Request.block_ids
                self.allocator.free(extra)
            if caching and computed // bs > req.num_registered_blocks:
                self._cache_full_blocks(req, computed)
            advanced.append(req)
            if reason is not None:
                self.finish(req, RequestStatus.FINISHED, reason)
                finished.append(req)
        return advanced, finished
