"""`TokenBytes`: a token id's raw bytes, for the logprob entries that ask for them
(`SamplingParams.logprob_bytes`: OpenAI's logprob `token` and `bytes` fields).

Owns the lookup and its cache: the detokenizer's byte table where there is one
(worker/text/byte_tables.py: byte-level BPE or per-token pieces), the token decoded alone
otherwise, and special tokens (which the table maps to nothing, as detokenized text skips them)
by their literal text. Ids the tokenizer does not know (a model's padded vocabulary) have none.
Plain Python over the tokenizer; no torch.
"""

from __future__ import annotations

from typing import Optional


class TokenBytes:
    def __init__(self, tokenizer, byte_table: Optional[list[bytes]] = None):
        self.tokenizer = tokenizer
        self.vocab_limit = len(tokenizer)
        self.special = set(getattr(tokenizer, "all_special_ids", None) or ())
        # With a byte table, every id's bytes in one list (specials patched in), so an entry is
        # one comprehension of list lookups; without one, ids are decoded as they come, cached.
        self._by_id: Optional[list[bytes]] = None
        if byte_table is not None and len(byte_table) >= self.vocab_limit:
            self._by_id = list(byte_table[:self.vocab_limit])
            for t in self.special:
                if 0 <= t < self.vocab_limit:
                    self._by_id[t] = self._decoded(t)
        self._cache: dict[int, bytes] = {}

    def _decoded(self, token_id: int) -> bytes:
        return self.tokenizer.decode([token_id], skip_special_tokens=False).encode("utf-8")

    def get(self, token_id: int) -> Optional[bytes]:
        """The token's raw bytes; None for an id the tokenizer does not know."""
        if not 0 <= token_id < self.vocab_limit:
            return None
        if self._by_id is not None:
            return self._by_id[token_id]
        data = self._cache.get(token_id)
        if data is None:
            data = self._cache[token_id] = self._decoded(token_id)
        return data

    def entry_bytes(self, sampled: int, alternatives) -> dict:
        """`{token_id: bytes}` for the sampled token and each alternative the tokenizer knows."""
        by_id, limit = self._by_id, self.vocab_limit
        if by_id is not None:
            return {t: by_id[t] for t in (sampled, *alternatives) if 0 <= t < limit}
        return {t: self.get(t) for t in (sampled, *alternatives) if 0 <= t < limit}
