"""What one scheduling step hands the model runner: `SchedulerOutput` and its `ScheduledRequest`s.
Plain data, no policy.

Owns: the step's requests (tokens, start position, block ids, whether the last row is sampled,
whether its input is the previous step's pending draw, how many of its tokens are speculative
proposals), its token count, preemptions, the
host-tier copies (`swap_out`, `swap_in`, grouped into `loads`) and the `blocked` flag. The
`Scheduler` (worker/sched/scheduler.py) builds it; `DynamicContext.prepare`, the model runners, the
step codec and the engine read it, without importing the scheduler.
To extend: add a field with a default, then teach `prepare` and `step_codec` to carry it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)  # one per request per step: slots make it cheaper to build and read
class ScheduledRequest:
    """One request's share of a step: compute KV for `token_ids` at positions from
    `start_position`; if `needs_sample`, the last row's logits pick the next token."""

    request_id: str
    token_ids: list[int]
    start_position: int
    block_ids: list[int]
    needs_sample: bool
    # The last input token is the pending draw of the previous step (its id here is a
    # placeholder; the runner copies the real one on the device).
    pending_input: bool = False
    # `Request.block_epoch`: changes whenever block_ids stopped being an extension of the
    # request's previous list (worker/kv/block_table.py). Bookkeeping, not the step's content:
    # left out of equality.
    block_epoch: int = field(default=0, compare=False)
    # Speculative decoding: the last `num_spec_tokens` of `token_ids` are proposals, not the
    # request's tokens; a sampled row then has logits at each of its last num_spec_tokens + 1
    # positions (worker/spec_decode/verify.py).
    num_spec_tokens: int = 0


@dataclass
class SchedulerOutput:
    requests: list[ScheduledRequest] = field(default_factory=list)
    num_batched_tokens: int = 0
    preempted_ids: list[str] = field(default_factory=list)
    # KV copies to run before the forward, all swap-outs first: (device block, host block) and
    # (host block, device block).
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    swap_in: list[tuple[int, int]] = field(default_factory=list)
    # Set by schedule(can_preempt=False): a running request needed blocks only preemption
    # could give; it and the requests after it were left out of this step.
    blocked: bool = False
    # `swap_in` in groups, one per load: (load id, number of consecutive `swap_in` pairs). The
    # runner records each load's completion; `Scheduler(loads_landed=...)` asks about it.
    loads: list[tuple[int, int]] = field(default_factory=list)

    @property
    def has_swaps(self) -> bool:
        return bool(self.swap_out or self.swap_in)

    @property
    def is_empty(self) -> bool:
        return not self.requests

    def sampled_request_ids(self) -> list[str]:
        """Request id of each sampled row, in step order (the rows of the step's logits): a row
        with k speculative proposals has k + 1 (worker/runner/step_rows.py)."""
        return [r.request_id for r in self.requests if r.needs_sample
                for _ in range(r.num_spec_tokens + 1)]
