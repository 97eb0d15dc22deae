"""`GrammarState`: one request's xgrammar matcher, kept in step with the request's tokens.

Owns: the matcher and how many of the request's output tokens it has accepted. `sync(tokens)`
accepts the tokens it has not seen yet (resume tokens of a failed-over request included) and
rebuilds the matcher from the whole list (reset, then accept each) when the list no longer
extends what it accepted. A token the grammar refuses leaves the state `broken` (the engine ends
the request): the mask makes that impossible unless the tokens came from elsewhere.
Host only: never touches tensors but the bitmask row it fills.
"""

from __future__ import annotations

from typing import Optional


class GrammarState:
    __slots__ = ("matcher", "vocab_size", "num_accepted", "last_token", "broken", "_stop_ids")

    def __init__(self, compiled):
        import xgrammar as xgr
        self.matcher = xgr.GrammarMatcher(compiled)
        self.vocab_size = compiled.tokenizer_info.vocab_size  # the bitmask's width in tokens
        self.num_accepted = 0
        self.last_token: Optional[int] = None
        self.broken = False
        # a matcher terminates only by accepting one of these (xgrammar's stop tokens)
        self._stop_ids = frozenset(self.matcher.stop_token_ids)

    @property
    def is_terminated(self) -> bool:
        """The grammar is complete and its stop token was accepted: nothing more may follow.
        Asked only where the last token accepted is a stop token: the engine asks every
        constrained row every step, and each call into xgrammar costs host time."""
        return self.last_token in self._stop_ids and self.matcher.is_terminated()

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

    def fill(self, bitmask, row: int) -> None:
        """The allowed next tokens into `bitmask[row]` (xgrammar's packed int32 layout)."""
        self.matcher.fill_next_token_bitmask(bitmask, row)
