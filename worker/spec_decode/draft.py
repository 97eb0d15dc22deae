"""`DraftProposer`: proposals from a small draft model, decoded greedily on its own KV pool.

Owns: which rows get draft proposals (the rule every proposer uses, `ngram.proposal_room`), how
many tokens of each request the draft's KV holds (`Request.draft_state`), and the draft's
forwards: after the schedule, for each decode row the step gave n proposal positions, one chunk
of the tokens the draft has not computed yet (the prompt at first, later the last accepted
burst), then n - 1 one-token steps, every row of the step batched in each; each position's
argmax is the next proposal.

How it fits the step: before the schedule `propose` sets `spec_token_ids` to k placeholder ids
on each decode row (the scheduler only needs their count); the schedule gives each row n <= k
proposal positions and the blocks for them; `fill` (called by `SpecDecoder.launch`, before the
target's forward) runs the draft and writes the real proposals into the scheduled rows. The
draft therefore writes KV only at positions the target also computes this step or computed
before, in the row's own blocks.

The draft's pool has the target's block size and block ids (the engine sizes one allocator for
both pools), so preemption, freeing and the prefix cache need nothing here, with one rule: the
draft trusts its KV for a request only while the request was not preempted since
(`Request.num_preemptions`) and the pool was not replaced (`invalidate`, after a KV resize).
Otherwise, and for a new or resumed request (prefix-cache hits included: a cached block may
have target KV only), it recomputes from position 0. What it holds is set to the request's
length before the step (`num_tokens`), never past it: proposals that are rejected leave stale
KV at later positions, overwritten when those positions are computed again.

Why verification stays exact: the draft proposes its argmax, so its proposal distribution is
one-hot, and verify.py's rule is rejection sampling with a one-hot draft (greedy: identical
output). The runner is handed in by the engine (a `ModelRunner` over the draft model, built in
worker/engine/draft.py); this file only calls its `execute`.
Must never: change a request's tokens, or write KV outside a row's scheduled blocks.
"""

from __future__ import annotations

from typing import Sequence

from infer_cluster.worker.sched.output import ScheduledRequest, SchedulerOutput
from infer_cluster.worker.spec_decode.ngram import proposal_room, row_limit
from infer_cluster.worker.spec_decode.verify import DECODE_SHAPED_MAX_ROWS

_NONE: list[int] = []


class DraftProposer:
    def __init__(self, num_speculative_tokens: int, max_model_len: int, runner,
                 max_rows: int = DECODE_SHAPED_MAX_ROWS):
        self.k = num_speculative_tokens
        self.max_rows = max_rows  # the most positions of a decode-shaped verify step (`row_limit`)
        self.max_model_len = max_model_len
        self.runner = runner  # the draft model's runner: `execute(SchedulerOutput)` -> logits
        self.generation = 0   # bumped when the draft's pool is replaced: all its KV is void

    def invalidate(self) -> None:
        """The draft's KV pool was replaced: every request recomputes its draft KV."""
        self.generation += 1

    def propose(self, running: Sequence) -> None:
        """Placeholders: as many proposals as each decode row can use (their values come in
        `fill`, once the schedule has given the row its positions and blocks)."""
        k = row_limit(self.k, len(running), self.max_rows)
        for req in running:
            room = proposal_room(req, k, self.max_model_len)
            if room <= 0:
                if req.spec_token_ids:
                    req.spec_token_ids = _NONE
                continue
            req.spec_token_ids = [req.all_token_ids[-1]] * room

    def computed(self, req) -> int:
        """How many leading tokens of `req` the draft's KV holds."""
        state = req.draft_state
        if state is None or state[0] != req.num_preemptions or state[1] != self.generation:
            return 0
        return state[2]

    def fill(self, out: SchedulerOutput, requests: dict) -> None:
        """Run the draft over the step's rows with proposal positions and put its argmax
        tokens there (in `out`'s rows and the requests' `spec_token_ids`)."""
        rows = []  # (scheduled row, request, number of its tokens)
        chunk = SchedulerOutput()
        for s in out.requests:
            req = requests.get(s.request_id) if s.num_spec_tokens else None
            if req is None:  # no proposals, or ended after scheduling (its draws are dropped)
                continue
            num_tokens = s.start_position + 1
            if num_tokens != req.num_tokens:
                raise RuntimeError(f"request {s.request_id}: a proposal row at position "
                                   f"{s.start_position} but {req.num_tokens} tokens")
            done = min(self.computed(req), num_tokens - 1)
            chunk.requests.append(ScheduledRequest(
                s.request_id, req.all_token_ids[done:num_tokens], done, s.block_ids, True,
                block_epoch=s.block_epoch))
            rows.append((s, req, num_tokens))
        if not rows:
            return
        drafts = [[t] for t in self._argmax(chunk)]
        for j in range(1, max(s.num_spec_tokens for s, _, _ in rows)):
            live = [i for i, (s, _, _) in enumerate(rows) if s.num_spec_tokens > j]
            step = SchedulerOutput([ScheduledRequest(
                rows[i][0].request_id, [drafts[i][-1]], rows[i][2] - 1 + j, rows[i][0].block_ids,
                True, block_epoch=rows[i][0].block_epoch) for i in live])
            for i, t in zip(live, self._argmax(step)):
                drafts[i].append(t)
        for (s, req, num_tokens), tokens in zip(rows, drafts):
            s.token_ids[1:] = tokens
            req.spec_token_ids = tokens
            req.draft_state = (req.num_preemptions, self.generation, num_tokens)

    def _argmax(self, step: SchedulerOutput) -> list[int]:
        if self.runner.takes_greedy_ids:  # the argmax inside the replayed graph where it has one
            ids, _ = self.runner.execute(step, greedy_ids=True)
            return ids.tolist()
        logits, _ = self.runner.execute(step)
        return logits.argmax(dim=-1).tolist()
