"""`GrammarState`: one request's xgrammar matcher, kept in step with the request's tokens.

Owns: the matcher and how many of the request's output tokens it has accepted. `sync(tokens)`
accepts the tokens it has not seen yet (resume tokens of a failed-over request included) and
rebuilds the matcher from the whole list (reset, then accept each) when the list no longer
extends what it accepted; `accept_all` syncs many states, the common one-token case in one
xgrammar call. A token the grammar refuses leaves the state `broken` (the engine ends the
request): the mask makes that impossible unless the tokens came from elsewhere.
Host only: never touches tensors but the bitmask row it fills.
"""

from __future__ import annotations

from typing import Optional


class GrammarState:
    __slots__ = ("matcher", "vocab_size", "num_accepted", "last_token", "broken", "stop_ids")

    def __init__(self, compiled):
        import xgrammar as xgr
        self.matcher = xgr.GrammarMatcher(compiled)
        self.vocab_size = compiled.tokenizer_info.vocab_size  # the bitmask's width in tokens
        self.num_accepted = 0
        self.last_token: Optional[int] = None
        self.broken = False
        # a matcher terminates only by accepting one of these (xgrammar's stop tokens)
        self.stop_ids = frozenset(self.matcher.stop_token_ids)

    @property
    def is_terminated(self) -> bool:
        """The grammar is complete and its stop token was accepted: nothing more may follow.
        No xgrammar call unless the last token accepted is a stop token (the only way a
        matcher terminates)."""
        return self.last_token in self.stop_ids and self.matcher.is_terminated()

    def sync(self, tokens: list[int]) -> bool:
        """Accept `tokens[num_accepted:]`; rebuild first if `tokens` does not extend what was
        accepted. False (and `broken`) when the grammar refuses a token."""
        n = self.num_accepted
        if n > len(tokens) or (n and tokens[n - 1] != self.last_token):
            self.matcher.reset()
            self.num_accepted = n = 0
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
            self.num_accepted += 1
            self.last_token = t
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
            self.num_accepted += 1
            self.last_token = token
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
