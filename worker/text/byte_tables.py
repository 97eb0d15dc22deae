"""Byte tables: every token id's raw bytes, so a detokenizer appends bytes instead of calling
the tokenizer (worker/text/detokenizer.py's fast path).

Owns building a table and proving it right for a tokenizer, or refusing (None: the caller
decodes windows through the tokenizer instead).
- `byte_level_table()`: byte-level BPE (GPT-2 style: Qwen, Llama 3, the embedded tokenizer),
  read off the vocabulary. Also a `Sequence` decoder whose steps before ByteLevel change no
  token (transformers 5.17 writes ByteFallback, Fuse and Replace for SmolLM2's GGUF file),
  checked on random sequences, and a tokenizer whose `clean_up_tokenization_spaces` is set but
  ignored by `decode()` (transformers 5 sets it and ignores it), checked on a probe.
- `piece_table()`: any other fast tokenizer whose decoding, after the first token, is the
  concatenation of per-token pieces (SentencePiece-style Metaspace, WordPiece, WordLevel, ...),
  kept only if decoding random sequences through the tokenizer agrees with it on every sample.
Plain Python over the tokenizer; no torch.
"""

from __future__ import annotations

import json
import random
import re
from typing import Optional


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable-character map used by byte-level BPE vocabularies."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) \
        + list(range(ord("\xae"), ord("\xff") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def byte_level_table(tokenizer, skip_special_tokens: bool = True) -> Optional[list[bytes]]:
    """Raw bytes of every token id, or None when the tokenizer is not plain byte-level BPE (or
    post-processes decoded text), in which case the generic window path is used."""
    from tokenizers import decoders

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    sequence = None
    if not isinstance(backend.decoder, decoders.ByteLevel):
        sequence = _byte_level_sequence(backend)
        if sequence is None:
            return None
    to_bytes = {ord(c): chr(b) for b, c in _bytes_to_unicode().items()}  # then latin-1 = the byte
    added = {i: t for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()}
    special = set(getattr(tokenizer, "all_special_ids", []))
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    plain = [t for i, t in enumerate(tokens) if i not in added]
    alphabet = {chr(c) for c in to_bytes}
    if None in plain or not set("".join(plain)) <= alphabet:
        return None
    if sequence is not None and not _sequence_is_byte_level(sequence, plain, alphabet):
        return None
    table = []
    for i, tok in enumerate(tokens):
        if i in added:
            skip = skip_special_tokens and (i in special or getattr(added[i], "special", False))
            table.append(b"" if skip else str(added[i]).encode())
        else:
            table.append(tok.translate(to_bytes).encode("latin-1"))
    if getattr(tokenizer, "clean_up_tokenization_spaces", False) and not _decodes_as_table(tokenizer, table):
        return None  # decode() really strips spaces before punctuation: the table would not
    if sequence is not None and not _random_decodes_as_table(tokenizer, table, skip_special_tokens):
        return None
    return table


# Decoders that leave byte-level BPE's tokens as they are, before a final ByteLevel: GGUF files
# converted by some transformers versions (SmolLM2's, by 5.17) chain them.
_BYTE_LEVEL_NEUTRAL = {"ByteFallback", "Fuse", "Replace"}
_BYTE_FALLBACK_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def _byte_level_sequence(backend) -> Optional[list[dict]]:
    """The steps of a `Sequence` decoder that ends with ByteLevel and whose other steps are
    `_BYTE_LEVEL_NEUTRAL` kinds, or None."""
    try:
        spec = json.loads(backend.to_str()).get("decoder") or {}
    except Exception:
        return None
    steps = spec.get("decoders") if spec.get("type") == "Sequence" else None
    if not steps or steps[-1].get("type") != "ByteLevel":
        return None
    if not all(step.get("type") in _BYTE_LEVEL_NEUTRAL for step in steps[:-1]):
        return None
    return steps


def _sequence_is_byte_level(steps: list[dict], plain: list[str], alphabet: set) -> bool:
    """Whether the steps before ByteLevel change no plain token: a Replace whose pattern cannot
    occur in byte-level text, and ByteFallback only where no token spells a byte (`<0x41>`)."""
    for step in steps[:-1]:
        kind = step.get("type")
        if kind == "Replace":
            pattern = (step.get("pattern") or {}).get("String")
            if not pattern or set(pattern) <= alphabet:
                return False  # a regex pattern, or one that byte-level text can contain
        elif kind == "ByteFallback" and any(_BYTE_FALLBACK_TOKEN.fullmatch(t) for t in plain):
            return False
    return True


def _random_decodes_as_table(tokenizer, table: list[bytes], skip_special_tokens: bool,
                             num_checks: int = 200, seed: int = 0, anchor: Optional[int] = None,
                             base: str = "") -> bool:
    """Whether `tokenizer.decode` of random id sequences equals the table's bytes; with
    `anchor`, each sequence follows that token, whose decoding is `base`."""
    rng = random.Random(seed)
    n = len(table)
    head = [] if anchor is None else [anchor]
    for _ in range(num_checks):
        seq = [rng.randrange(n) for _ in range(rng.randint(1, 12))]
        want = tokenizer.decode(head + seq, skip_special_tokens=skip_special_tokens)
        if want != base + b"".join(table[t] for t in seq).decode("utf-8", errors="replace"):
            return False
    return True


# Text that `clean_up_tokenization_spaces` rewrites (" ." -> ".", " 's" -> "'s", ...).
# transformers 5 sets the flag on many BPE tokenizers and then ignores it in decode().
_CLEAN_UP_PROBE = "a , b . c ! d ? e 's f n't g 'm h 've i 're j 'll k 'd l"


def _decodes_as_table(tokenizer, table: list[bytes]) -> bool:
    """Whether `tokenizer.decode` of the clean-up probe equals the table's bytes."""
    try:
        ids = tokenizer.encode(_CLEAN_UP_PROBE, add_special_tokens=False)
        want = tokenizer.decode(ids, skip_special_tokens=True)
    except Exception:
        return False
    got = b"".join(table[i] for i in ids if i < len(table)).decode("utf-8", errors="replace")
    return want == got


def piece_table(tokenizer, skip_special_tokens: bool = True, num_checks: int = 200,
                seed: int = 0) -> Optional[list[bytes]]:
    """Bytes of every id for the fast path, or None when no table reproduces this tokenizer's
    decoding exactly. Byte-level BPE is read off its vocabulary; any other fast tokenizer is
    measured (each id decoded after a fixed anchor token, in one batched call of the Rust
    backend) and then checked against `decode` on random sequences after that anchor."""
    table = byte_level_table(tokenizer, skip_special_tokens)
    if table is not None:
        return table
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return None
    n = len(tokenizer)
    special = set(getattr(tokenizer, "all_special_ids", []))
    try:
        anchor = next(i for i in range(n) if i not in special
                      and backend.decode([i], skip_special_tokens=skip_special_tokens).strip())
        base = backend.decode([anchor], skip_special_tokens=skip_special_tokens)
        pairs = backend.decode_batch([[anchor, i] for i in range(n)], skip_special_tokens=skip_special_tokens)
    except Exception:
        return None
    table = []
    for text in pairs:
        if not text.startswith(base) or "\ufffd" in text[len(base):]:
            return None  # context-dependent, or bytes that only combine with neighbours
        table.append(text[len(base):].encode())
    ok = _random_decodes_as_table(tokenizer, table, skip_special_tokens, num_checks, seed, anchor, base)
    return table if ok else None
