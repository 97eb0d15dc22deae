"""`DynamicEngine`: one replica's continuous-batching engine.

Owns: request admission (worker/sched/admission.py; a request whose grammar is compiling waits
outside the batch: worker/engine/structured.py), the step loop, aborts, and stats.
The step (`step()`): schedule, launch on the device, collect, emit. With
`EngineConfig.async_scheduling` step n+1 is scheduled and launched (forward + draw,
worker/engine/inflight.py) while step n's ids are on their way; then step n is collected (its
ids applied by the scheduler) and its deltas emitted (worker/engine/deltas.py). A step holding a
row whose draw needs its last id on the host (a grammar's mask, an n-gram ban) launches its
forward at once and its draw in the next `step()` (`_step_mode`: defer): that step() collects
step n first, starts filling step n+1's masks on a helper thread, schedules step n+2 meanwhile,
queues step n+1's draw and then launches step n+2, so step n stays in flight until then. The
host's text, schedule and launch overlap the device as in an ordinary async step; only the
collect, the matchers' advance and what of the fill the schedule does not cover stand between
step n's ids and step n+1's draw. A speculative verify step stays in flight until the next
step(), which collects it before it proposes (its rows got several tokens each). Collected
before the next schedule: async off, and settled-state cases (a schedule that
preempted, `reset_cache`, failures, a rewind after the sampler's rare redo changed a token a step
in flight already used: `Scheduler.rewind`). Pipeline micro-batches (`pipeline_depth` P > 1,
worker/sched/microbatch.py): up to P steps in flight on disjoint groups of the batch.
Speculative decoding (worker/spec_decode/): before the schedule the decoder decides whether the
step verifies proposals (`_propose`); where a verify step or a plain step of plain greedy rows
is in flight, the next verify step may be chained to it instead (`_chain`:
worker/engine/chaining.py, and worker/spec_decode/chain.py; launched first, its rows written on
the device from the step in flight, which is collected after); a draft model's runner is built
here (worker/engine/draft.py).
Per-request sampling state lives in the `Sampler`, released when a request ends. Text is made by
a `TextStage` (worker/text/text_stage.py): inline for the offline `LLM`, or on the replica's text
thread. Scheduling and blocks live in `Scheduler` /
`BlockAllocator` (plain Python), tensors in `ModelRunner`; the per-run state (scheduler,
sampler, counters, steps in flight) is made by worker/engine/bookkeeping.py. Single-threaded.
To extend: per-request behaviour goes into worker/engine/deltas.py (text: `TextStage`), per-step
device work into `ModelRunner`; keep `step()` legible.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Optional, Sequence

from infer_cluster.protocol import FinishReason, InvalidRequestError, RequestDelta, RequestStatus, SamplingParams

from infer_cluster.worker.sched.admission import Prompt, check_lengths, tokenize_prompt
from infer_cluster.worker.config import EngineConfig
from infer_cluster.worker.sampling.draw_graphs import DrawGraphs
from infer_cluster.worker.engine.stats import engine_capacity, engine_stats, request_phase
from infer_cluster.worker.engine.bookkeeping import reset_bookkeeping
from infer_cluster.worker.engine.deltas import final_delta, step_logprobs, token_delta
from infer_cluster.worker.engine.failures import recover_step
from infer_cluster.worker.engine.draft import attach_draft_pool, build_draft_runner
from infer_cluster.worker.engine.kv_reset import reset_engine_cache
from infer_cluster.worker.engine.structured import StructuredRequests
from infer_cluster.worker.engine.model_load import load_model
from infer_cluster.worker.text.host_idle import HostIdle
from infer_cluster.worker.text.logprob_rows import resolve_logprobs
from infer_cluster.worker.sched.microbatch import group_size
from infer_cluster.worker.runner.model_runner import ModelRunner
from infer_cluster.worker.sched.request import Request
from infer_cluster.worker.sched.output import SchedulerOutput
from infer_cluster.worker.engine.chaining import launch_chained
from infer_cluster.worker.spec_decode.verify import VerifyStep
from infer_cluster.worker.text.text_stage import TextStage

log = logging.getLogger(__name__)


class DynamicEngine:
    def __init__(self, config: EngineConfig, runner_factory=None, detokenize: bool = True):
        self.config = config
        self.model_name = config.model
        model = load_model(config)  # worker/engine/model_load.py
        hf_config = model.hf_config
        self.model_path, self.tokenizer, self.spec = model.path, model.tokenizer, model.spec
        self.max_model_len, self.eos_token_ids = model.max_model_len, model.eos_token_ids
        self.byte_table = model.byte_table  # None: the detokenizer's window path
        # detokenize=False: the caller runs its own TextStage (see `text_stage.TextWorker`).
        self.text: Optional[TextStage] = TextStage(self.tokenizer, self.byte_table) if detokenize else None
        # True when a TextStage downstream builds the logprob entries (worker/text/logprob_rows.py).
        self.defer_logprobs = False
        # Set by whoever runs text on a helper thread: open while this thread waits on the device.
        self.host_idle: Optional[HostIdle] = None
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
        reset_bookkeeping(self)  # worker/engine/bookkeeping.py
        log.info("async scheduling: %s", "on" if self.async_scheduling else "off")
        if config.pipeline_parallel_size > 1:
            log.info("pipeline micro-batches: %s", f"on, {self.pipeline_depth} groups in flight"
                     if self.pipeline_depth > 1 else "off (one step at a time)")
        self.warmup_stats: Optional[dict] = None
        warmup = config.warmup if config.warmup is not None else self.runner.device.type == "cuda"
        if warmup:
            from infer_cluster.worker.engine.warmup import warm_up_engine
            self.warmup_stats = warm_up_engine(self)
            reset_bookkeeping(self)  # the first real request sees a fresh engine

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
            self.text.add(request_id, ids, params.stop, resume, logprob_bytes=params.logprob_bytes)
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
        self._pending.append(final_delta(req))
        return True

    def stop_requests(self, request_ids: Sequence[str]) -> None:
        """End requests whose text hit a stop string (reported by a `TextStage`). Each still
        running gets its final delta with the next step; that final is the stage's to swallow."""
        for rid in request_ids:
            req = self.scheduler.requests.get(rid)
            if req is not None and not req.is_finished:
                self.scheduler.finish(req, RequestStatus.FINISHED, FinishReason.STOP.value)
                self._drop_state(rid)
                self._pending.append(final_delta(req))

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
                deltas.append(final_delta(req))
        out, launched = None, False
        try:
            while self._inflight and self._inflight.drain_next:
                self._collect(deltas)
            if self._inflight.awaiting_draw:  # a deferred draw: the steps before it first,
                while len(self._inflight) > 1:  # then its masks fill (a helper thread) while
                    self._collect(deltas)       # its forward runs and the next step is scheduled
                self._inflight.prefill_deferred(self.sampler, self.scheduler.requests)
            verify = self.spec_decoder is not None and self._timed(
                "propose", self.spec_decoder.active, self.scheduler.running, len(self.scheduler.waiting))
            out = self._timed("launch", self._chain) if verify else None
            if out is not None:  # a chained verify step runs: collect the verify step before it
                launched = True
                self._collect(deltas)
            else:
                verify = self._propose(deltas, verify)
                out = self._schedule_next()
                if self.spec_decoder is not None:
                    self._timed("propose", self.spec_decoder.start_step, out, verify)
                self._inflight.drain_next = out.blocked
                sync, defer = self._step_mode(out, verify)
                if self._inflight.awaiting_draw:  # before any launch: the next forward reads its ids
                    self._draw_deferred(out)
                if self._inflight and (out.is_empty or sync):
                    self._collect(deltas)  # a step that needs the ids
                # Host-tier copies, before the forward that reads them. They need no settled state:
                # they touch only blocks that no step in flight computes (worker/kv/copy.py).
                if out.has_swaps:
                    self._timed("swap", self.runner.swap_blocks, out)
                if not out.is_empty:
                    self._timed("launch", self._launch, out, verify, defer)
                    launched = True
                depth = self.pipeline_depth
                # a deferred draw keeps the step before it in flight: collected at the next step()
                keep = depth - 1 + self.async_scheduling if depth > 1 else 1 + (launched and defer)
                while len(self._inflight) > (0 if sync else keep):
                    self._collect(deltas)  # step n, while step n+1 runs
            # Steps whose every request ended (a chained verify step launched before the step
            # that ended them was collected): nothing may call step() again for them, so they
            # are collected now and their blocks come back with the last final.
            while self._inflight and not self.scheduler.has_unfinished():
                self._collect(deltas)
        except Exception as exc:  # a device fault must not take the other requests' replies down
            log.exception("engine step failed; failing the requests it had scheduled")
            recover_step(self, out, launched, exc, deltas)  # worker/engine/failures.py
        if self.scheduler.failed_at_admission:
            failed, self.scheduler.failed_at_admission = self.scheduler.failed_at_admission, []
            for req in failed:
                if req.request_id in self._requests:
                    self._drop_state(req.request_id)
                    deltas.append(final_delta(req))
        if self.text is not None:
            deltas = self._timed("detokenize", self._detokenize, deltas)
        elif not self.defer_logprobs:
            resolve_logprobs(deltas)
        return deltas

    def _chain(self) -> Optional[SchedulerOutput]:
        """Launch a chained verify step after the step in flight (a verify step, or a plain one)
        where one may follow it (worker/engine/chaining.py): its output, or None (nothing
        changed). A method of its own so bench/step_log.py can time it per instance."""
        return launch_chained(self)

    def _propose(self, deltas: list, verify: bool) -> bool:
        """Speculating: whether the next step verifies proposals (`verify`: what
        `SpecDecoder.active` decided), and the proposals. Proposals need every token on the
        host, so the steps in flight are collected first, unless the tokens already on the host
        propose nothing (`SpecDecoder.worth_waiting`: then the step is an ordinary one and the
        pipeline keeps going); they always are after a verify step, whatever comes next. A step
        that does not speculate is an ordinary step, async where that is on."""
        if self.spec_decoder is None:
            return False
        running, decoder = self.scheduler.running, self.spec_decoder
        if self._inflight.holds_verify or (verify and self._inflight
                                           and self._timed("propose", decoder.worth_waiting, running)):
            while self._inflight:  # a verify step's rows got several tokens each
                self._collect(deltas)
        return self._timed("propose", decoder.propose, running, verify)  # none: an ordinary step

    def _step_mode(self, out: SchedulerOutput, verify: bool) -> tuple[bool, bool]:
        """(sync, defer) for the scheduled step. sync: collected before the next schedule (async
        off, a verify step). defer: its draw waits for the step before, its forward does not
        (a row whose draw needs its last id on the host: a grammar's mask, an n-gram ban).
        Micro-batches (depth > 1): a row waits only for the draw of the oldest step, queued
        already."""
        if self.pipeline_depth > 1:
            return False, False
        sync = not self.async_scheduling
        defer = not (sync or verify) and bool(self._sync_ids and any(s.request_id in self._sync_ids
                                                                     for s in out.requests))
        return sync, defer

    def _launch(self, out: SchedulerOutput, verify: bool, defer: bool) -> None:
        """Start the step on the device: a micro-batch, a verify step (worker/spec_decode/
        verify.py) or an ordinary step (worker/engine/inflight.py), its draw deferred or not."""
        requests, eos = self.scheduler.requests, self.eos_token_ids
        if self.pipeline_depth > 1:
            self._inflight.submit(out, self.runner, requests, eos)
        elif verify:
            self._inflight.steps.append(self.spec_decoder.launch(out, self.runner, self.sampler, requests, eos))
        else:
            self._inflight.launch(out, self.runner, self.sampler, requests, eos, defer)

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

    def _draw_deferred(self, later: Optional[SchedulerOutput] = None) -> None:
        """Queue the draw of the latest step, launched with its draw deferred (every step
        before it collected). `later`: the step scheduled after it, not launched yet."""
        self._timed("launch", self._inflight.draw_deferred, self.sampler, self.scheduler.requests,
                    self.eos_token_ids, later)

    def _collect(self, deltas: list) -> None:
        """Wait for the oldest launched step's ids, apply them and emit its deltas."""
        step = self._inflight.steps[0]
        if step is self._inflight.last and self._inflight.awaiting_draw:
            self._draw_deferred()
        sampled, logprobs, redrawn = self._timed("wait", self._wait, step)
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

    def _wait(self, step):
        """The step's ids on the host. Helper threads run meanwhile (`host_idle`)."""
        if self.host_idle is None:
            return step.wait(self.sampler)
        with self.host_idle.idle():
            return step.wait(self.sampler)

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
        """The delta of one request that advanced (worker/engine/deltas.py)."""
        self._num_generated += len(req.output_token_ids) - req.num_emitted_tokens
        delta = token_delta(req, logprobs, now)
        if req.is_finished:
            self._drop_state(req.request_id)
        return delta

    def _emit_all(self, advanced: list[Request], logprobs: dict, deltas: list, burst: bool = False) -> None:
        """`logprobs`: an entry per request, or (`burst`: a verify step) a list of entries per
        request, one per token verified."""
        now = time.time()
        for req in advanced:  # appended one by one: a failure keeps what was already built
            entry = logprobs.get(req.request_id) if logprobs else None
            deltas.append(self._emit(req, None if entry is None else step_logprobs(req, entry, burst), now))

    def _drop_state(self, request_id: str) -> None:
        self._requests.pop(request_id, None)
        self._sync_ids.discard(request_id)
        self.sampler.release(request_id)  # penalty state kept on the device between steps

    def close(self) -> None:
        """Release the draw graphs and the runner's processes (tensor/pipeline-parallel ranks);
        idempotent. A device that a rank's failure left stuck (`device_stuck`: a symmetric-memory
        all-reduce waits for the dead rank, worker/device/wait.py) never finishes its queued
        work, so the draw graphs are not released there (their release waits for the device):
        they stay until the process exits."""
        if self.draw_graphs is not None and not getattr(self.runner, "device_stuck", False):
            self.draw_graphs.release()
        self.structured.close()
        self.sampler.close()
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

