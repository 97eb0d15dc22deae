"""Prompt lookup: proposals copied from earlier in a request's own tokens (n-gram matching).

Owns: `NgramIndex`, one request's map from each n-gram (n in [prompt_lookup_min,
prompt_lookup_max]) to the end of its most recent occurrence, grown as the request's tokens
grow; `NgramIndex.propose`, which takes the longest suffix n-gram of prompt + output (longest
first) that occurred before and proposes the tokens that followed its most recent occurrence;
and `NgramProposer`, which sets `Request.spec_token_ids` on the decoding rows of a step.
Plain Python: a dict lookup per n a step, and a few dict writes per new token (the prompt is
indexed once, at a request's first proposal). Measured on the 2-core dev CPU with n in 2..4:
about 2.4 us and 330 bytes a token to index (a 4,000-token prompt: 10 ms once, 1.3 MB while
the request lives), then about 2 us a step a request.
Proposals are only guesses: a wrong one costs a verified position, never a wrong token, so
nothing here has to be exact about which occurrence it copies.
Must never: change a request's tokens, or propose past max_tokens or max_model_len.
"""

from __future__ import annotations

from typing import Optional, Sequence

_NONE: list[int] = []  # the shared "no proposals" value (never mutated)


class NgramIndex:
    """Where each n-gram of one token list last ended (positions < len(tokens) - 1 only: an
    occurrence must be followed by a token to be worth copying)."""

    __slots__ = ("min_n", "max_n", "_ends", "_num_indexed")

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n
        self._ends: list[dict] = [{} for _ in range(max_n - min_n + 1)]  # [n - min_n][ngram] -> end
        self._num_indexed = 0  # n-grams ending before this position are in `_ends`

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """Up to `k` tokens that followed the most recent earlier occurrence of the longest
        suffix n-gram of `tokens` (n from max_n down to min_n); [] when none occurred."""
        size = len(tokens)
        if size < self._num_indexed:  # the list is not the one indexed (never happens in order)
            self.__init__(self.min_n, self.max_n)
        self._index(tokens, size - 1)
        for n in range(min(self.max_n, size - 1), self.min_n - 1, -1):
            end = self._ends[n - self.min_n].get(tuple(tokens[size - n:]))
            if end is not None:
                return list(tokens[end + 1:end + 1 + k])
        return _NONE

    def _index(self, tokens: Sequence[int], stop: int) -> None:
        """Record the n-grams ending at positions [num_indexed, stop)."""
        min_n, ends = self.min_n, self._ends
        for end in range(self._num_indexed, stop):
            for j, table in enumerate(ends):
                start = end - (min_n + j) + 1
                if start < 0:
                    break
                table[tuple(tokens[start:end + 1])] = end
        self._num_indexed = max(self._num_indexed, stop)


class NgramProposer:
    """Sets `spec_token_ids` on each running request before the step is scheduled: proposals
    on rows that decode (every token but the last computed, nothing pending, no grammar), none
    elsewhere."""

    def __init__(self, num_speculative_tokens: int, min_n: int, max_n: int, max_model_len: int):
        self.k = num_speculative_tokens
        self.min_n, self.max_n = min_n, max_n
        self.max_model_len = max_model_len

    def propose(self, running: Sequence) -> None:
        for req in running:
            room = self.room(req)
            if room <= 0:
                if req.spec_token_ids:
                    req.spec_token_ids = _NONE
                continue
            index: Optional[NgramIndex] = req.draft_state
            if index is None:
                index = req.draft_state = NgramIndex(self.min_n, self.max_n)
            req.spec_token_ids = index.propose(req.all_token_ids, room)

    def room(self, req) -> int:
        return proposal_room(req, self.k, self.max_model_len)


def proposal_room(req, k: int, max_model_len: int) -> int:
    """How many proposals the request can use: 0 unless it decodes (every token but the last
    computed, nothing pending, no grammar); at most k, and never so many that the verified
    tokens could pass max_tokens or max_model_len. Every proposer uses this rule."""
    num_tokens = req.num_tokens
    if req.num_computed_tokens != num_tokens - 1 or req.num_pending or req.grammar is not None:
        return 0
    return min(k, req.params.max_tokens - len(req.output_token_ids) - 1,
               max_model_len - num_tokens - 1)
