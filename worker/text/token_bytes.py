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
        self.table = byte_table
        self.vocab_limit = len(tokenizer)
        self.special = set(getattr(tokenizer, "all_special_ids", None) or ())
        self._cache: dict[int, bytes] = {}

    def get(self, token_id: int) -> Optional[bytes]:
        """The token's raw bytes; None for an id the tokenizer does not know."""
        data = self._cache.get(token_id)
        if data is None:
            if not 0 <= token_id < self.vocab_limit:
                return None
            if self.table is not None and token_id not in self.special and token_id < len(self.table):
                data = self.table[token_id]
            else:
                data = self.tokenizer.decode([token_id], skip_special_tokens=False).encode("utf-8")
            self._cache[token_id] = data
        return data

    def entry_bytes(self, sampled: int, alternatives) -> dict:
        """`{token_id: bytes}` for the sampled token and each alternative the tokenizer knows."""
        out = {}
        for t in (sampled, *alternatives):
            data = self.get(t)
            if data is not None:
                out[t] = data
        return out
