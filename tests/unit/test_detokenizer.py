"""IncrementalDetokenizer on the embedded byte-level BPE tokenizer.

Streams must concatenate to exactly `tokenizer.decode(all ids)`, never show U+FFFD for a
character that spans tokens, cut stop strings (also ones spanning tokens) and release held-back
text on `flush()`.
"""

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from transformers import AutoTokenizer

from infer_cluster.worker.text.byte_tables import byte_level_table
from infer_cluster.worker.text.detokenizer import IncrementalDetokenizer as _Detokenizer
from infer_cluster.worker.loading.embedded import build_tokenizer


def IncrementalDetokenizer(tok, *args, **kwargs):  # noqa: N802 - stands in for the class
    """Every test runs on both paths: the generic window decode and the byte-table fast path."""
    return _Detokenizer(tok, *args, byte_table=getattr(tok, "_test_byte_table", None), **kwargs)

TEXTS = [
    "Hello, world! How are you today?",
    'def main():\n    print("hello world")\n\n\n  x = 1  \n',
    "héllo wörld — 日本",
    "🙂 ok 😀😀 ñ",
    " leading space and trailing ",
]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tokenizer")
    build_tokenizer(path)
    return path


@pytest.fixture(scope="module", params=["window", "byte_table"])
def tokenizer(tokenizer_dir, request):
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    if request.param == "byte_table":
        tok._test_byte_table = byte_level_table(tok)
        assert tok._test_byte_table is not None, "the embedded tokenizer is byte-level BPE"
    return tok


def encode(tok, text):
    return tok.encode(text, add_special_tokens=False)


def stream(detok, ids, chunk=1, final_last=False):
    """Push `ids` `chunk` at a time; return the list of (text, stopped) results."""
    results = []
    for i in range(0, len(ids), chunk):
        last = i + chunk >= len(ids)
        results.append(detok.push(ids[i:i + chunk], final=final_last and last))
        if results[-1][1]:
            break
    return results


def test_tokenizer_splits_multibyte_characters(tokenizer):
    # The premise of the U+FFFD tests: single tokens decode to partial characters.
    ids = encode(tokenizer, "日本")
    assert len(ids) >= 2
    assert any("\ufffd" in tokenizer.decode([i]) for i in ids)


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("context", ["", "The quick brown fox", "日"])
def test_one_token_at_a_time_equals_full_decode(tokenizer, text, context):
    ctx_ids = encode(tokenizer, context)
    ids = encode(tokenizer, text)
    detok = IncrementalDetokenizer(tokenizer, ctx_ids)
    results = stream(detok, ids)
    pieces = [t for t, _ in results]
    assert not any(stopped for _, stopped in results)
    for piece in pieces:
        assert "\ufffd" not in piece
    assert "".join(pieces) == tokenizer.decode(ids) == text
    assert detok.flush() == ""


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("chunk", [2, 3, 7])
def test_chunked_pushes_equal_full_decode(tokenizer, text, chunk):
    ids = encode(tokenizer, text)
    detok = IncrementalDetokenizer(tokenizer, encode(tokenizer, "Hello"))
    pieces = [t for t, _ in stream(detok, ids, chunk=chunk, final_last=True)]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)


def test_incomplete_character_is_held_until_complete(tokenizer):
    ids = encode(tokenizer, "日")
    assert len(ids) == 3  # three UTF-8 bytes, three byte tokens
    detok = IncrementalDetokenizer(tokenizer, encode(tokenizer, "a"))
    assert detok.push(ids[:1]) == ("", False)
    assert detok.push(ids[1:2]) == ("", False)
    assert detok.push(ids[2:]) == ("日", False)


def test_final_push_releases_incomplete_character(tokenizer):
    ids = encode(tokenizer, "日")
    detok = IncrementalDetokenizer(tokenizer, [])
    assert detok.push(ids[:1]) == ("", False)
    text, stopped = detok.push(ids[1:2], final=True)
    assert text == tokenizer.decode(ids[:2]) and not stopped


def test_long_stream_past_the_window(tokenizer):
    text = " ".join(["The quick brown fox jumps over the lazy dog 日本語"] * 8)
    ids = encode(tokenizer, text)
    assert len(ids) > 100
    detok = IncrementalDetokenizer(tokenizer, encode(tokenizer, "Once upon a time"))
    pieces = [t for t, _ in stream(detok, ids)]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)


