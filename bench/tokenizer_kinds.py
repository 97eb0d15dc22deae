"""Full-vocabulary tokenizers of two kinds, built offline, for benchmarks that decode every id.

The embedded models ship a 512-token byte-level BPE: with a 151,936-id model most sampled ids
fall outside it and decode to nothing, which hides the cost of detokenization. These builders
make a tokenizer that covers every id of the model:

  * `bytelevel`: GPT-2 style (ByteLevel pre-tokenizer and decoder), as Qwen and Llama 3 ship;
    the engine's byte-table fast path applies.
  * `metaspace`: SentencePiece style (NFKC normalizer, Metaspace pre-tokenizer and decoder), as
    Llama 2 and Mistral ship; the engine must decode through the tokenizer.

Token strings are synthetic (2-5 characters) but real for the tokenizer: decode, encode and
`convert_ids_to_tokens` all work. `build_tokenizer(kind, vocab_size, out_dir)` saves an HF
tokenizer folder to pass as `tokenizer=` to `LLM` / `EngineConfig`.
"""

from __future__ import annotations

import random
from pathlib import Path

KINDS = ("bytelevel", "metaspace")


def _byte_chars() -> list[str]:
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) \
        + list(range(ord("\xae"), ord("\xff") + 1))
    chars, extra = [], 0
    for b in range(256):
        if b in keep:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def _words(vocab_size: int, alphabet: list[str], prefix: str, rng: random.Random) -> list[str]:
    seen, words = set(), []
    while len(words) < vocab_size:
        w = "".join(rng.choice(alphabet) for _ in range(rng.randint(2, 5)))
        if rng.random() < 0.5:
            w = prefix + w
        if w not in seen:
            seen.add(w)
            words.append(w)
    return words


def build_tokenizer(kind: str, vocab_size: int, out_dir: str | Path, seed: int = 0) -> Path:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if kind not in KINDS:
        raise ValueError(f"tokenizer kind must be one of {KINDS}, got {kind!r}")
    rng = random.Random(seed)
    specials = ["<unk>", "<|endoftext|>"]
    if kind == "bytelevel":
        chars = _byte_chars()
        words = _words(vocab_size - len(specials), chars[33:127], chars[32], rng)  # Ġ = space
    else:
        letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + list("éàüñ0123456789")
        words = _words(vocab_size - len(specials), letters, "\u2581", rng)
    vocab = {t: i for i, t in enumerate(specials + words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    if kind == "bytelevel":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
    else:
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<|endoftext|>",
                                   clean_up_tokenization_spaces=False)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    return out
