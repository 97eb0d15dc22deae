"""`Scheduler`: decides, each step, which tokens of which requests get computed. Plain Python.

Owns: the waiting and running queues, the per-step token budget (`max_num_batched_tokens`,
shared by decodes and chunked prefills, vLLM v1 style), `max_num_seqs`, FCFS with optional
priority (lower value first), prefix-cache lookups at admission, preemption by recompute when
blocks run out (the newest / lowest-priority running request goes first), and token-level stop
checks after sampling. With a host tier (`HostTier`, `kv_offload_gib`) it also lists the step's
KV copies: cached blocks the allocator evicts are copied out (`swap_out`), host prefix hits and
swapped-out requests are copied back (`swap_in`), and a preemption victim is swapped out when the
tier has room (else recomputed). The runner performs every swap-out, then issues the swap-ins,
one *load* per admitted request (`SchedulerOutput.loads`), on a copy stream; `Loads`
(worker/sched/host_loads.py, held by `InFlightBook`) keeps their book. A load may take several steps (a 4,000-token prefix is ~8 ms over PCIe): the request that needs it (and any
request sharing blocks it fills) is admitted at once but computes only after the load landed,
which the scheduler asks at each `schedule` without blocking (`loads_landed`, injected: CUDA
events on the GPU, at once on CPU). Meanwhile the other requests keep running, so copies overlap
compute and loads do not stall the forward. While a load is in flight its device blocks stay
referenced (a waiting request that ends keeps its blocks until the load landed, like a busy
step) and its host blocks stay pinned (`HostTier.land`). The scheduler blocks on a load
(`wait_load`) only when nothing else can run, and before preempting a request that waits for
one. Its only product is a `SchedulerOutput`; the model runner sees nothing else of it. Must
never import torch.

Steps in flight (async scheduling, pipeline micro-batches) and host-tier loads: what an
uncollected step or a load still holds is kept by `InFlightBook` (worker/sched/inflight.py),
which this class extends; its docstring says how scheduling honours it. Speculative decoding's
proposals and verified updates are `SpecTokens`' (worker/sched/spec_tokens.py), also extended.

To extend (e.g. a new admission policy): change `_admit_waiting`; keep `running` sorted by
`Request.sort_key` so the preemption victim is always its tail.
"""

from __future__ import annotations

import bisect
from typing import Callable, Collection, Iterable, Optional

from infer_cluster.protocol import FinishReason, OutOfMemoryError, RequestStatus