def test_special_and_out_of_vocab_ids_add_no_text(tokenizer):
    detok = IncrementalDetokenizer(tokenizer, encode(tokenizer, "Hi"))
    ids = encode(tokenizer, " there")
    eos = tokenizer.eos_token_id
    assert "".join(detok.push([i])[0] for i in ids) == " there"
    assert detok.push([eos]) == ("", False)
    assert detok.push([len(tokenizer) + 5]) == ("", False)  # padded vocab rows of the model
    assert detok.push(encode(tokenizer, "!")) == ("!", False)


# -- stop strings -----------------------------------------------------------------------------

def run_stop(tokenizer, text, stop):
    ids = encode(tokenizer, text)
    detok = IncrementalDetokenizer(tokenizer, encode(tokenizer, "Q:"), stop=stop)
    results = stream(detok, ids)
    return ids, results, detok


@pytest.mark.parametrize("text,stop,expected", [
    ("Hello, world! How are you today?", ["How"], "Hello, world! "),
    ("Hello, world! How are you today?", ["world! How"], "Hello, "),  # spans three tokens
    ("Hello, world! How are you today?", ["you", "world"], "Hello, "),  # the earliest wins
    ("Hello, world! How are you today?", ["Hello"], ""),
    ("Hello, world! How are you today?", ["?"], "Hello, world! How are you today"),
    ("héllo wörld — 日本", ["ö"], "héllo w"),
    ("héllo wörld — 日本", ["— 日"], "héllo wörld "),
    ("line one\nline two\n", ["\n"], "line one"),
])
def test_stop_string_cuts_text(tokenizer, text, stop, expected):
    ids, results, detok = run_stop(tokenizer, text, stop)
    emitted = "".join(t for t, _ in results)
    assert emitted == expected
    assert results[-1][1] is True
    assert not any(stopped for _, stopped in results[:-1])
    # It stops on the token that completes the stop string, not later.
    consumed = ids[:len(results)]
    full = tokenizer.decode(consumed)
    assert any(full.endswith(s) or s in full for s in stop)
    assert not any(s in tokenizer.decode(ids[:len(results) - 1]) for s in stop)
    assert all("\ufffd" not in t for t, _ in results)
    assert detok.flush() == ""


def test_stop_string_spanning_tokens_is_never_partly_emitted(tokenizer):
    text = "Hello, world! How are you today?"
    stop = "world! How"
    ids = encode(tokenizer, text)
    detok = IncrementalDetokenizer(tokenizer, [], stop=[stop])
    emitted = ""
    for i in ids:
        piece, stopped = detok.push([i])
        emitted += piece
        assert "world" not in emitted  # held back while it may still become the stop string
        if stopped:
            break
    assert stopped and emitted == "Hello, "


def test_held_text_released_by_flush(tokenizer):
    text = "Hello, world! How are you"
    ids = encode(tokenizer, text)
    detok = IncrementalDetokenizer(tokenizer, [], stop=["never"])  # holds 4 characters
    emitted = "".join(t for t, _ in stream(detok, ids))
    assert emitted == text[:-4]
    assert detok.flush() == " you"[-4:]
    assert detok.flush() == ""


def test_stop_search_keeps_a_window_not_the_whole_output(tokenizer):
    # With stop strings only the unreturned text and the `hold` characters before it are kept,
    # so a long output is not copied again at every token; the stream is unchanged.
    text = "Hello, world! How are you today? " * 40
    ids = encode(tokenizer, text)
    detok = IncrementalDetokenizer(tokenizer, [], stop=["never"])  # holds 4 characters
    emitted = ""
    for i in ids:
        piece, stopped = detok.push([i])
        emitted += piece
        assert not stopped
        assert len(detok.text) <= detok.hold + len(tokenizer.decode([i]))
    assert emitted + detok.flush() == text


def test_partial_stop_prefix_at_the_end_is_released(tokenizer):
    # "How ar" looks like the start of "How are" and is held; the request ends another way.
    ids = encode(tokenizer, "Hello, world! How")
    detok = IncrementalDetokenizer(tokenizer, [], stop=["How are"])
    emitted = "".join(t for t, _ in stream(detok, ids))
    assert emitted + detok.flush() == "Hello, world! How"
    assert len(emitted) == len("Hello, world! How") - 6


