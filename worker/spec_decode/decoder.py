"""`SpecDecoder`: what a speculating engine holds: the proposer, verify steps and the counters.

Owns: building the proposer for `EngineConfig.speculative_config` (`build_spec_decoder`): prompt lookup
(`ngram.py`) or a draft model (`draft.py`, over the runner the engine built for it),
whether a step speculates (`active`: not where `disable_by_batch_size` or more requests run, and
with `adaptive` only where the `SpecGovernor` measured it to pay), whether a speculating step
waits for the steps in flight before proposing (`worth_waiting`), telling the governor what
each step was (`start_step`),
proposing before each schedule (in a plain step, a few shadow proposals that measure what
verify steps would accept, shadow.py), launching `VerifyStep`s (a draft model fills in its proposals
first), and the stats keys (`stats`). The engine calls these and `Scheduler.update_verified`;
with speculation off it holds None and none of this runs.
"""

from __future__ import annotations

import time
from typing import Optional

from infer_cluster.worker.device.streams import StreamRecorder
from infer_cluster.worker.spec_decode.config import SpeculativeConfig
from infer_cluster.worker.spec_decode.draft import DraftProposer
from infer_cluster.worker.spec_decode.governor import SpecGovernor
from infer_cluster.worker.spec_decode.ngram import NgramProposer, row_limit
from infer_cluster.worker.spec_decode.shadow import ShadowAcceptance
from infer_cluster.worker.spec_decode.verify import SpecStats, VerifyStep, verify_max_rows


class SpecDecoder:
    def __init__(self, config: SpeculativeConfig, max_model_len: int, draft_runner=None):
        """`draft_runner`: the draft model's runner (method draft_model), built by the engine."""
        self.config = config
        self.max_rows = verify_max_rows()  # the runner's verify graphs were captured up to it
        if config.method == "draft_model":
            if draft_runner is None:
                raise ValueError("method 'draft_model' needs the draft model's runner")
            self.proposer = DraftProposer(config.num_speculative_tokens, max_model_len, draft_runner,
                                          self.max_rows)
        else:
            self.proposer = NgramProposer(config.num_speculative_tokens, config.prompt_lookup_min,
                                          config.prompt_lookup_max, max_model_len, self.max_rows)
        self.counters = SpecStats(config.num_speculative_tokens)
        self.recorder = StreamRecorder()  # the verify steps' events
        k = config.num_speculative_tokens
        rows = self.max_rows
        self.governor: Optional[SpecGovernor] = (SpecGovernor(lambda batch: row_limit(k, batch, rows) + 1)
                                                 if config.adaptive else None)
        self.speculating = False  # the last `active` decision
        # the last `host_lookups`: ({request id: tokens}, counts), which `worth_waiting` reuses
        # where nothing moved since (a plain step in flight: the chain tried first)
        self._host_found: Optional[tuple[dict, list[int]]] = None
        # what plain steps' rows would have accepted (prompt lookup only: a draft needs a forward)
        shadow = getattr(self.proposer, "shadow", None)
        self.shadow = (ShadowAcceptance(shadow) if shadow is not None and self.governor is not None
                       else None)

    def active(self, running, num_waiting: int = 0) -> bool:
        """Whether the next step speculates: not where `disable_by_batch_size` or more
        requests are running, and with `adaptive` only where the governor measured it to pay
        at this batch size (measuring only in steps that will be decode-only: no request
        waiting, every running prompt computed)."""
        self.speculating = self._active(running, num_waiting)
        return self.speculating

    def _active(self, running, num_waiting: int) -> bool:
        limit = self.config.disable_by_batch_size
        if limit is not None and len(running) >= limit:
            return False
        if self.governor is None or not running:
            return True
        steady = not num_waiting and all(r.num_computed_tokens >= r.num_prompt_tokens for r in running)
        return self.governor.decide(len(running), steady)

    def start_step(self, out, verify: bool) -> None:
        """The step just scheduled (`verify`: with proposals) starts now: the governor times
        the one before it."""
        if self.governor is None:
            return
        if out.is_empty:
            self.governor.idle()
            return
        # every row one token (each has at least one): O(1) where the step verifies nothing
        decode_only = (all(len(s.token_ids) - s.num_spec_tokens == 1 for s in out.requests) if verify
                       else out.num_batched_tokens == len(out.requests))
        # the mode decided: a speculating step with nothing proposed keeps it (and, verifying
        # nothing, reports no tokens, so its time is not counted as a verify step's)
        self.governor.start_step(time.perf_counter(), len(out.requests), self.speculating, decode_only)

    def propose(self, running, active: bool = True) -> bool:
        """Set `spec_token_ids` on the running requests (before the schedule; every token of
        theirs on the host); none at all in a step that does not speculate (`active` False:
        their tokens may still be on the device). Whether any request got a proposal (prompt
        lookup finds none in text that never repeats: that step is an ordinary one)."""
        if not active:
            # the last speculating step's proposals stay on its requests, and the scheduler adds
            # any proposals a decode row holds
            for req in running:
                if req.spec_token_ids:
                    req.spec_token_ids = []
            if self.shadow is not None and running and self.governor.wants_shadow(len(running)):
                tokens = self.shadow.step(running)
                if tokens is not None:
                    self.governor.shadowed(len(running), tokens)
            return False
        self.proposer.propose(running)
        return any(req.spec_token_ids for req in running)

    def worth_waiting(self, running) -> bool:
        """Whether a step that would speculate should wait for the steps in flight before it
        proposes. Prompt lookup asks the tokens already on the host first (the last of a row
        may still be pending): where no row's suffix occurred before, the newest token rarely
        makes one occur, so the step runs as an ordinary one without that wait. Why: at batch
        1 a step that proposed nothing cost a synchronous plain step, ~0.3 ms more than an async
        one (H200, SmolLM2, 2026-11-29), in every stretch of text that copies nothing. A
        draft model always waits (its proposals need a forward)."""
        probe = getattr(self.proposer, "shadow", None)
        if probe is None:
            return True
        found, self._host_found = self._host_found, None
        if found is not None and found[0] == {req.request_id: req.num_tokens for req in running}:
            return any(found[1])
        batch = len(running)
        return any(probe(req, batch) for req in running)

    def host_lookups(self, running) -> list[int]:
        """Per request, how many proposals prompt lookup finds in the tokens already on the host
        (its last may still be pending): where a chained step after a plain step gives proposal
        positions (worker/engine/chaining.py). Zeros for a draft model."""
        probe = getattr(self.proposer, "shadow", None)
        if probe is None:
            return [0] * len(running)
        batch = len(running)
        counts = [len(probe(req, batch)) for req in running]
        self._host_found = ({req.request_id: req.num_tokens for req in running}, counts)
        return counts

    def launch(self, out, runner, sampler, requests: dict, eos_token_ids) -> VerifyStep:
        fill = getattr(self.proposer, "fill", None)
        if fill is not None:  # a draft model: its proposals, at the positions scheduled
            fill(out, requests)
        return VerifyStep(out, runner, sampler, requests, eos_token_ids, self.counters, self.governor,
                          self.recorder, self.max_rows)

    def stats(self) -> dict:
        return self.counters.as_dict()


def build_spec_decoder(speculative: Optional[SpeculativeConfig], max_model_len: int,
                       draft_runner=None) -> Optional[SpecDecoder]:
    """None when speculation is off."""
    if speculative is None:
        return None
    return SpecDecoder(speculative, max_model_len, draft_runner)


def off_stats(k: int = 0) -> dict:
    """The stats keys of an engine that does not speculate."""
    return SpecStats(k).as_dict()
