"""Incremental detokenization with stop strings.

Owns: turning a growing list of output token ids into text deltas without re-decoding the whole
sequence each step, holding back an incomplete UTF-8 character (shown by the tokenizer as
U+FFFD) and, while stop strings are set, the last `max(len(stop)) - 1` characters (they may be
the start of a stop string). `push()` returns the new visible text and whether a stop string
ended the request; the text never contains the stop string itself.

Two techniques. The fast path: a table of every id's raw bytes, built once
(worker/text/byte_tables.py), and each push appends bytes to an incremental UTF-8 decoder
(O(1) per token, no tokenizer call). Tokenizers without a table (byte-fallback merging,
clean-up rules) decode a small window that starts a few tokens before the unread ones and diff
it with the decoding of that window without them.
"""

from __future__ import annotations

import codecs
from typing import Optional, Sequence

_WINDOW = 6  # tokens of left context kept so merges/spaces decode the same way


class IncrementalDetokenizer:
    def __init__(self, tokenizer, context_token_ids: Sequence[int], stop: Sequence[str] = (),
                 skip_special_tokens: bool = True, byte_table: Optional[list[bytes]] = None):
        self.tokenizer = tokenizer
        self.byte_table = byte_table
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace") if byte_table else None
        self.vocab_limit = len(tokenizer)
        self.skip_special = skip_special_tokens
        self.tokens = [t for t in context_token_ids if t < self.vocab_limit]
        self.prefix_offset = max(0, len(self.tokens) - _WINDOW)
        self.read_offset = len(self.tokens)
        self.stop = list(stop)
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        # The window a stop search needs: the text not yet returned, after at most the last
        # `hold` characters returned (a stop string may start there). Only that window is kept:
        # appending to the whole output would copy it again at every token.
        self.text = ""
        self.num_emitted = 0    # characters of `text` already returned

    def _decode(self, ids):
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special)

    def push(self, token_ids: Sequence[int], final: bool = False) -> tuple[str, bool]:
        """Add tokens; return (text to emit now, stopped by a stop string)."""
        if self._utf8 is not None:
            table = self.byte_table
            if len(token_ids) == 1:  # the usual delta: one token
                t = token_ids[0]
                data = table[t] if t < len(table) else b""
            else:
                data = b"".join(table[t] for t in token_ids if t < len(table))
            if not self._utf8.buffer:  # nothing held back: whole characters decode in C
                try:
                    return self._accept(data.decode("utf-8"), final)
                except UnicodeDecodeError:
                    pass  # a split or invalid character: the incremental decoder's rules
            return self._accept(self._utf8.decode(data, final=final), final)
        self.tokens.extend(t for t in token_ids if t < self.vocab_limit)
        prefix = self._decode(self.tokens[self.prefix_offset:self.read_offset])
        full = self._decode(self.tokens[self.prefix_offset:])
        if full.endswith("\ufffd") and not final:
            new = ""  # an incomplete multi-byte character: wait for the next token
        else:
            new = full[len(prefix):]
            self.prefix_offset = max(self.prefix_offset, len(self.tokens) - _WINDOW)
            self.read_offset = len(self.tokens)
        return self._accept(new, final)

    def _accept(self, new: str, final: bool) -> tuple[str, bool]:
        """Append decoded text, apply stop strings and the hold-back rule."""
        if not self.stop:  # no stop strings, so no hold-back: everything goes out now
            return new, False
        start_search = max(0, len(self.text) - self.hold)
        self.text += new
        stopped = False
        cut = self._find_stop(start_search)
        if cut is not None:
            self.text = self.text[:cut]
            stopped = True
        limit = len(self.text) if (stopped or final) else max(self.num_emitted, len(self.text) - self.hold)
        out = self.text[self.num_emitted:limit]
        keep = max(0, len(self.text) - self.hold)  # <= limit: what is dropped was returned
        self.text = self.text[keep:]
        self.num_emitted = limit - keep
        return out, stopped

    def flush(self) -> str:
        """Release any held-back text (the request ended for another reason)."""
        out = self.text[self.num_emitted:]
        self.num_emitted = len(self.text)
        return out

    def _find_stop(self, start: int) -> Optional[int]:
        best = None
        for s in self.stop:
            i = self.text.find(s, start)
            if i != -1 and (best is None or i < best):
                best = i
        return best
