"""`DynamicEngine`: one replica's continuous-batching engine.

Owns: request admission (validation → `Request`), the step loop
(schedule → run → sample → update → deltas), incremental detokenizers, aborts, and stats.
Per-request sampling state (penalty counts, n-gram maps) lives in the `Sampler`, released here
when a request ends. Scheduling and block bookkeeping live in `Scheduler` /
`BlockAllocator` (plain Python); tensors live in `ModelRunner`. Single-threaded: callers (the
offline `LLM`, the replica server's engine loop) drive it from one thread.
To extend: new per-request behaviour goes into `_post_process`; new per-step work into
`ModelRunner`; keep `step()` about ten lines.
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from typing import Optional, Sequence, Union

import torch

from infer_cluster.protocol import (EngineError, FinishReason, InvalidRequestError, RequestDelta, RequestStatus,
                      SamplingParams)

from .block_allocator import BlockAllocator
from .config import EngineConfig
from .detokenizer import IncrementalDetokenizer, byte_level_table
from .loader import load_hf_config, load_tokenizer, resolve_model_path
from .model_runner import ModelRunner
from .models.decoder import ModelSpec
from .request import Request
from .sampler import Sampler, SamplingRequestState
from .scheduler import Scheduler, SchedulerOutput

log = logging.getLogger(__name__)

Prompt = Union[str, Sequence[int]]


def _eos_ids(hf_config, tokenizer) -> tuple[int, ...]:
    ids = set()
    for src in (getattr(hf_config, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if isinstance(src, int):
            ids.add(src)
        elif isinstance(src, (list, tuple)):
            ids.update(int(x) for x in src)
    return tuple(sorted(ids))


class DynamicEngine:
    def __init__(self, config: EngineConfig, runner_factory=None):
        self.config = config
        self.model_path = resolve_model_path(config.model)
        self.model_name = config.model
        hf_config = load_hf_config(self.model_path)
        self.tokenizer = load_tokenizer(resolve_model_path(config.tokenizer) if config.tokenizer else self.model_path)
        try:
            self.spec = ModelSpec.from_hf_config(hf_config)
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None
        self.max_model_len = self._resolve_max_model_len()
        self.eos_token_ids = _eos_ids(hf_config, self.tokenizer)
        self._byte_table = byte_level_table(self.tokenizer)
        if runner_factory is None and config.world_size > 1:
            from .distributed import DistributedRunner
            runner_factory = DistributedRunner
        factory = runner_factory or ModelRunner
        self.runner = factory(config, self.spec, self.model_path, hf_config, self.max_model_len)
        self.allocator = BlockAllocator(self.runner.num_kv_blocks, config.block_size,
                                        config.enable_prefix_caching)
        self.scheduler = Scheduler(self.allocator, config.max_num_seqs, config.max_num_batched_tokens,
                                   self.max_model_len)
        # The sampler's random numbers are Philox keyed by (seed, step) and made on the host
        # (a few per row); this CPU generator only draws the keys of unseeded rows.
        self.sampler = Sampler(torch.Generator().manual_seed(config.seed))
        self._detok: dict[str, IncrementalDetokenizer] = {}
        self._requests: dict[str, Request] = {}  # every request whose final delta is not out yet
        self._pending: list[RequestDelta] = []  # final deltas of aborted / failed requests
        self._arrivals = itertools.count()
        self._num_generated = 0
        self._phase_seconds: dict[str, float] = {}
        self._started = time.monotonic()

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
        if request_id in self.scheduler.requests:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        text, ids = self._tokenize(prompt)
        resume = list(resume_token_ids or [])
        if len(ids) + len(resume) >= self.max_model_len:
            raise InvalidRequestError(f"prompt has {len(ids) + len(resume)} tokens; max_model_len is "
                                      f"{self.max_model_len} (leave room for at least one new token)")
        for t in resume:
            if not isinstance(t, int) or not 0 <= t < self.spec.vocab_size:
                raise InvalidRequestError(f"resume_token_ids holds {t!r}, not a token id of this model")
        if len(resume) >= params.max_tokens:
            raise InvalidRequestError(f"resume_token_ids already has {len(resume)} tokens; max_tokens is {params.max_tokens}")
        req = Request(request_id, ids, params, next(self._arrivals), priority, self.eos_token_ids,
                      resume, prompt=text)
        self.scheduler.add(req)  # raises OutOfMemoryError if it can never fit
        self._requests[request_id] = req
        # A resumed seeded request continues the lost replica's random stream by itself: the
        # sampler keys a row's numbers by (seed, tokens generated), and resume tokens count.
        detok = IncrementalDetokenizer(self.tokenizer, ids, params.stop, byte_table=self._byte_table)
        for token in resume:
            # Replay the delivered tokens one push at a time, as the lost replica did: text it
            # held back (half a UTF-8 character, a possible stop-string start) was never
            # delivered and must come out with the first new token.
            detok.push([token])
        self._detok[request_id] = detok
        return request_id

    def prompt_token_ids(self, request_id: str) -> list[int]:
        """The prompt of a queued or running request, as tokenized by this engine."""
        return list(self.scheduler.requests[request_id].prompt_token_ids)

    def _tokenize(self, prompt: Prompt) -> tuple[Optional[str], list[int]]:
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt, add_special_tokens=True)
            text = prompt
        elif isinstance(prompt, (list, tuple)):
            ids, text = list(prompt), None
            for t in ids:
                if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.spec.vocab_size:
                    raise InvalidRequestError(f"prompt token id {t!r} is outside the vocabulary "
                                              f"[0, {self.spec.vocab_size})")
        else:
            raise InvalidRequestError(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}")
        if not ids:
            raise InvalidRequestError("prompt is empty")
        return text, ids

    def abort(self, request_id: str) -> bool:
        """Stop a request now and free its KV blocks; its final delta comes with the next step."""
        req = self.scheduler.abort(request_id)
        if req is None:
            return False
        self._pending.append(self._final_delta(req, self._drop_state(req.request_id)))
        return True

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._pending)

    # -- the step -------------------------------------------------------------------------------

    def step(self) -> list[RequestDelta]:
        """Run one scheduling step; return the deltas of every request that progressed.
        Every request that ended gets exactly one final delta, even if the step failed."""
        deltas, self._pending = self._pending, []
        out = None
        try:
            out = self._timed("schedule", self.scheduler.schedule)
            if not out.is_empty:
                sampled, logprobs = self._timed("forward_and_sample", self._run, out)
                advanced, _ = self._timed("update", self.scheduler.update, out, sampled)
                self._timed("detokenize", self._post_process_all, advanced, logprobs, deltas)
        except Exception as exc:  # a device fault must not take the other requests' replies down
            log.exception("engine step failed; failing the requests it had scheduled")
            self._fail(out, exc)
            deltas.extend(self._unreported_finals())  # rare path: a full scan is fine here
        if self.scheduler.failed_at_admission:
            failed, self.scheduler.failed_at_admission = self.scheduler.failed_at_admission, []
            deltas.extend(self._final_delta(req, self._drop_state(req.request_id))
                          for req in failed if req.request_id in self._requests)
        return deltas
    def _timed(self, phase: str, fn, *args):
        """Run one phase of the step and add its wall time to `stats()["step_seconds"]`."""
        t = time.perf_counter()
        result = fn(*args)
        self._phase_seconds[phase] = self._phase_seconds.get(phase, 0.0) + time.perf_counter() - t
        return result

    def _run(self, out: SchedulerOutput) -> tuple[dict[str, int], dict[str, object]]:
        logits, row_ids = self.runner.execute(out)
        rows = []
        for rid in row_ids:
            req = self.scheduler.requests[rid]
            rows.append(SamplingRequestState(req.params, req.prompt_token_ids, req.output_token_ids,
                                             None, self.eos_token_ids, rid))
        # The runner's logits are this step's own tensor: the sampler may edit them in place.
        result = self.sampler(logits, rows, logits_writable=True)
        return dict(zip(row_ids, result.token_ids)), dict(zip(row_ids, result.logprobs))

    def _post_process(self, req: Request, logprob) -> RequestDelta:
        """Detokenize the new token, apply stop strings, and build the delta."""
        self._num_generated += 1
        new_ids = req.output_token_ids[req.num_emitted_tokens:]
        req.num_emitted_tokens = len(req.output_token_ids)
        text, stopped = self._detok[req.request_id].push(new_ids, final=req.is_finished)
        if stopped and not req.is_finished:
            self.scheduler.finish(req, RequestStatus.FINISHED, FinishReason.STOP.value)
        elif stopped:
            # The stop string completed on the token that also hit max_tokens / max_model_len:
            # the text was cut at the stop string, so "stop" is what ended it (as in vLLM).
            req.finish_reason = FinishReason.STOP.value
        delta = RequestDelta(req.request_id, new_ids, text,
                             [logprob] if logprob is not None else None)
        if req.is_finished:
            delta.text += self._drop_state(req.request_id)
            delta.finish_reason = req.finish_reason
            delta.num_prompt_tokens = req.num_prompt_tokens
            delta.num_cached_tokens = req.num_cached_tokens
        return delta

    def _post_process_all(self, advanced: list[Request], logprobs: dict, deltas: list) -> None:
        for req in advanced:  # appended one by one: a failure keeps what was already built
            deltas.append(self._post_process(req, logprobs.get(req.request_id)))

    def _fail(self, out: Optional[SchedulerOutput], exc: Exception) -> None:
        """End the step's scheduled requests (all requests if scheduling itself failed) as
        FAILED; `_unreported_finals` then sends their final deltas."""
        error = EngineError(f"engine step failed: {type(exc).__name__}: {exc}").to_dict()
        ids = [s.request_id for s in out.requests] if out is not None else list(self.scheduler.requests)
        for rid in ids:
            req = self.scheduler.requests.get(rid)
            if req is not None:
                self.scheduler.finish(req, RequestStatus.FAILED, FinishReason.ERROR.value, error)

    def _unreported_finals(self) -> list[RequestDelta]:
        """Final deltas of requests that ended without one in a failed step. Finished requests
        that were reported have no state left."""
        return [self._final_delta(req, self._drop_state(rid))
                for rid, req in list(self._requests.items()) if req.is_finished]

    def _final_delta(self, req: Request, text: str) -> RequestDelta:
        return RequestDelta(req.request_id, [], text, None, req.finish_reason, req.error,
                            req.num_prompt_tokens, req.num_cached_tokens)

    def _drop_state(self, request_id: str) -> str:
        self._requests.pop(request_id, None)
        self.sampler.release(request_id)  # penalty state kept on the device between steps
        detok = self._detok.pop(request_id, None)
        return detok.flush() if detok is not None else ""

    def close(self) -> None:
        """Release the runner's processes (tensor/pipeline-parallel ranks); idempotent."""
        close = getattr(self.runner, "close", None)
        if close is not None:
            close()

    # -- introspection --------------------------------------------------------------------------

    def stats(self) -> dict:
        elapsed = max(1e-9, time.monotonic() - self._started)
        return {"num_running": len(self.scheduler.running), "num_waiting": len(self.scheduler.waiting),
                "num_preemptions": self.scheduler.num_preemptions,
                "prefix_cache_hit_tokens": self.scheduler.prefix_cache_hit_tokens,
                "num_free_blocks": self.allocator.num_free_blocks,
                "num_total_blocks": self.allocator.num_blocks,
                "num_generated_tokens": self._num_generated,
                "generated_tokens_per_s": self._num_generated / elapsed,
                "max_num_seqs": self.config.max_num_seqs,
                "step_seconds": dict(self._phase_seconds)}

    def capacity(self) -> dict:
        return {"model": self.model_name, "num_total_blocks": self.allocator.num_blocks,
                "block_size": self.config.block_size, "max_num_seqs": self.config.max_num_seqs,
                "max_model_len": self.max_model_len}
