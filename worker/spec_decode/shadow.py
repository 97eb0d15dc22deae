"""`ShadowAcceptance`: what verify steps would accept, measured while the engine decodes plainly.

Why: the governor (governor.py) decides from the tokens its last verify steps gave a row, so a
bucket that found speculation not paying kept deciding from that figure until an exploration
came, hundreds of decisions later. But acceptance moves with the text: a chat answer opens with
words of its own and then copies the passage. On the H200 (SmolLM2, 41ff583, 7c28403) batch
8 measured 1.0-1.1 tokens a row over its few verify steps at the start of the answers and then
decoded plainly through the copying that followed (speculation 0.86-1.12x of off there, where
forced verify steps accepted 54-71% per position at batch 4).

How: in a plain step the proposer still proposes for a few rows (`ROWS_PER_STEP`, round robin)
from the tokens on the host, and the proposal is kept. Once the request's tokens reach past it,
the leading proposals equal to the tokens decoded are what a verify step would have accepted:
exactly for a greedy row (a verify step keeps a proposal when it is the argmax, and the plain
step decoded that argmax), and with the same probability for a sampled one (a verify step keeps
d with probability p(d), the chance that the plain draw was d). Each resolved proposal gives
`accepted + 1` tokens, the figure a verify step reports for the row; a row with nothing to
propose gives 1 where the batch has other rows (a verify step would still carry it), and
nothing at batch 1 (that step runs as an ordinary one).
Owns: the proposals kept and their resolution. Plain Python; the proposer's `shadow(req, batch)` makes
the proposal (prompt lookup only: a draft model would need a forward), and only rows the governor
asks for are proposed for (never where verify steps could not pay even at full acceptance).
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Optional, Sequence

from infer_cluster.worker.spec_decode.verify import num_accepted

ROWS_PER_STEP = 4    # rows proposed for in one plain step (each ~3-10 us of host time)
MAX_KEPT = 64        # proposals waiting for their tokens, at most


class ShadowAcceptance:
    def __init__(self, propose: Callable[[object, int], list]):
        """`propose(req, batch)`: proposals from the request's tokens on the host ([] for
        none), as a verify step of `batch` rows would make them."""
        self._propose = propose
        self._kept: deque = deque()  # (request, position of the first proposal, proposals)
        self._next_row = 0
        self.num_resolved = 0  # proposals compared with the tokens decoded (for stats and tests)

    def step(self, running: Sequence) -> Optional[float]:
        """Resolve the proposals whose tokens arrived, then propose for the next few rows.
        Returns the mean tokens a row of the resolved ones (None: none resolved)."""
        total = count = 0
        alone = len(running) == 1
        waiting: deque = deque()
        for req, pos, drafts in self._kept:
            if req.num_tokens < pos + len(drafts):
                if not req.is_finished:
                    waiting.append((req, pos, drafts))
                continue  # ended first: never counted
            if drafts:
                total += num_accepted(drafts, req.all_token_ids[pos:pos + len(drafts)]) + 1
                count += 1
            elif not alone:
                total += 1
                count += 1
        n = len(running)
        if n:
            start = self._next_row % n
            for j in range(min(ROWS_PER_STEP, n)):
                req = running[(start + j) % n]
                waiting.append((req, req.num_tokens, self._propose(req, n)))
            self._next_row = start + ROWS_PER_STEP
        while len(waiting) > MAX_KEPT:  # a stalled request's proposals: the oldest go uncounted
            waiting.popleft()
        self._kept = waiting
        self.num_resolved += count
        return total / count if count else None