def test_final_push_releases_held_text(tokenizer):
    ids = encode(tokenizer, "Hello, world!")
    detok = IncrementalDetokenizer(tokenizer, [], stop=["xyz"])
    results = stream(detok, ids, final_last=True)
    assert "".join(t for t, _ in results) == "Hello, world!"
    assert detok.flush() == ""


def test_without_stop_strings_nothing_is_held(tokenizer):
    detok = IncrementalDetokenizer(tokenizer, [])
    ids = encode(tokenizer, "Hello, world")
    got = [detok.push([i])[0] for i in ids]
    assert got == [tokenizer.decode([i]) for i in ids]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\ufffd"), max_size=40),
       context=st.sampled_from(["", "Hi", "日本"]), chunk=st.integers(1, 4))
def test_random_text_streams_exactly(tokenizer, text, context, chunk):
    ids = encode(tokenizer, text)
    detok = IncrementalDetokenizer(tokenizer, encode(tokenizer, context))
    pieces = [t for t, _ in stream(detok, ids, chunk=chunk)]
    assert all("\ufffd" not in p for p in pieces)
    # special tokens typed as text (e.g. "<|pad|>") are skipped, as tokenizer.decode does
    assert "".join(pieces) + detok.flush() == tokenizer.decode(ids, skip_special_tokens=True)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(st.sampled_from("ab é日\n"), max_size=30), stop=st.text(st.sampled_from("ab é日\n"), min_size=1, max_size=4))
def test_random_stop_strings(tokenizer, text, stop):
    ids = encode(tokenizer, text)
    detok = IncrementalDetokenizer(tokenizer, [], stop=[stop])
    results = stream(detok, ids)
    emitted = "".join(t for t, _ in results)
    if stop in text:
        assert results[-1][1] is True
        assert emitted == text[:text.index(stop)]
    else:
        assert not any(s for _, s in results)
        assert emitted + detok.flush() == text


def test_clean_up_flag_that_decode_ignores_keeps_the_byte_table(tokenizer_dir):
    # transformers 5 sets clean_up_tokenization_spaces on BPE tokenizers and ignores it in
    # decode(): the table still reproduces decode, so the fast path stays on.
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    tok.clean_up_tokenization_spaces = True
    real = tok.decode
    tok.decode = lambda ids, **kw: real(ids, **{**kw, "clean_up_tokenization_spaces": False})
    table = byte_level_table(tok)
    assert table is not None
    ids = encode(tok, "It 's here , isn 't it ?")
    assert b"".join(table[i] for i in ids).decode() == tok.decode(ids) == "It 's here , isn 't it ?"


def test_clean_up_that_decode_applies_refuses_the_byte_table(tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    tok.clean_up_tokenization_spaces = True
    real = tok.decode
    tok.decode = lambda ids, **kw: real(ids, **kw).replace(" ,", ",").replace(" 's", "'s")
    assert byte_level_table(tok) is None


def _with_decoder(tokenizer_dir, *steps):
    from tokenizers import decoders

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    tok.backend_tokenizer.decoder = decoders.Sequence([*steps, decoders.ByteLevel()])
    return tok


def test_a_sequence_decoder_that_acts_as_byte_level_gets_the_table(tokenizer_dir):
    # what transformers 5.17 writes for SmolLM2's GGUF file: ByteFallback, Fuse, Replace("▁", " ")
    from tokenizers import decoders

    tok = _with_decoder(tokenizer_dir, decoders.ByteFallback(), decoders.Fuse(), decoders.Replace("▁", " "))
    table = byte_level_table(tok)
    assert table is not None
    for text in TEXTS:
        ids = encode(tok, text)
        detok = _Detokenizer(tok, [], byte_table=table)
        assert "".join(detok.push([i])[0] for i in ids) + detok.flush() == tok.decode(ids) == text


def test_a_sequence_decoder_that_rewrites_byte_level_text_is_refused(tokenizer_dir):
    from tokenizers import decoders

    assert byte_level_table(_with_decoder(tokenizer_dir, decoders.Replace("o", "0"))) is None
    assert byte_level_table(_with_decoder(tokenizer_dir, decoders.Strip(" ", 1, 0))) is None
