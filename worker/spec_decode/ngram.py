"""Prompt lookup: proposals copied from earlier in a request's own tokens (n-gram matching).

Owns: `NgramIndex`, one request's map from each n-gram (n in [prompt_lookup_min,
prompt_lookup_max]) to the end of its most recent occurrence, grown as the request's tokens
grow; `NgramIndex.propose`, which takes the longest suffix n-gram of prompt + output (longest
first) that occurred before and proposes the tokens that followed its most recent occurrence;
and `NgramProposer`, which sets `Request.spec_token_ids` on the decoding rows of a step.
Plain Python plus numpy: a dict lookup per n a step and a few dict writes per new token, but a
long stretch of new tokens (the prompt, at a request's first proposal, or the output of the steps
that did not speculate) is indexed by numpy in one pass. Why: the governor turns speculation off
at large batches and explores it now and then, and each exploration indexed every running
request's prompt and output in Python, ~2.4 us a token: on the H200 (7c28403, workload A, 256
requests) the untimed host work of the speculating engine grew by 0.34 s of a 6.5 s run.
Proposals are only guesses: a wrong one costs a verified position, never a wrong token, so
nothing here has to be exact about which occurrence it copies.
Must never: change a request's tokens, or propose past max_tokens or max_model_len.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from infer_cluster.worker.spec_decode.verify import DECODE_SHAPED_MAX_ROWS
from infer_cluster.worker.structured.state import grammar_prefix

_NONE: list[int] = []  # the shared "no proposals" value (never mutated)


# n-gram keys: a polynomial hash of the tokens, modulo 2**64 (numpy's uint64 wraps the same
# way), so a long list is indexed by numpy in one pass. A hit is checked against the tokens
# themselves, so a collision can only hide an occurrence, never propose from a wrong one.
_MUL = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1
# Fewer new positions than this are indexed in Python; more (a prompt, or the output of the
# steps that did not propose) by numpy.
_VECTOR_FROM = 48


_POW = [pow(_MUL, i, 1 << 64) for i in range(64)]  # _MUL ** i mod 2**64


def _keys_ending_at(tokens: Sequence[int], end: int, max_n: int) -> list[int]:
    """The keys of the n-grams ending at position `end` (inclusive), n = 1 .. max_n (fewer
    near the start): key = sum of tokens[end - j] * _MUL ** j, modulo 2**64."""
    h = tokens[end]
    keys = [h]
    for j in range(1, min(max_n, end + 1)):
        h = (h + tokens[end - j] * _POW[j]) & _MASK
        keys.append(h)
    return keys


class NgramIndex:
    """Where each n-gram of one token list last ended (positions < len(tokens) - 1 only: an
    occurrence must be followed by a token to be worth copying)."""

    __slots__ = ("min_n", "max_n", "_ends", "_num_indexed", "_looked_up")

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n
        self._ends: list[dict] = [{} for _ in range(max_n - min_n + 1)]  # [n - min_n][key] -> end
        self._num_indexed = 0  # n-grams ending before this position are in `_ends`
        # (position, its token, the keys ending there) of the last lookup: the next step indexes
        # that position with the same keys (half the hashing of a step that added one token)
        self._looked_up: Optional[tuple[int, int, list[int]]] = None

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """Up to `k` tokens that followed the most recent earlier occurrence of the longest
        suffix n-gram of `tokens` (n from max_n down to min_n); [] when none occurred."""
        size = len(tokens)
        if size < self._num_indexed:  # the list is not the one indexed (never happens in order)
            self.__init__(self.min_n, self.max_n)
        self._index(tokens, size - 1)
        if size <= 1:
            return _NONE
        last = size - 1
        keys = _keys_ending_at(tokens, last, min(self.max_n, last))
        if last >= self.max_n:  # every n: the keys `_index` will want for this position
            self._looked_up = (last, tokens[last], keys)
        for n in range(len(keys), self.min_n - 1, -1):
            end = self._ends[n - self.min_n].get(keys[n - 1])
            if end is not None and tokens[end - n + 1:end + 1] == tokens[size - n:]:
                return list(tokens[end + 1:end + 1 + k])
        return _NONE

    def _index(self, tokens: Sequence[int], stop: int) -> None:
        """Record the n-grams ending at positions [num_indexed, stop)."""
        first = self._num_indexed
        if stop - first >= _VECTOR_FROM:
            self._index_numpy(tokens, first, stop)
        else:
            min_n, ends, looked_up = self.min_n, self._ends, self._looked_up
            for end in range(first, stop):
                if looked_up is not None and looked_up[0] == end and looked_up[1] == tokens[end]:
                    keys = looked_up[2]
                else:
                    keys = _keys_ending_at(tokens, end, self.max_n)
                for n in range(min_n, len(keys) + 1):
                    ends[n - min_n][keys[n - 1]] = end
        self._num_indexed = max(first, stop)

    def _index_numpy(self, tokens: Sequence[int], first: int, stop: int) -> None:
        """`_index` for many positions: each n's keys over the window at once, then one dict
        update (in position order, so the most recent end of a key is the one kept)."""
        lo = max(0, first - self.max_n + 1)  # the earliest token an n-gram ending at `first` uses
        window = np.asarray(tokens[lo:stop], dtype=np.uint64)
        keys = np.zeros(0, dtype=np.uint64)
        mul = np.uint64(_MUL)
        with np.errstate(over="ignore"):
            for n in range(1, self.max_n + 1):
                # keys[i]: the n-gram of window[i:i + n], ending at window position i + n - 1
                keys = window[n - 1:] if n == 1 else keys[:-1] * mul + window[n - 1:]
                if n < self.min_n:
                    continue
                skip = max(first - lo - (n - 1), 0)  # n-grams ending before `first` are in already
                ends = range(lo + n - 1 + skip, stop)
                self._ends[n - self.min_n].update(zip(keys[skip:].tolist(), ends))


class NgramProposer:
    """Sets `spec_token_ids` on each running request before the step is scheduled: proposals
    on rows that decode (every token but the last computed, nothing pending), none elsewhere;
    under a grammar, only the leading proposals it allows, none past a stop token."""

    def __init__(self, num_speculative_tokens: int, min_n: int, max_n: int, max_model_len: int,
                 max_rows: int = DECODE_SHAPED_MAX_ROWS):
        """`max_rows`: the most positions a verify step runs as a decode step (`row_limit`)."""
        self.k = num_speculative_tokens
        self.max_rows = max_rows
        self.min_n, self.max_n = min_n, max_n
        self.max_model_len = max_model_len

    def propose(self, running: Sequence) -> None:
        k = row_limit(self.k, len(running), self.max_rows)
        for req in running:
            room = proposal_room(req, k, self.max_model_len, grammar_ok=True)
            if room <= 0:
                if req.spec_token_ids:
                    req.spec_token_ids = _NONE
                continue
            proposals = self._index(req).propose(req.all_token_ids, room)
            if req.grammar is not None and proposals:  # only what the grammar allows is verified
                proposals = grammar_prefix(req.grammar, req.output_token_ids, proposals) or _NONE
            req.spec_token_ids = proposals

    def shadow(self, req, batch: int) -> list[int]:
        """The proposals a verify step of `batch` rows would check after the request's tokens
        on the host (its last may still be pending: shadow.py measures, and proposes nothing
        to run). A grammar's rows count without their cut to the grammar (that needs the
        request's last token on the host)."""
        room = proposal_cap(req, row_limit(self.k, batch, self.max_rows), self.max_model_len,
                            grammar_ok=True)
        return self._index(req).propose(req.all_token_ids, room) if room > 0 else _NONE

    def _index(self, req) -> NgramIndex:
        """The request's index, made at its first proposal (`Request.draft_state`)."""
        index: Optional[NgramIndex] = req.draft_state
        if index is None:
            index = req.draft_state = NgramIndex(self.min_n, self.max_n)
        return index


