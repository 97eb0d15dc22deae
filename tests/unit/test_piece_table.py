"""`piece_table`: the fast path for tokenizers that are not byte-level BPE.

Whatever a tokenizer is, the fast path must produce exactly the text the generic window path
produces: a table is only returned when it reproduces the tokenizer, otherwise None. Checked
on SentencePiece-style (Metaspace + NFKC), synthetic byte-level, WordPiece and a Llama-2-like
byte-fallback tokenizer, streaming random ids one push at a time, with stop strings.
"""

import random

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from bench.tokenizer_kinds import build_tokenizer
from infer_cluster.worker.text.byte_tables import piece_table
from infer_cluster.worker.text.detokenizer import IncrementalDetokenizer


def _wordpiece(tmp):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    vocab = {"[UNK]": 0, "[SEP]": 1}
    for w in ["the", "cat", "sat", "on", "mat", "##s", "##ing", "##ed", "a", "dog", ".", ",", "run", "##ner"]:
        vocab[w] = len(vocab)
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", sep_token="[SEP]",
                                   clean_up_tokenization_spaces=False)
    fast.save_pretrained(str(tmp))
    return tmp


def _byte_fallback(tmp):
    from tokenizers import Tokenizer, decoders, models
    vocab = {"<unk>": 0, "</s>": 1}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for w in ["\u2581the", "\u2581cat", "at", "\u2581", "s", "\u2581dog", "é", "日本"]:
        vocab[w] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="</s>",
                                   clean_up_tokenization_spaces=False)
    fast.save_pretrained(str(tmp))
    return tmp


@pytest.fixture(scope="module", params=["metaspace", "bytelevel", "wordpiece", "byte_fallback"])
def tokenizer(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param)
    if request.param in ("metaspace", "bytelevel"):
        build_tokenizer(request.param, 3000, tmp)
    elif request.param == "wordpiece":
        _wordpiece(tmp)
    else:
        _byte_fallback(tmp)
    return request.param, AutoTokenizer.from_pretrained(str(tmp))


def _stream(tok, table, prompt, ids, stop):
    d = IncrementalDetokenizer(tok, prompt, stop, byte_table=table)
    parts, stopped = [], False
    for i, t in enumerate(ids):
        text, stopped = d.push([t], final=i == len(ids) - 1)
        parts.append(text)
        if stopped:
            break
    if not stopped:
        parts.append(d.flush())
    return "".join(parts), stopped


def test_table_matches_window_path(tokenizer):
    kind, tok = tokenizer
    table = piece_table(tok)
    if kind in ("metaspace", "bytelevel", "wordpiece"):
        assert table is not None, f"{kind}: the fast path should apply"
    if table is None:
        return  # the engine uses the window path: nothing to compare
    rng = random.Random(1)
    n = len(tok)
    for trial in range(60):
        prompt = [rng.randrange(2, n) for _ in range(rng.randint(1, 5))]
        ids = [rng.randrange(n) for _ in range(rng.randint(1, 30))]
        stop = []
        if trial % 3 == 0:
            full, _ = _stream(tok, None, prompt, ids, [])
            if len(full) > 4:
                start = rng.randrange(len(full) - 2)
                stop = [full[start:start + 2]]
        assert _stream(tok, table, prompt, ids, stop) == _stream(tok, None, prompt, ids, stop), (kind, trial)
