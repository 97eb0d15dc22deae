"""`VerifyStep`: one step of a speculating engine, and the acceptance rule.

A decode row with k proposals d1..dk was scheduled as k + 1 positions (its last token, then the
proposals), so the runner returns logits at each of them. The sampler draws position j as the
row it would be if d1..dj were the request's tokens: its own penalties, logit_bias, min_tokens
and logprobs, temperature / top-k / top-p / min-p, and for a seeded request the random number
of step len(output) + j. The request keeps the draws x0..xa, where a is the number of leading
proposals that equal the draws (`num_accepted`): x0..x(a-1) are d1..da, and xa is the first
draw that differs, or a draw after the last proposal.

Why this is exact: every kept draw was drawn from the distribution of its position given the
tokens actually kept before it, which is what decoding one token a step does. For a greedy row
the draw is the argmax, so the output is the same token for token. For a random row it is the
coupled form of rejection sampling with a one-hot draft (Leviathan et al., Chen et al.): the
proposal d is kept with probability p(d), and on rejection the token is drawn from p with d
removed and renormalised, because that is the draw x's law given x != d. A seeded request
draws the very numbers it would draw without speculation, so it reproduces its own output.

Owns: building the expanded sampler rows (`expand_rows`; a step of plain greedy requests takes
each position's argmax instead, from the greedy CUDA graph where the runner has one), the host
half (the one sync of the step), the acceptance (`accept`), and counting proposals and
acceptances (`SpecStats`).
Proposals never change the output's law (for greedy and seeded requests, not even its tokens),
only how many tokens one forward yields.
Must never: touch the scheduler (the engine applies the tokens, `Scheduler.update_verified`).
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

import torch

from infer_cluster.protocol import SamplingParams

from infer_cluster.worker.config import ConfigError
from infer_cluster.worker.device.streams import StreamRecorder
from infer_cluster.worker.device.to_host import to_host
from infer_cluster.worker.device.wait import wait_event
from infer_cluster.worker.sampling.sampler import Sampler
from infer_cluster.worker.sampling.draw_io import SamplingRequestState
from infer_cluster.worker.sampling.row_plans import plan_flags
from infer_cluster.worker.sched.output import ScheduledRequest, SchedulerOutput

# A verify step of at most this many positions runs as a decode step of one row per position
# (`decode_shaped`); a larger one as the mixed step it is, unless its rows are plain greedy and
# the runner's greedy-only verify graphs reach it (`verify_greedy_rows`, graph_set.py). Each such row reads its context once a
# chunk of its request's rows (the runs, graph_set.py), so the cost grows slowly with positions:
# 48 covers batch 8 at 5 proposals a row; 64-128 measured no faster there on the H200
# (docs/spec_decode.md). `INFER_CLUSTER_VERIFY_MAX_ROWS` sets it (`verify_max_rows`, read when
# the engine is built: its verify graphs are captured up to it).
VERIFY_MAX_ROWS_ENV = "INFER_CLUSTER_VERIFY_MAX_ROWS"
DECODE_SHAPED_MAX_ROWS = 48


def verify_max_rows() -> int:
    """`INFER_CLUSTER_VERIFY_MAX_ROWS` (48 when unset), 2..512; a `ConfigError` names a bad value."""
    raw = os.environ.get(VERIFY_MAX_ROWS_ENV, "").strip()
    rows = int(raw) if raw.isdigit() else (DECODE_SHAPED_MAX_ROWS if not raw else -1)
    if not 2 <= rows <= 512:
        raise ConfigError(f"{VERIFY_MAX_ROWS_ENV}={raw!r} must be a whole number of positions, "
                          f"2..512 (a row and one proposal at least)")
    return rows


# The row of a request that ended after scheduling (its draw is dropped).
_DROPPED_ROW = SamplingRequestState(SamplingParams(temperature=0), [], [], None, ())


def num_accepted(proposals: Sequence[int], draws: Sequence[int]) -> int:
    """How many leading proposals equal the draws at their positions (draws has one more)."""
    a = 0
    for d, x in zip(proposals, draws):
        if d != x:
            break
        a += 1
    return a


class SpecStats:
    """Proposals and acceptances since the engine started, per position too."""

    def __init__(self, k: int):
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.num_chained_steps = 0  # verify steps whose rows the device made (chain.py)
        self.drafted = [0] * k   # proposals made at position j (the (j+1)-th of a row)
        self.accepted = [0] * k  # ... and accepted

    def record(self, num_drafts: int, num_accepted_drafts: int) -> None:
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted_drafts
        for j in range(num_drafts):
            self.drafted[j] += 1
        for j in range(num_accepted_drafts):
            self.accepted[j] += 1

    def as_dict(self) -> dict:
        return {"num_spec_draft_tokens": self.num_draft_tokens,
                "num_spec_accepted_tokens": self.num_accepted_tokens,
                "num_spec_chained_steps": self.num_chained_steps,
                "spec_acceptance_per_position": [a / d if d else 0.0
                                                 for a, d in zip(self.accepted, self.drafted)],
                "spec_draft_tokens_per_position": list(self.drafted),
                "spec_accepted_tokens_per_position": list(self.accepted)}


class VerifyStep:
    """A step launched by a speculating engine: forward and draw are queued at construction;
    `wait` brings the draws to the host and returns each sampled request's new tokens. The
    engine keeps it with its other launched steps (`wait`, `abandon`, `out`). With async
    scheduling it stays in flight until the next `step()`, so the text of the step before it
    and the caller's work overlap its forward; that step() collects it before proposing or
    scheduling anything (`InFlightSteps.holds_verify`)."""

    is_verify = True

    def __init__(self, out: SchedulerOutput, runner, sampler: Sampler, requests: dict,
                 eos_token_ids, stats: SpecStats, governor=None, recorder: Optional[StreamRecorder] = None,
                 max_rows: int = DECODE_SHAPED_MAX_ROWS):
        """`governor`: told how many tokens the step gave its rows (worker/spec_decode/governor.py).
        `recorder`: records the step's event (its owner's; None: a recorder of the step's own).
        `max_rows`: the most positions run as a decode step (`decode_shaped`): the runner's
        verify graphs reach that far (`verify_max_rows`), and a step of plain greedy rows as
        far as their greedy-only sizes (`runner.verify_greedy_rows`, graph_set.py)."""
        self.out = out
        self._stats = stats
        self._governor = governor
        self.max_rows = max_rows
        self.chain_ids: Optional[torch.Tensor] = None  # argmax ids a chained step may follow
        # a rank group's checks, as for an ordinary step (worker/engine/inflight.py)
        self._verify, self._gave_up = runner.verify_step, runner.wait_gave_up
        proposals = {s.request_id: s.token_ids[len(s.token_ids) - s.num_spec_tokens:]
                     for s in out.requests if s.num_spec_tokens}
        chainable = _chainable(out, requests, eos_token_ids)  # plain greedy, the common case
        greedy = chainable or _plain_greedy(out, requests, sampler, runner.vocab_size, eos_token_ids)
        ids_only = greedy and runner.takes_greedy_ids
        # ids only: the verify graphs' greedy-only sizes take more positions as decode rows
        limit = max(max_rows, getattr(runner, "verify_greedy_rows", 0)) if ids_only else max_rows
        result, row_ids = runner.execute(decode_shaped(out, limit) or out, greedy_ids=ids_only)
        if greedy:  # every position an argmax of the raw logits: no sampler rows to build
            self._groups = groups(row_ids, proposals)
            ids = result if ids_only else result.argmax(dim=-1)
            self.draw = sampler.draw_greedy_ids(ids, [_DROPPED_ROW] * len(row_ids))
            if chainable:
                self.chain_ids = ids
        else:
            rows, self._groups = expand_rows(row_ids, proposals, requests, eos_token_ids)
            # The runner's logits are this step's own tensor: the sampler may edit them in place.
            self.draw = sampler.draw(result, rows, logits_writable=True)
        self._send(recorder)

    def _send(self, recorder: Optional[StreamRecorder]) -> None:
        """Start `draw`'s copies to the host, behind the step's kernels (`wait` reads them after
        the event)."""
        self._transfer = to_host(self.draw.transfer)
        self._values = to_host(self.draw.values) if self.draw.values is not None else None
        self._event: Optional[torch.cuda.Event] = None
        if self.draw.transfer.device.type == "cuda":  # what `wait` and `abandon` wait for
            self._event = (recorder or StreamRecorder()).recorded(self.draw.transfer.device)

    def wait(self, sampler: Sampler) -> tuple[dict[str, list[int]], dict[str, list], list[str]]:
        """{request id: its new tokens}, {request id: their logprob entries (deferred) or
        None}, and no redrawn ids (the sampler's redo has run before anything used them)."""
        draw = self.draw
        if self._event is not None:  # gives up early only once a rank group failed: verify raises
            wait_event(self._event, self._gave_up)
        self._verify()  # a rank group: did it stay healthy through the step?
        values = self._values.flatten().tolist() if self._values is not None else None
        result = sampler.finish(draw, self._transfer.tolist(), values, defer_logprobs=True)
        tokens, logprobs = accept(self._groups, result.token_ids, result.logprobs, self._stats)
        if self._governor is not None and tokens:
            self._governor.verified(sum(map(len, tokens.values())) / len(tokens))
        return tokens, logprobs, []

    def abandon(self) -> None:
        """A failure: let the device finish the step before its blocks are freed (a failed rank
        group's device may never finish: then the wait ends at once, as for an ordinary step)."""
        try:
            if self._event is not None:
                wait_event(self._event, self._gave_up)
        except Exception:  # the device fault is reported by the step that raised
            pass


def decode_shaped(out: SchedulerOutput, max_rows: int = DECODE_SHAPED_MAX_ROWS) -> Optional[SchedulerOutput]:
    """The verify step `out` as a decode step: each position of a row becomes a row of its own
    (one token, the row's blocks, the context up to and including that position), or None
    where `out` holds a prompt chunk or more than `max_rows` positions.

    Why: a decode step runs the decode attention kernel, the small-batch GEMV and the decode
    CUDA graphs, where a verify step's k + 1 positions a row would run the mixed-step path
    (prefill attention over the whole context, cuBLAS): on the H200 a verify step of 5
    positions took 1.65 ms there against ~0.7 ms for a decode step. It is exact: every layer
    appends the step's K/V for all rows before its attention reads them, so the row of position
    p sees positions <= p, which is causal attention over the row's positions. The rows of a
    request stay consecutive and in order, so `expand_rows` reads their logits as before."""
    if out.num_batched_tokens > max_rows:
        return None
    rows = []
    for s in out.requests:
        n = len(s.token_ids)
        if n != s.num_spec_tokens + 1 or not s.needs_sample:  # a prompt chunk
            return None
        if n == 1:
            rows.append(s)
            continue
        rows.extend(ScheduledRequest(s.request_id, [t], s.start_position + j, s.block_ids, True,
                                     pending_input=s.pending_input and j == 0,
                                     block_epoch=s.block_epoch)
                    for j, t in enumerate(s.token_ids))
    if len(rows) == len(out.requests) or len(rows) > max_rows:
        return None  # no proposals (already a decode step), or too many positions
    return SchedulerOutput(rows, len(rows))


def _plain_greedy(out: SchedulerOutput, requests: dict, sampler: Sampler, vocab_size: int,
                  eos_token_ids) -> bool:
    """Whether every request of the step is plain greedy (`RowClasses.plain_greedy`: no
    penalties, logprobs, bias, grammar or min_tokens to keep; then none of its positions has
    any, since min_tokens only ends as a row grows), judged on one row per request. Params
    with no feature bit at all (`plan_flags` 0: the usual greedy request) need no classifying."""
    live = []
    for s in out.requests:
        req = requests.get(s.request_id)
        if req is None:
            return False  # ended after scheduling: the general path drops its rows
        live.append((s, req))
    has_eos = bool(eos_token_ids)
    if live and not any(plan_flags(req.params, has_eos) for _, req in live):
        return True
    rows = [SamplingRequestState(req.params, req.prompt_token_ids, req.output_token_ids, None,
                                 eos_token_ids, s.request_id, req.num_pending - 1, req.grammar)
            for s, req in live]
    return bool(rows) and sampler.classify(rows, vocab_size).plain_greedy


def _chainable(out: SchedulerOutput, requests: dict, eos_token_ids) -> bool:
    """Whether a chained step (worker/spec_decode/chain.py) may follow this one: every request
    live, a decode row (its last token and its proposals), with params of no feature bit at all
    (`plan_flags` 0: no grammar, penalties, logprobs, ...), so each of its positions is the raw
    argmax now and in every later step; such a step is plain greedy too (`_plain_greedy`)."""
    has_eos = bool(eos_token_ids)
    for s in out.requests:
        req = requests.get(s.request_id)
        if (req is None or not s.needs_sample or len(s.token_ids) != s.num_spec_tokens + 1
                or plan_flags(req.params, has_eos)):
            return False
    return bool(out.requests)


def groups(row_ids: list[str], proposals: dict) -> list:
    """(request id, first row, proposals) of each request of a step whose rows `row_ids`
    carry one row per position (what `expand_rows` returns beside the rows)."""
    out, i, n = [], 0, len(row_ids)
    while i < n:
        drafts = proposals.get(row_ids[i], ())
        out.append((row_ids[i], i, drafts))
        i += len(drafts) + 1
    return out


def expand_rows(row_ids: list[str], proposals: dict, requests: dict, eos_token_ids):
    """The sampler rows of a step whose requests may have several rows (`row_ids`, one per
    position, from the runner), and (request id, first row, proposals) of each sampled request.
    `proposals`: request id -> its proposals (absent: none); `requests`: live requests by id."""
    rows, groups = [], []
    i, n = 0, len(row_ids)
    while i < n:
        rid = row_ids[i]
        drafts = proposals.get(rid, ())
        groups.append((rid, i, drafts))
        req = requests.get(rid)
        if req is None:  # ended after scheduling
            rows.extend([_DROPPED_ROW] * (len(drafts) + 1))
        else:
            params, prompt, output = req.params, req.prompt_token_ids, req.output_token_ids
            # num_pending counts this step's own token (nothing else is pending: synchronous)
            rows.append(SamplingRequestState(params, prompt, output, None, eos_token_ids, rid,
                                             req.num_pending - 1, req.grammar))
            for j in range(1, len(drafts) + 1):  # as if d1..dj were its tokens; no state key;
                # a grammar's state shared, walked through the proposals as the rows are filled
                rows.append(SamplingRequestState(params, prompt, output + list(drafts[:j]), None,
                                                 eos_token_ids, grammar=req.grammar))
        i += len(drafts) + 1
    return rows, groups


def accept(groups: list, token_ids: list[int], logprobs: list, stats: Optional[SpecStats] = None
           ) -> tuple[dict[str, list[int]], dict[str, Optional[list]]]:
    """Each request's kept draws (`num_accepted` proposals, then one) and their logprob
    entries, from the draws of the rows `expand_rows` made."""
    tokens, entries = {}, {}
    for rid, first, drafts in groups:
        draws = token_ids[first:first + len(drafts) + 1]
        a = num_accepted(drafts, draws) if drafts else 0
        tokens[rid] = [*drafts[:a], draws[a]]  # the accepted proposals, then the draw after them
        entries[rid] = logprobs[first:first + a + 1] if logprobs[first] is not None else None
        if drafts and stats is not None:
            stats.record(len(drafts), a)
    return tokens, entries
