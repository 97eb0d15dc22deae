"""`DynamicEngine`: one replica's continuous-batching engine.

Owns: request admission (the checks in worker/sched/admission.py → `Request`; a request whose
grammar is still compiling waits outside the batch: worker/engine/structured.py), the step loop,
aborts, and stats.
Step loop with `EngineConfig.async_scheduling`: schedule step n+1 while step n's ids are on
their way, launch it (forward + draw on the device, worker/engine/inflight.py), THEN wait for step n's
ids, apply them (scheduler update) and emit step n's deltas. Synchronous (collected before the
next schedule): async off, a step with a no_repeat_ngram_size row (its ban needs the last id on
the host) or a structured-outputs row (its grammar's mask needs it: worker/structured/), and
settled-state cases: a schedule that needed preemption,
`reset_cache`, failures, and a rewind: when the sampler's redo (`SamplerOutput.redrawn`, rare:
a top-k / top-p row whose kept set did not fit its candidates) changed a token that the step in
flight already used as a pending input, that step's token of the request is dropped and its
position recomputed (`Scheduler.rewind`), so the step is collected before the next schedule.
Pipeline micro-batches (a runner with `pipeline_depth` P > 1, worker/sched/microbatch.py): up to P
steps in flight, each on a disjoint group of about 1/P of the batch (`Scheduler.schedule(group=)`);
after a submit the oldest is collected once P are in flight, so rank 0 samples group k while
the later stages compute k+1; a schedule that finds every request in flight collects instead.
Speculative decoding (`speculative_config`, worker/spec_decode/): before each schedule a proposer
sets the decoding requests' proposals, the step is a `VerifyStep` (every position of a row is
drawn) and `Scheduler.update_verified` applies the accepted tokens; such an engine is synchronous.
A draft model's runner is built here (worker/engine/draft.py) and handed to the proposer.
Sampling itself never blocks the launch (sampled, penalties and logprobs rows included). Per-request sampling state
(penalty counts, n-gram maps) lives in the `Sampler`, released here when a request ends. Text
is not made here: the step emits token ids, and a `TextStage` (worker/text/text_stage.py) turns them
into text and stop strings, inline for the offline `LLM` (`detokenize=True`) or on the
replica's text thread (`detokenize=False`; the server feeds stops back via `stop_requests`).
Scheduling and block bookkeeping live in `Scheduler` /
`BlockAllocator` (plain Python); tensors live in `ModelRunner`. Single-threaded: callers (the
offline `LLM`, the replica server's engine loop) drive it from one thread.
To extend: new per-request behaviour goes into `_emit` (text: `TextStage`); new per-step work into
`ModelRunner`; keep `step()` legible (in-flight bookkeeping lives in worker/engine/inflight.py).
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from typing import Optional, Sequence

import torch

from infer_cluster.protocol import (EngineError, FinishReason, InvalidRequestError, RequestDelta,
                                   RequestMetrics, RequestStatus, SamplingParams)

from infer_cluster.worker.sched.admission import Prompt, check_lengths, tokenize_prompt
from infer_cluster.worker.sched.block_allocator import BlockAllocator
from infer_cluster.worker.config import EngineConfig
from infer_cluster.worker.text.detokenizer import piece_table
from infer_cluster.worker.sampling.draw_graphs import DrawGraphs
from infer_cluster.worker.engine.stats import engine_capacity, engine_stats, request_phase
from infer_cluster.worker.sched.host_tier import HostTier
from infer_cluster.worker.engine.inflight import InFlightSteps
from infer_cluster.worker.engine.draft import attach_draft_pool, build_draft_runner
from infer_cluster.worker.engine.kv_reset import reset_engine_cache
from infer_cluster.worker.engine.structured import StructuredRequests
from infer_cluster.worker.loading.loader import load_hf_config, load_tokenizer, resolve_model_path, resolve_tokenizer_path
from infer_cluster.worker.text.logprob_rows import resolve_logprobs
from infer_cluster.worker.sched.microbatch import group_size
from infer_cluster.worker.runner.model_runner import ModelRunner
from infer_cluster.worker.models.decoder import ModelSpec
from infer_cluster.worker.sched.request import Request
from infer_cluster.worker.sampling.sampler import Sampler
from infer_cluster.worker.sched.scheduler import Scheduler
from infer_cluster.worker.sched.output import SchedulerOutput
from infer_cluster.worker.spec_decode.decoder import build_spec_decoder
from infer_cluster.worker.spec_decode.verify import VerifyStep
from infer_cluster.worker.text.text_stage import TextStage

log = logging.getLogger(__name__)


def _eos_ids(hf_config, tokenizer) -> tuple[int, ...]:
    ids = set()
    for src in (getattr(hf_config, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if isinstance(src, int):
            ids.add(src)
        elif isinstance(src, (list, tuple)):
            ids.update(int(x) for x in src)
    return tuple(sorted(ids))


class DynamicEngine:
    def __init__(self, config: EngineConfig, runner_factory=None, detokenize: bool = True):
        self.config = config
        self.model_path = resolve_model_path(config.model)
        self.model_name = config.model
        hf_config = load_hf_config(self.model_path)
        self.tokenizer = load_tokenizer(resolve_tokenizer_path(config.tokenizer) if config.tokenizer
                                        else self.model_path)
        try:
            self.spec = ModelSpec.from_hf_config(hf_config)
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None
        self.max_model_len = self._resolve_max_model_len()
        self.eos_token_ids = _eos_ids(hf_config, self.tokenizer)
        self.byte_table = piece_table(self.tokenizer)  # None: the window path
        # detokenize=False: the caller runs its own TextStage (see `text_stage.TextWorker`).
        self.text: Optional[TextStage] = TextStage(self.tokenizer, self.byte_table) if detokenize else None
        # True when a TextStage downstream builds the logprob entries (worker/text/logprob_rows.py).
        self.defer_logprobs = False
        if runner_factory is None and config.world_size > 1:
            from infer_cluster.worker.distributed import DistributedRunner
            runner_factory = DistributedRunner
        factory = runner_factory or ModelRunner
        # A draft model (speculative_config method draft_model, worker/engine/draft.py): loaded
        # first, so the target's pool sizing counts its weights and its per-block KV bytes.
        self.draft_runner = build_draft_runner(config, hf_config, self.spec, self.max_model_len)
        extra = {"kv_companion": self.draft_runner} if self.draft_runner else {}
        self.runner = factory(config, self.spec, self.model_path, hf_config, self.max_model_len, **extra)
        if self.draft_runner is not None:
            attach_draft_pool(self.draft_runner, self.runner.num_kv_blocks, config.kv_cache_dtype)
        # Small all-random steps replay the sampler's draw from CUDA graphs (worker/sampling/draw_graphs.py),
        # kept across sampler resets; None off CUDA or with INFER_CLUSTER_DRAW_GRAPH_MAX=0.
        self.draw_graphs = DrawGraphs.for_device(self.runner.device)
        # Structured outputs: the grammar compiler, requests parked while theirs compiles
        self.structured = StructuredRequests(self.tokenizer, self.spec.vocab_size, self.eos_token_ids)
        self._reset_bookkeeping()
        log.info("async scheduling: %s", "on" if self.async_scheduling else "off")
        if config.pipeline_parallel_size > 1:
            log.info("pipeline micro-batches: %s", f"on, {self.pipeline_depth} groups in flight"
                     if self.pipeline_depth > 1 else "off (one step at a time)")
        self.warmup_stats: Optional[dict] = None
        warmup = config.warmup if config.warmup is not None else self.runner.device.type == "cuda"
        if warmup:
            from infer_cluster.worker.engine.warmup import warm_up_engine
            self.warmup_stats = warm_up_engine(self)
            self._reset_bookkeeping()  # the first real request sees a fresh engine

    def _reset_bookkeeping(self) -> None:
        """Fresh scheduler, block table, sampler and counters over the same runner and KV pool."""
        config = self.config
        self.allocator = BlockAllocator(self.runner.num_kv_blocks, config.block_size,
                                        config.enable_prefix_caching)
        num_host_blocks = getattr(self.runner, "num_host_blocks", 0)
        self.host_tier = HostTier(num_host_blocks) if num_host_blocks else None
        self.scheduler = Scheduler(self.allocator, config.max_num_seqs, config.max_num_batched_tokens,
                                   self.max_model_len, self.host_tier,
                                   getattr(self.runner, "loads_landed", None), getattr(self.runner, "wait_load", None))
        # The sampler's random numbers are Philox keyed by (seed, step) and made on the host
        # (a few per row); this CPU generator only draws the keys of unseeded rows.
        self.sampler = Sampler(torch.Generator().manual_seed(config.seed), self.draw_graphs)
        if self.text is not None:
            self.text = TextStage(self.tokenizer, self.byte_table)
        self._requests: dict[str, Request] = {}  # every request whose final delta is not out yet
        self._pending: list[RequestDelta] = []  # final deltas of aborted / failed requests
        self._arrivals = itertools.count()
        self._num_generated = 0
        self._phase_seconds: dict[str, float] = {}
        self._started = time.monotonic()
        self._inflight = InFlightSteps()
        # Live requests whose next draw needs their last id on the host (no_repeat_ngram_size,
        # structured outputs): with async scheduling their step's draw waits for the step before
        # (the forward does not); without, every step is synchronous anyway.
        self._sync_ids: set[str] = set()
        # Speculative decoding (worker/spec_decode/): None when off; its steps are synchronous.
        self.spec_decoder = build_spec_decoder(config.speculative_config, self.max_model_len,
                                               self.draft_runner)
        self.scheduler.speculating = self.spec_decoder is not None
        if self.spec_decoder is not None:
            sc = config.speculative_config
            log.info("speculative decoding: %s, %d proposals a row%s", sc.method,
                     sc.num_speculative_tokens, f", draft {sc.model}" if sc.method == "draft_model" else "")
        mode = config.async_scheduling  # auto: on for CUDA (every runner fills pending rows on the device)
        self.async_scheduling = bool(self.runner.device.type == "cuda" if mode == "auto" else mode)
        self.pipeline_depth = getattr(self.runner, "pipeline_depth", 1)  # micro-batches in flight

    def _resolve_max_model_len(self) -> int:
        limit = self.spec.max_position_embeddings
        if self.config.max_model_len is None:
            return limit
        if self.config.max_model_len > limit:
            raise InvalidRequestError(f"max_model_len ({self.config.max_model_len}) exceeds the model's "
                                      f"max_position_embeddings ({limit})")
        return self.config.max_model_len

    # -- requests -------------------------------------------------------------------------------

    def add_request(self, prompt: Prompt, sampling_params: Optional[SamplingParams] = None,
                    request_id: Optional[str] = None, priority: int = 0,
                    resume_token_ids: Optional[Sequence[int]] = None) -> str:
        """Queue a request; raises `InvalidRequestError` / `OutOfMemoryError` naming the problem."""
        params = sampling_params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError(f"sampling_params must be SamplingParams, got {type(params).__name__}")
        request_id = str(request_id) if request_id is not None else uuid.uuid4().hex
        if request_id in self.scheduler.requests or request_id in self.structured.parked:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        text, ids = tokenize_prompt(prompt, self.tokenizer, self.spec.vocab_size)
        resume = list(resume_token_ids or [])
        check_lengths(len(ids), resume, params, self.max_model_len, self.spec.vocab_size)
        compiled = self.structured.compile(params)  # a bad spec raises here, before any token
        req = Request(request_id, ids, params, next(self._arrivals), priority, self.eos_token_ids,
                      resume, prompt=text)
        self.structured.admit(req, compiled, self.scheduler)  # queued, or parked while compiling
        self._requests[request_id] = req
        if params.no_repeat_ngram_size or compiled is not None:
            self._sync_ids.add(request_id)
        # A resumed seeded request continues the lost replica's random stream by itself: the
        # sampler keys a row's numbers by (seed, tokens generated), and resume tokens count.
        if self.text is not None:
            self.text.add(request_id, ids, params.stop, resume)
        return request_id

    def request(self, request_id: str) -> Request:
        """A queued, parked or running request (KeyError when none)."""
        req = self.scheduler.requests.get(request_id) or self.structured.parked.get(request_id)
        if req is None:
            raise KeyError(request_id)
        return req

    def prompt_token_ids(self, request_id: str) -> list[int]:
        """The prompt of a queued or running request, as tokenized by this engine."""
        return list(self.request(request_id).prompt_token_ids)

    def abort(self, request_id: str) -> bool:
        """Stop a request now and free its KV blocks; its final delta comes with the next step."""
        req = self.scheduler.abort(request_id)
        if req is None:
            req = self.structured.abort_parked(request_id)
            if req is None:
                return False
        self._drop_state(req.request_id)
        self._pending.append(self._final_delta(req))
        return True

    def stop_requests(self, request_ids: Sequence[str]) -> None:
        """End requests whose text hit a stop string (reported by a `TextStage`). Each still
        running gets its final delta with the next step; that final is the stage's to swallow."""
        for rid in request_ids:
            req = self.scheduler.requests.get(rid)
            if req is not None and not req.is_finished:
                self.scheduler.finish(req, RequestStatus.FINISHED, FinishReason.STOP.value)
                self._drop_state(rid)
                self._pending.append(self._final_delta(req))

    def has_unfinished_requests(self) -> bool:
        return (self.scheduler.has_unfinished() or bool(self._pending) or bool(self._inflight)
                or bool(self.structured.parked))

    # -- the step -------------------------------------------------------------------------------

    def step(self) -> list[RequestDelta]:
        """Run one scheduling step; return the deltas of every request that progressed (with
        async scheduling, those of the previous step). Every request that ended gets exactly
        one final delta, even if the step failed."""
        deltas, self._pending = self._pending, []
        if self.structured.parked:  # compiled grammars join the batch; failed compiles end
            idle = not (self.scheduler.has_unfinished() or self._inflight)
            for req in self.structured.admit_parked(self.scheduler, idle):
                self._drop_state(req.request_id)
                deltas.append(self._final_delta(req))
        out, launched = None, False
        depth = self.pipeline_depth
        try:
            while self._inflight and self._inflight.drain_next:
                self._collect(deltas)
            # Speculating: a step with proposals is a synchronous verify step (proposals need
            # every token on the host); one where speculation is off (disable_by_batch_size)
            # is an ordinary step, async where that is on.
            verify = self.spec_decoder is not None and self.spec_decoder.active(self.scheduler.running)
            if verify:
                while self._inflight:
                    self._collect(deltas)
            if self.spec_decoder is not None:
                self.spec_decoder.propose(self.scheduler.running, verify)
            out = self._schedule_next()
            if self.spec_decoder is not None:
                self.spec_decoder.start_step(out, verify)
            self._inflight.drain_next = out.blocked
            # Micro-batches: a row waits only for the draw of the oldest step, queued already.
            sync = depth == 1 and (not self.async_scheduling or verify)
            # Rows whose draw needs their last id on the host (a grammar's mask, n-gram bans):
            # the forward is queued now, the draw once the step before is collected.
            # (A verify step is synchronous: every row's tokens are on the host already.)
            defer = depth == 1 and self.async_scheduling and not verify and bool(
                self._sync_ids and any(s.request_id in self._sync_ids for s in out.requests))
            if self._inflight and (out.is_empty or sync):
                self._collect(deltas)  # a step that needs the ids
            # Host-tier copies, before the forward that reads them. They need no settled state:
            # they touch only blocks that no step in flight computes (worker/kv/copy.py).
            if out.has_swaps:
                self._timed("swap", self.runner.swap_blocks, out)
            if not out.is_empty:
                if depth > 1:
                    self._timed("launch", self._inflight.submit, out, self.runner,
                                self.scheduler.requests, self.eos_token_ids)
                elif verify:  # a verify step (worker/spec_decode/verify.py)
                    self._inflight.steps.append(self._timed(
                        "launch", self.spec_decoder.launch, out, self.runner, self.sampler,
                        self.scheduler.requests, self.eos_token_ids))
                else:
                    self._timed("launch", self._inflight.launch, out, self.runner, self.sampler,
                                self.scheduler.requests, self.eos_token_ids, defer)
                launched = True
            keep = depth - 1 + self.async_scheduling if depth > 1 else 1
            while len(self._inflight) > (0 if sync else keep):
                self._collect(deltas)  # step n, while step n+1 runs
            if launched and defer:  # step n's ids are on the host: draw step n+1
                self._timed("launch", self._inflight.draw_deferred, self.sampler,
                            self.scheduler.requests, self.eos_token_ids)
        except Exception as exc:  # a device fault must not take the other requests' replies down
            log.exception("engine step failed; failing the requests it had scheduled")
            outs = self._inflight.abandon() + ([out] if out is not None and not launched else [])
            loads = self.scheduler.has_loads
            if loads:  # host-tier copies in flight: let them finish before their blocks go back
                try:
                    self.scheduler.land_all_loads()
                except Exception:  # a broken device: nothing more will write them
                    pass
            self.scheduler.settle_all()  # the blocks of requests that ended meanwhile
            self._fail(outs if out is not None else None, exc, loads)
            deltas.extend(self._unreported_finals())  # rare path: a full scan is fine here
        if self.scheduler.failed_at_admission:
            failed, self.scheduler.failed_at_admission = self.scheduler.failed_at_admission, []
            for req in failed:
                if req.request_id in self._requests:
                    self._drop_state(req.request_id)
                    deltas.append(self._final_delta(req))
        if self.text is not None:
            deltas = self._timed("detokenize", self._detokenize, deltas)
        elif not self.defer_logprobs:
            resolve_logprobs(deltas)
        return deltas

    def _schedule_next(self) -> SchedulerOutput:
        """The next step. Async micro-batches: once P groups are in flight (or no request is
        free), queue the oldest group's draw and let the schedule continue that group with
        `pending_input` rows; the engine collects the oldest right after that submit."""
        sched, inflight, group = self.scheduler, self._inflight, self._group_size()
        can_preempt = not inflight
        if group is None or not self.async_scheduling or not inflight:
            return self._timed("schedule", sched.schedule, can_preempt, group)
        if len(inflight) < self.pipeline_depth:
            out = self._timed("schedule", sched.schedule, can_preempt, group)
            if not out.is_empty or out.blocked:
                return out
        oldest = inflight.steps[0]
        self._timed("launch", oldest.queue_draw, self.sampler)
        ids = {s.request_id for s in oldest.out.requests if s.request_id not in self._sync_ids}
        return self._timed("schedule", sched.schedule, can_preempt, group, ids)

    def _group_size(self) -> Optional[int]:
        """The next micro-batch's size (None: no micro-batches, the whole batch)."""
        if self.pipeline_depth == 1:
            return None
        sched = self.scheduler
        return group_size(len(sched.running), len(sched.waiting), self.config.max_num_seqs,
                          self.pipeline_depth)

    def _collect(self, deltas: list) -> None:
        """Wait for the oldest launched step's ids, apply them and emit its deltas."""
        step = self._inflight.steps[0]
        sampled, logprobs, redrawn = self._timed("wait", step.wait, self.sampler)
        burst = isinstance(step, VerifyStep)  # several tokens a request
        update = self.scheduler.update_verified if burst else self.scheduler.update
        advanced, _ = self._timed("update", update, step.out, sampled)
        if self._sync_ids:
            self.structured.advance(advanced, self.scheduler)
        self._emit_all(advanced, logprobs, deltas, burst)
        self._inflight.steps.pop(0)
        for rid in redrawn:  # rare: a later step computed it from the provisional id
            if rid in self.scheduler.requests and any(
                    s.request_id == rid for later in self._inflight.steps for s in later.out.requests):
                self.scheduler.rewind(rid)  # that step's token is dropped, its position redone
                self._inflight.drain_next = True  # and the request waits until it is collected

    def _drain(self) -> None:
        """Collect every launched step; their deltas go out with the next `step()`."""
        while self._inflight:
            self._collect(self._pending)

    def _detokenize(self, deltas: list[RequestDelta]) -> list[RequestDelta]:
        deltas, stops = self.text.process(deltas)
        self.stop_requests(stops)  # freed now: the next schedule sees their blocks
        return deltas
    def _timed(self, phase: str, fn, *args):
        """Run one phase of the step and add its wall time to `stats()["step_seconds"]`."""
        t = time.perf_counter()
        result = fn(*args)
        self._phase_seconds[phase] = self._phase_seconds.get(phase, 0.0) + time.perf_counter() - t
        return result

    def _emit(self, req: Request, logprobs: Optional[list], now: float) -> RequestDelta:
        """The raw delta of one request that advanced: new token ids, their logprobs, finish
        info. Token counts ride on every delta: text may end the request at any of them. Metrics
        ride on the first token's delta (a text stage that ends the request on a stop string
        later finishes them) and on the final one."""
        new_ids = req.output_token_ids[req.num_emitted_tokens:]
        self._num_generated += len(new_ids)
        req.num_emitted_tokens = len(req.output_token_ids)
        delta = RequestDelta(req.request_id, new_ids, "", logprobs,
                             None, None, req.num_prompt_tokens, req.num_cached_tokens,
                             num_cached_tokens_host=req.num_cached_tokens_host)
        if req.first_token_time is None:
            req.first_token_time = now
            delta.metrics = _metrics(req, None)
        if req.is_finished:
            delta.finish_reason = req.finish_reason
            delta.metrics = _metrics(req, now)
            self._drop_state(req.request_id)
        return delta

    def _emit_all(self, advanced: list[Request], logprobs: dict, deltas: list, burst: bool = False) -> None:
        """`logprobs`: an entry per request, or (`burst`: a verify step) a list of entries per
        request, one per token verified, of which those its stop rules kept are sent."""
        now = time.time()
        for req in advanced:  # appended one by one: a failure keeps what was already built
            lp = logprobs.get(req.request_id)
            if lp is not None:
                lp = lp[:len(req.output_token_ids) - req.num_emitted_tokens] if burst else [lp]
            deltas.append(self._emit(req, lp, now))

    def _fail(self, outs: Optional[list[SchedulerOutput]], exc: Exception, loads: bool = False) -> None:
        """End the scheduled requests of the failed steps `outs` (all requests if scheduling
        itself failed: None) as FAILED; `_unreported_finals` then sends their final deltas.
        `loads`: host-tier loads were in flight."""
        error = EngineError(f"engine step failed: {type(exc).__name__}: {exc}").to_dict()
        ids = ([s.request_id for out in outs for s in out.requests] if outs is not None
               else list(self.scheduler.requests))
        if loads or (outs is not None and any(out.has_swaps for out in outs)):  # copies may be half done
            ids = list(self.scheduler.requests)  # trust no cached KV
            self.allocator.reset_prefix_cache()
            self.host_tier.reset_prefix_cache()
        for rid in ids:
            req = self.scheduler.requests.get(rid)
            if req is not None:
                self.scheduler.finish(req, RequestStatus.FAILED, FinishReason.ERROR.value, error)

    def _unreported_finals(self) -> list[RequestDelta]:
        """Final deltas of requests that ended without one in a failed step. Finished requests
        that were reported have no state left."""
        finals = []
        for rid, req in list(self._requests.items()):
            if req.is_finished:
                self._drop_state(rid)
                finals.append(self._final_delta(req))
        return finals

    def _final_delta(self, req: Request) -> RequestDelta:
        return RequestDelta(req.request_id, [], "", None, req.finish_reason, req.error,
                            req.num_prompt_tokens, req.num_cached_tokens,
                            num_cached_tokens_host=req.num_cached_tokens_host,
                            metrics=_metrics(req, time.time()))

    def _drop_state(self, request_id: str) -> None:
        self._requests.pop(request_id, None)
        self._sync_ids.discard(request_id)
        self.sampler.release(request_id)  # penalty state kept on the device between steps

    def close(self) -> None:
        """Release the draw graphs and the runner's processes (tensor/pipeline-parallel ranks);
        idempotent."""
        if self.draw_graphs is not None:
            self.draw_graphs.release()
        self.structured.close()
        close = getattr(self.runner, "close", None)
        if close is not None:
            close()

    # -- KV pool --------------------------------------------------------------------------------

    def reset_cache(self, num_kv_blocks: Optional[int] = None,
                    kv_cache_dtype: Optional[str] = None) -> dict:
        """Give the engine a new KV pool between steps (see `kv_reset.reset_engine_cache`):
        running requests whose blocks fit keep their KV, the rest are preempted as usual; no
        request ends. Returns the new `capacity()`. Raises `InvalidRequestError` (bad target,
        tensor/pipeline parallel) or `OutOfMemoryError` (the pool does not fit), changing nothing."""
        self._drain()  # a settled state: no step may still write the pool
        reset_engine_cache(self, num_kv_blocks, kv_cache_dtype)
        if self.draft_runner is not None:  # the draft's pool follows, empty: drafts recompute
            attach_draft_pool(self.draft_runner, self.runner.num_kv_blocks, self.config.kv_cache_dtype)
            self.spec_decoder.proposer.invalidate()
        return self.capacity()

    # -- introspection (worker/engine/stats.py) ------------------------------------------------

    def request_phase(self, request_id: str) -> str:
        """`waiting`, `prefilling`, `generating` or `finished` (see `engine_stats.request_phase`)."""
        return request_phase(self, request_id)

    def stats(self) -> dict:
        return engine_stats(self)

    @property
    def started_at(self) -> float:
        """`time.monotonic()` when the engine was built (rates in `stats` are since then)."""
        return self._started

    @property
    def num_generated(self) -> int:
        """Tokens sampled since start, every request together."""
        return self._num_generated

    @property
    def phase_seconds(self) -> dict[str, float]:
        """Seconds spent per step phase since start (a copy)."""
        return dict(self._phase_seconds)

    def capacity(self) -> dict:
        return engine_capacity(self)


def _metrics(req: Request, finish_time: Optional[float]) -> RequestMetrics:
    return RequestMetrics(req.arrival_time, req.first_scheduled_time, req.first_token_time, finish_time)
