"""`GrammarState`: one request's xgrammar matcher, kept in step with the request's tokens.

Owns: the matcher and how many of the request's output tokens it has accepted. `sync(tokens)`
accepts the tokens it has not seen yet (resume tokens of a failed-over request included). When
the list no longer extends what it accepted, it rolls the matcher back to where they part if
that is within the last `HISTORY` tokens (a verify step leaves the state after all of a row's
proposals, of which only some are kept: worker/spec_decode/), else rebuilds it from the whole
list (reset, then accept each). `accept_all` syncs many states, the common one-token case in
one xgrammar call. `grammar_prefix` cuts proposals to what the grammar allows. A token the
grammar refuses leaves the state `broken` (the engine ends the request): the mask makes that
impossible unless the tokens came from elsewhere.
Host only: never touches tensors but the bitmask row it fills.
"""

from __future__ import annotations

from collections import deque
from typing import Optional, Sequence

# Accepted tokens remembered for a rollback: more than any verify step proposes (k <= 64).
HISTORY = 64


class GrammarState:
    __slots__ = ("matcher", "vocab_size", "num_accepted", "broken", "stop_ids", "recent")

    def __init__(self, compiled):
        import xgrammar as xgr
        self.matcher = xgr.GrammarMatcher(compiled)
        self.vocab_size = compiled.tokenizer_info.vocab_size  # the bitmask's width in tokens
        self.num_accepted = 0
        self.broken = False
        # a matcher terminates only by accepting one of these (xgrammar's stop tokens)
        self.stop_ids = frozenset(self.matcher.stop_token_ids)
        self.recent: deque = deque(maxlen=HISTORY)  # the last accepted tokens, for `_roll_back`

    @property
    def last_token(self) -> Optional[int]:
        """The last token accepted (None before the first): `recent` holds it whenever any
        was accepted, since a rollback keeps at least one remembered token or goes to 0."""
        return self.recent[-1] if self.recent else None

    @property
    def is_terminated(self) -> bool:
        """The grammar is complete and its stop token was accepted: nothing more may follow.
        No xgrammar call unless the last token accepted is a stop token (the only way a
        matcher terminates)."""
        return self.last_token in self.stop_ids and self.matcher.is_terminated()

    def sync(self, tokens: list[int]) -> bool:
        """Accept `tokens[num_accepted:]`; roll back or rebuild first if `tokens` does not
        extend what was accepted. False (and `broken`) when the grammar refuses a token."""
        n = self.num_accepted
        if n > len(tokens) or (n and tokens[n - 1] != self.last_token):
            if not self._roll_back(tokens):
                self.matcher.reset()
                self.recent.clear()
                self.num_accepted = 0
            n = self.num_accepted
            self.broken = False
        if self.broken:
            return False
        if n == len(tokens):
            return True
        accept = self.matcher.accept_token  # refuses every token once terminated
        for t in tokens[n:]:
            if not accept(int(t)):
                self.broken = True
                return False
            self._accepted(t)
        return True

    def _accepted(self, token: int) -> None:
        self.num_accepted += 1
        self.recent.append(token)

    def _roll_back(self, tokens: list[int]) -> bool:
        """Roll the matcher back to the longest prefix of `tokens` it accepted, where the two
        part within `recent`; False where that cannot be told (the caller rebuilds)."""
        n, recent = self.num_accepted, self.recent
        start = n - len(recent)  # the position of recent[0] in the accepted list
        keep = start
        for t, mine in zip(tokens[start:n], recent):
            if t != mine:
                break
            keep += 1
        if keep == start and start > 0:
            return False  # they may part before the window
        drop = n - keep
        self.matcher.rollback(drop)
        for _ in range(drop):
            recent.pop()
        self.num_accepted = keep
        return True

    def next_token(self, tokens: list[int], size: int) -> Optional[int]:
        """The one token that `tokens[:size]` adds to what was accepted, where it adds exactly
        one (the common case, which `accept_all` batches); None otherwise (`sync` it)."""
        n = self.num_accepted
        if self.broken or size != n + 1 or (n and tokens[n - 1] != self.last_token):
            return None
        return int(tokens[n])

    def took(self, token: int, accepted: bool) -> None:
        """Record what the matcher did with `next_token`'s token."""
        if accepted:
            self._accepted(token)
        else:
            self.broken = True

    def fill(self, bitmask, row: int) -> None:
        """The allowed next tokens into `bitmask[row]` (xgrammar's packed int32 layout)."""
        self.matcher.fill_next_token_bitmask(bitmask, row)


def accept_all(items: list[tuple["GrammarState", list[int], int]]) -> None:
    """Sync each state with the first `size` of its tokens. The states one token behind (every
    decoding row after a step) take theirs in one xgrammar call, which releases the GIL, so a
    helper thread can run it beside the engine's own Python (worker/structured/bitmask.py);
    the others (a resume, a rebuild) take `sync`."""
    import xgrammar as xgr
    batch, tokens_in = [], []
    for g, tokens, size in items:
        t = g.next_token(tokens, size)
        if t is None:
            g.sync(tokens[:size])
        else:
            batch.append(g)
            tokens_in.append(t)
    if batch:
        accepted = xgr.BatchGrammarMatcher.batch_accept_token([g.matcher for g in batch], tokens_in)
        for g, t, ok in zip(batch, tokens_in, accepted):
            g.took(t, ok)


def grammar_prefix(state: GrammarState, tokens: list[int], proposals: Sequence[int]) -> list[int]:
    """The longest prefix of `proposals` that the grammar accepts after `tokens` (the request's
    output, all on the host), without a stop token: a verify step fills a mask at every
    proposed position, and none can follow a stop token. The state is left where `tokens` put
    it. Empty when the state cannot take `tokens`."""
    if not proposals or not state.sync(tokens):
        return []
    matcher, kept = state.matcher, 0
    for t in proposals:
        if t in state.stop_ids or not matcher.accept_token(int(t)):
            break
        kept += 1
    if kept:
        matcher.rollback(kept)
    return list(proposals[:kept])
