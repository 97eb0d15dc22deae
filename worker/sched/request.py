"""`Request`: one sequence's state inside a replica. Plain Python.

Owns: the token lists, the KV block table, how many tokens have KV computed, the lifecycle
status (moved only through `transition`, checked against `REQUEST_TRANSITIONS`), and the
token-level stop rule (`stop_reason`, which the scheduler applies after each sampled token).
`output_token_ids` starts with any `resume_token_ids` (tokens a dead replica already delivered):
they count as generated but `num_emitted_tokens` skips them when building deltas.
Timing (`RequestMetrics`, wall clock): `arrival_time` at creation, `first_scheduled_time` on the
first move to RUNNING (set in `transition`, so the scheduler needs nothing extra); the engine
sets `first_token_time` and `finish_time`.
Speculative decoding adds `spec_token_ids` (proposals for the next step, never part of the
token lists) and `draft_state` (the proposer's, opaque).
"""

from __future__ import annotations

import itertools
import time
from typing import Optional

from infer_cluster.protocol import REQUEST_TRANSITIONS, FinishReason, RequestStatus, SamplingParams

# Values of `Request.block_epoch`, unique within the process: an id source, not state (only
# equality is ever tested), so every engine in the process may share it.
_BLOCK_EPOCHS = itertools.count(1)


class Request:
    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 arrival_seq: int, priority: int = 0, eos_token_ids: tuple[int, ...] = (),
                 resume_token_ids: Optional[list[int]] = None, prompt: Optional[str] = None):
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = list(prompt_token_ids)
        self.params = params
        self.priority = priority
        self.arrival_seq = arrival_seq
        self.eos_token_ids = eos_token_ids
        self.output_token_ids: list[int] = list(resume_token_ids or [])
        # prompt + output, kept as one list so per-step slicing never re-concatenates
        self.all_token_ids: list[int] = self.prompt_token_ids + self.output_token_ids
        self.num_emitted_tokens = len(self.output_token_ids)
        self.status = RequestStatus.WAITING
        self._block_ids: list[int] = []
        self.block_epoch = 0  # a new value whenever block_ids is replaced (worker/kv/block_table.py)
        self.block_hashes: list[int] = []
        self.num_computed_tokens = 0  # advanced when a step is scheduled (its KV is on the way)
        # Tokens sampled by scheduled steps whose ids are not on the host yet (async scheduling:
        # at most one). `num_tokens` counts only known tokens; the scheduler adds these.
        self.num_pending = 0
        self.num_registered_blocks = 0  # leading blocks already offered to the prefix cache
        self.num_cached_tokens = 0       # prompt tokens served by the device prefix cache
        self.num_cached_tokens_host = 0  # ... and by the host tier (copied back, not recomputed)
        self.host_block_ids: Optional[list[int]] = None  # set while swapped out to the host tier
        self.num_preemptions = 0
        # The engine's matcher of a structured-outputs request (worker/structured/state.py),
        # opaque here: the sampler's row carries it.
        self.grammar = None
        # Speculative decoding (worker/spec_decode/): tokens proposed to follow this request's
        # last one, set before each schedule (empty: none), and the proposer's own state
        # (opaque here). `schedule` computes the proposals as extra positions of the decode row;
        # `update_verified` keeps those the sampler agreed with.
        self.spec_token_ids: list[int] = []
        self.draft_state = None
        self.finish_reason: Optional[str] = None
        self.error: Optional[dict] = None
        self.arrival_time = time.time()
        self.first_scheduled_time: Optional[float] = None
        self.first_token_time: Optional[float] = None

    @property
    def block_ids(self) -> list[int]:
        """The request's KV blocks in order. Invariant (the step's block-table mirror relies on
        it): the list only grows in place (`extend`); any other change assigns a new list,
        which gives `block_epoch` a value no list of any request had before (so a request id
        used again after its first request ended never matches the old one's row)."""
        return self._block_ids

    @block_ids.setter
    def block_ids(self, blocks: list[int]) -> None:
        self._block_ids = blocks
        self.block_epoch = next(_BLOCK_EPOCHS)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    def append_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def stop_reason(self, token: int, max_model_len: int) -> Optional[str]:
        """The token-level stop rule after `token` was appended: "stop" (EOS unless ignored, or a
        stop token, once min_tokens are out), "length" (max_tokens or max_model_len), else None."""
        p = self.params
        num_out = len(self.output_token_ids)
        if num_out >= p.min_tokens:
            if (not p.ignore_eos and token in self.eos_token_ids) or token in p.stop_token_ids:
                return FinishReason.STOP.value
        if num_out >= p.max_tokens or len(self.all_token_ids) >= max_model_len:
            return FinishReason.LENGTH.value
        return None

    @property
    def sort_key(self) -> tuple[int, int]:
        """Lower comes first: priority, then arrival (FCFS)."""
        return (self.priority, self.arrival_seq)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def transition(self, new: RequestStatus) -> None:
        if new not in REQUEST_TRANSITIONS[self.status]:
            raise RuntimeError(f"request {self.request_id}: illegal transition {self.status.name} -> {new.name}")
        self.status = new
        if new is RequestStatus.RUNNING and self.first_scheduled_time is None:
            self.first_scheduled_time = time.time()

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, {self.status.name}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens}, blocks={self.block_ids})")