def row_limit(k: int, batch: int, max_rows: int = DECODE_SHAPED_MAX_ROWS) -> int:
    """Proposals a row at `batch` rows: k, but no more than keep the verify step within
    `max_rows` positions (`verify_max_rows`, 48 by default), where it is a decode step (its
    kernels and CUDA graphs; past that it runs as a mixed step, several times slower,
    verify.py), and at least one. So a large k
    serves batch 1 (on the H200, SmolLM2's copy phases accepted every proposal of k = 4) and
    shrinks as the batch grows: k = 8 gives 8 up to batch 5, 5 at batch 8, 2 at batch 16."""
    return min(k, max(1, max_rows // max(1, batch) - 1))


def proposal_room(req, k: int, max_model_len: int, grammar_ok: bool = False) -> int:
    """How many proposals the request can use: 0 unless it decodes (every token but the last
    computed, nothing pending), then `proposal_cap`. Every proposer uses this rule."""
    if req.num_computed_tokens != req.num_tokens - 1 or req.num_pending:
        return 0
    return proposal_cap(req, k, max_model_len, grammar_ok)


def proposal_cap(req, k: int, max_model_len: int, grammar_ok: bool = False) -> int:
    """At most k, and never so many that the verified tokens could pass max_tokens or
    max_model_len (shadow proposals use this alone: their request's last token may still be
    pending). 0 for a request with a grammar unless `grammar_ok`: a proposer that cuts its
    proposals to the grammar (`grammar_prefix`) before the step is scheduled (prompt lookup;
    a draft model's proposals are made after, so it proposes nothing there)."""
    if req.grammar is not None and not grammar_ok:
        return 0
    return min(k, req.params.max_tokens - len(req.output_token_ids) - 1,
               max_model_len - req.num_tokens - 1)
