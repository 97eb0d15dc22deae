"""`StructuredRequests`: the engine's side of structured outputs (worker/structured/).

Owns: the replica's `GrammarCompilerPool` (built on the first constrained request), the parked
requests whose grammar is still compiling (`ParkedRequests`), attaching each request's
`GrammarState`, and ending a request whose grammar a collected step's tokens completed ("stop")
or left (failed). The engine calls it at
admission, at the start of each step and after each collect; it never touches tensors.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Optional

from infer_cluster.protocol import EngineError, FinishReason, InferClusterError, RequestStatus, SamplingParams

from infer_cluster.worker.engine.parked import ParkedRequests
from infer_cluster.worker.sched.request import Request
from infer_cluster.worker.structured.compiler import GrammarCompilerPool
from infer_cluster.worker.structured.state import GrammarState


class StructuredRequests:
    def __init__(self, tokenizer, vocab_size: int, eos_token_ids):
        self._tokenizer, self._vocab_size, self._eos = tokenizer, vocab_size, eos_token_ids
        self.pool: Optional[GrammarCompilerPool] = None
        self.parked = ParkedRequests()

    def compile(self, params: SamplingParams) -> Optional[Future]:
        """The future of the request's compiled grammar (the pool's, or its cache's); None
        without structured_outputs. A spec xgrammar refuses raises `InvalidRequestError`."""
        if params.structured_outputs is None:
            return None
        if self.pool is None:
            self.pool = GrammarCompilerPool(self._tokenizer, self._vocab_size, self._eos)
        return self.pool.submit(params.structured_outputs)

    def admit(self, req: Request, compiled: Optional[Future], scheduler) -> None:
        """Queue `req` now (no grammar, or a cached one) or park it until its compile ends."""
        if compiled is not None and not compiled.done():
            self.parked.park(req, compiled)
            return
        if compiled is not None:  # synced to any resume tokens at the first draw
            req.grammar = GrammarState(compiled.result())
        scheduler.add(req)  # raises OutOfMemoryError if it can never fit

    def admit_parked(self, scheduler, idle: bool) -> list[Request]:
        """Queue the parked requests whose grammar compiled; returns those whose compile (or
        admission) failed, ended FAILED. `idle`: nothing else to run, so wait a moment for a
        compile instead of spinning."""
        if idle:
            self.parked.wait(0.05)
        failed = []
        for req, compiled in self.parked.ready():
            try:
                if isinstance(compiled, BaseException):
                    raise compiled
                req.grammar = GrammarState(compiled)
                scheduler.add(req)
            except InferClusterError as exc:
                req.transition(RequestStatus.FAILED)
                req.finish_reason, req.error = FinishReason.ERROR.value, exc.to_dict()
                failed.append(req)
        return failed

    def abort_parked(self, request_id: str) -> Optional[Request]:
        req = self.parked.pop(request_id)
        if req is not None:
            req.transition(RequestStatus.ABORTED)
            req.finish_reason = FinishReason.ABORT.value
        return req

    @staticmethod
    def advance(advanced: list[Request], scheduler) -> None:
        """End the constrained requests that a collected step's tokens finished: a complete
        grammar (its stop token accepted) ends the request with "stop"; a refused token (never,
        under the mask) ends it failed. Only a request whose new token is one of its grammar's
        stop tokens, or whose state broke, is synced here; the others' matchers take their
        tokens with the next mask's fill, on the helper thread (worker/structured/bitmask.py:
        `prefill`), or at the draw (`GrammarState.sync`). Why: at 256 rows this loop took
        ~2.5 ms of the H200 host's step (547aa05), on the path from one step's ids to the next
        step's draw."""
        for req in advanced:
            g = req.grammar
            if g is None or req.is_finished:  # an EOS the grammar allowed ended it already
                continue
            out = req.output_token_ids
            if not (g.broken or (out and out[-1] in g.stop_ids)):
                continue
            if not g.sync(out):
                error = EngineError("the output left its structured_outputs grammar").to_dict()
                scheduler.finish(req, RequestStatus.FAILED, FinishReason.ERROR.value, error)
            elif g.is_terminated:  # ignore_eos, or a stop token of the grammar's own
                scheduler.finish(req, RequestStatus.FINISHED, FinishReason.STOP.value)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