from infer_cluster.worker.sched.block_allocator import NO_PARENT, BlockAllocator, hash_block, hash_full_blocks
from infer_cluster.worker.sched.host_tier import HostTier
from infer_cluster.worker.sched.request import Request
from infer_cluster.worker.sched.inflight import InFlightBook
from infer_cluster.worker.sched.output import ScheduledRequest, SchedulerOutput
from infer_cluster.worker.sched.spec_tokens import SpecTokens


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Scheduler(InFlightBook, SpecTokens):
    def __init__(self, allocator: BlockAllocator, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int, host: Optional[HostTier] = None,
                 loads_landed: Optional[Callable[[list[int]], Iterable[int]]] = None,
                 wait_load: Optional[Callable[[int], None]] = None):
        self.allocator = allocator
        self.host = host
        self._init_in_flight(loads_landed, wait_load)
        if host is not None:
            allocator.evicted = []
        self.block_size = allocator.block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.requests: dict[str, Request] = {}
        self.waiting: list[Request] = []   # sorted by sort_key
        self.running: list[Request] = []   # sorted by sort_key; tail = first preemption victim
        self.num_preemptions = 0
        self.prefix_cache_hit_tokens = 0
        self.prefix_cache_hit_tokens_host = 0
        self.num_load_waits = 0  # times the scheduler blocked on a load (nothing else could run)
        self.num_swapped_out = 0  # preemptions that kept their KV on the host tier
        self.num_scheduled_tokens = 0  # tokens whose KV was computed (prefill + decode)
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
        self._rewind.discard(req.request_id)
        self.loads.waits.pop(req.request_id, None)  # its loads still settle it when they land
        if req.request_id in self._busy:  # an uncollected step may still write its KV
            self._deferred[req.request_id] = req.block_ids
        else:
            self.allocator.free(req.block_ids)
        req.block_ids = []
        if req.host_block_ids is not None:  # ended while swapped out
            self.host.release(req.host_block_ids, in_flight=False)
            req.host_block_ids = None
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

    def schedule(self, can_preempt: bool = True, group: Optional[int] = None,
                 pending_on: Collection[str] = ()) -> SchedulerOutput:
        """The next step. `can_preempt=False` while another step is uncollected (see the
        module docstring): no preemption, and no admission after a request was left out.
        `group`: a micro-batch of at most that many sequences, skipping busy requests except
        those in `pending_on` with one uncollected step (async micro-batches: the requests of
        the step in flight whose draw is queued; they become `pending_input` rows).
        Blocks on the oldest load only when nothing else can run."""
        self._poll_loads()
        while True:
            out = self._schedule(can_preempt, group or self.max_num_seqs, group is not None, pending_on)
            if out.requests or out.has_swaps or out.preempted_ids or out.blocked or not self.loads.waits:
                return out
            oldest = next(iter(self.loads.members))  # every request left waits for a load
            self.wait_load(oldest)
            self.num_load_waits += 1
            self._land([oldest])
            self._poll_loads()

    def _schedule(self, can_preempt: bool, max_seqs: int, skip_busy: bool,
                  pending_on: Collection[str] = ()) -> SchedulerOutput:
        out = SchedulerOutput()
        if self.host is not None:
            self.host.begin_step()
        budget = self.max_num_batched_tokens
        # Runs for every running request every step, so the per-row checks are inlined and each
        # attribute is read once (256 async decode rows: 0.36-0.39 ms on the dev CPU). A request
        # is skipped while its KV loads, when its known and pending tokens already reach
        # max_tokens or max_model_len, or while it is in flight; blocks are looked at only when
        # it needs more than it holds (most decode rows have room in their last one).
        running, waits, busy, scheduled = self.running, self.loads.waits, self._busy, out.requests
        bs, max_len = self.block_size, self.max_model_len
        i = 0
        while i < len(running) and budget > 0 and len(scheduled) < max_seqs:
            req = running[i]
            rid = req.request_id
            pending = req.num_pending
            num_tokens = len(req.all_token_ids)
            if (rid in waits
                    or (pending and (len(req.output_token_ids) + pending >= req.params.max_tokens
                                     or num_tokens + pending >= max_len))
                    or (skip_busy and rid in busy and not (rid in pending_on and busy[rid] == 1))):
                i += 1  # its KV is still loading, its pending token is its last, or it is in flight
                continue
            computed = req.num_computed_tokens
            num_new = min(num_tokens + pending - computed, budget)
            need = _cdiv(computed + num_new, bs) - len(req.block_ids)
            if need > 0:
                if not can_preempt and not self.allocator.can_allocate(need):
                    out.blocked = True
                    break
                if not self._reserve_blocks(req, need, out):
                    break  # req itself was preempted (it was the tail): nothing after it remains
            self._emit(req, num_new, out)
            budget -= num_new
            i += 1
        if not out.preempted_ids and not out.blocked and len(out.requests) < max_seqs:
            budget = self._admit_waiting(budget, out, max_seqs)
        if self.speculating and not out.preempted_ids:
            budget = self._add_proposals(out, budget)  # worker/sched/spec_tokens.py
        out.num_batched_tokens = self.max_num_batched_tokens - budget
        self.num_scheduled_tokens += out.num_batched_tokens
        return out

    def _reserve_blocks(self, req: Request, need: int, out: SchedulerOutput) -> bool:
        """Give a running request `need` > 0 more blocks, preempting from the tail of `running`.
        Returns False if `req` itself had to be preempted."""
        while not self.allocator.can_allocate(need):
            victim = self.running[-1]
            self._preempt(victim, out)
            if victim is req:
                return False
        req.block_ids.extend(self._allocate(need, out))
        return True

    def _allocate(self, n: int, out: SchedulerOutput) -> list[int]:
        """Take `n` device blocks; with a host tier, cached blocks they evict are copied out."""
        blocks = self.allocator.allocate(n)
        evicted = self.allocator.evicted
        if evicted:
            for device_block, block_hash in evicted:
                host_block = self.host.store(block_hash)
                if host_block is not None:
                    out.swap_out.append((device_block, host_block))
            evicted.clear()
        return blocks

    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        if req.request_id in self.loads.waits:  # a load still writes its blocks: let it land first
            self.land_all_loads()
        self.running.remove(req)
        num_kv_blocks = _cdiv(req.num_computed_tokens, self.block_size)
        host_blocks = self.host.take(num_kv_blocks) if self.host is not None and num_kv_blocks else None
        if host_blocks is not None:  # swap out: computed KV kept, resumed by a swap-in
            out.swap_out.extend(zip(req.block_ids, host_blocks))
            req.host_block_ids = host_blocks
            self.num_swapped_out += 1
        else:
            req.num_computed_tokens = 0
        self.allocator.free(req.block_ids)
        req.block_ids = []
        # Proposals were for the step it left: kept, `_add_proposals` would put them on its row
        # in a later step that verifies nothing (a resume whose recompute is one token).
        req.spec_token_ids = []
        req.num_preemptions += 1
        req.transition(RequestStatus.PREEMPTED)
        self.num_preemptions += 1
        out.preempted_ids.append(req.request_id)
        bisect.insort(self.waiting, req, key=lambda r: r.sort_key)

    def _admit_waiting(self, budget: int, out: SchedulerOutput, max_seqs: int) -> int:
        while (self.waiting and budget > 0 and len(self.running) < self.max_num_seqs
               and len(out.requests) < max_seqs):
            req = self.waiting[0]
            swapped = req.host_block_ids is not None
            if swapped:  # its KV waits on the host: all of it comes back, nothing is recomputed
                cached, host_hit = [], []
                num_cached_tokens = req.num_computed_tokens
            else:
                req.block_hashes = hash_full_blocks(req.all_token_ids, self.block_size, req.block_hashes)
                # The last token is always computed: its logits choose the next token.
                max_cached = (req.num_tokens - 1) // self.block_size
                cached = self.allocator.lookup_prefix(req.block_hashes[:max_cached])
                host_hit = (self.host.lookup(req.block_hashes[len(cached):max_cached])
                            if self.host is not None else [])
                num_cached_tokens = (len(cached) + len(host_hit)) * self.block_size
            num_new = min(req.num_tokens - num_cached_tokens, budget)
            need = _cdiv(num_cached_tokens + num_new, self.block_size) - len(cached)
            waits = self.loads.filling(cached)
            revived = sum(1 for b in cached if self.allocator.ref_count[b] == 0)
            if not self.allocator.can_allocate(need + revived):
                if not self.running and not self._deferred:  # alone and no room: it can never run
                    self.finish(req, RequestStatus.FAILED, FinishReason.ERROR.value, OutOfMemoryError(
                        f"request {req.request_id} does not fit in the free KV blocks").to_dict())
                    self.failed_at_admission.append(req)
                    continue
                break
            self.allocator.share(cached)
            load = self.loads.new() if swapped or host_hit else None
            if host_hit:
                self.host.pin_hits(host_hit, load)  # before allocating: its evictions must not take them
            new = self._allocate(need, out)
            req.block_ids = cached + new
            if swapped:
                pairs = list(zip(req.host_block_ids, new))
                out.swap_in.extend(pairs)
                out.loads.append((load, len(pairs)))
                self.loads.fill((block for _, block in pairs), load)
                self.host.release(req.host_block_ids, in_flight=True, load=load)
                req.host_block_ids = None
                req.num_registered_blocks = 0  # its full blocks are offered again once computed
            else:
                self._swap_in_hits(req, host_hit, new, len(cached), out, load)
                req.num_computed_tokens = num_cached_tokens
            if load is not None:
                waits.add(load)
            if req.num_preemptions == 0:
                req.num_cached_tokens = len(cached) * self.block_size
                req.num_cached_tokens_host = len(host_hit) * self.block_size
                self.prefix_cache_hit_tokens += req.num_cached_tokens
                self.prefix_cache_hit_tokens_host += req.num_cached_tokens_host
            self.waiting.pop(0)
            req.transition(RequestStatus.RUNNING)
            bisect.insort(self.running, req, key=lambda r: r.sort_key)
            if waits:  # its KV is on its way: it computes once the loads landed
                self._wait_for(req, waits)
                continue
            self._emit(req, num_new, out)
            budget -= num_new
        return budget

    def _swap_in_hits(self, req: Request, host_hit: list[int], new: list[int], num_device_hit: int,
                      out: SchedulerOutput, load: Optional[int]) -> None:
        """Copy host prefix hits into the first new device blocks (one load) and register them
        at once: a later admission may share them, and then waits for the same load."""
        if not host_hit:
            req.num_registered_blocks = num_device_hit
            return
        out.swap_in.extend(zip(host_hit, new))
        out.loads.append((load, len(host_hit)))
        self.loads.fill(new[:len(host_hit)], load)
        for idx, block in enumerate(new[:len(host_hit)], start=num_device_hit):
            self.allocator.register(block, req.block_hashes[idx])
        req.num_registered_blocks = num_device_hit + len(host_hit)

    def _emit(self, req: Request, num_new: int, out: SchedulerOutput) -> None:
        start = req.num_computed_tokens
        all_ids = req.all_token_ids
        end = start + num_new
        tokens = all_ids[start:end]
        pending_input = len(tokens) < num_new  # only a pending token is missing (one at most)
        if pending_input:
            tokens.append(0)
        pending = req.num_pending
        needs_sample = end == len(all_ids) + pending
        rid = req.request_id
        out.requests.append(ScheduledRequest(rid, tokens, start, req.block_ids[:], needs_sample,
                                             pending_input, req.block_epoch))
        req.num_computed_tokens = end
        if needs_sample:
            req.num_pending = pending + 1
        busy = self._busy
        busy[rid] = busy.get(rid, 0) + 1

    # -- after the forward pass ---------------------------------------------------------------

    def update(self, out: SchedulerOutput, sampled: dict[str, int]) -> tuple[list[Request], list[Request]]:
        """Advance computed counts, cache newly full blocks, append sampled tokens and apply the
        token-level stop rules. Returns (requests that got a token, requests that finished)."""
        advanced, finished = [], []
        requests, rewind, running = self.requests, self._rewind, RequestStatus.RUNNING
        # Blocks fill every block_size tokens: skip the call when no new block is full.
        caching, bs = self.allocator.enable_prefix_caching, self.block_size
        for s in out.requests:
            rid = s.request_id
            self.settle(rid)
            req = requests.get(rid)
            if req is None or req.status is not running:
                continue  # ended after scheduling: this step's token (if any) is dropped
            if s.needs_sample:
                req.num_pending -= 1
                if rewind and rid in rewind:  # computed from a wrong input: redo that position
                    rewind.discard(rid)
                    req.num_computed_tokens = s.start_position + len(s.token_ids) - 1
                    self._cache_full_blocks(req, req.num_computed_tokens)
                    continue
                req.append_token(sampled[rid])
            computed = s.start_position + len(s.token_ids)
            if caching and computed // bs > req.num_registered_blocks:
                self._cache_full_blocks(req, computed)
            if not s.needs_sample:
                continue
            token = req.output_token_ids[-1]
            advanced.append(req)
            reason = req.stop_reason(token, self.max_model_len)
            if reason is not None:
                self.finish(req, RequestStatus.FINISHED, reason)
                finished.append(req)
        return advanced, finished

    def _cache_full_blocks(self, req: Request, num_computed: int) -> None:
        """Offer the blocks that the first `num_computed` tokens fill (their KV is written by
        a collected step) to the prefix cache."""
        if not self.allocator.enable_prefix_caching:
            return
        bs = self.block_size
        num_full = num_computed // bs
        if num_full <= req.num_registered_blocks:
            return
        hashes = req.block_hashes
        for idx in range(len(hashes), num_full):  # only the newly full blocks are hashed
            parent = hashes[-1] if hashes else NO_PARENT
            hashes.append(hash_block(parent, req.all_token_ids[idx * bs:(idx + 1) * bs]))
        for idx in range(req.num_registered_blocks, num_full):
            self.allocator.register(req.block_ids[idx], hashes[idx])
        req.num_registered_blocks = num_full
