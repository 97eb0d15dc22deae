"""`bench/int8_prefill.py`'s FLOP count: the causal products a chunk at the end of its context
needs, against counting every (query, key) pair the mask keeps."""

from bench.int8_prefill import attention_flops


def _brute(q_lens, ctx_lens, heads, head_dim):
    pairs = 0
    for q, c in zip(q_lens, ctx_lens):
        for pos in range(c - q, c):  # the chunk's query positions
            pairs += sum(1 for key in range(c) if key <= pos)
    return 4 * heads * head_dim * pairs


def test_flops_match_the_causal_pairs():
    cases = [([3], [3]), ([2], [5]), ([1, 7, 4], [9, 7, 30]), ([16], [16])]
    for q_lens, ctx_lens in cases:
        assert attention_flops(q_lens, ctx_lens, 2, 8) == _brute(q_lens, ctx_lens, 2, 8)
    # two 1,024-token chunks over 2,048 cached tokens: ~26 GFLOP at 16 heads of 128
    assert attention_flops([1024] * 2, [3072] * 2, 16, 128) == 4 * 16 * 128 * 2 * (1024 * 2048 + 1024 * 1025 // 2)


def test_tiles_argument_takes_four_positive_numbers():
    """`--tiles BM,BN,WARPS,STAGES`: a malformed value is a one-line usage error, not a traceback."""
    import argparse

    import pytest

    from bench.int8_prefill import _tile_set
    assert _tile_set("128,64,8,4") == (128, 64, 8, 4)
    for bad in ("128,64", "128,64,8,0", "a,b,c,d", "128,64,8,4,2"):
        with pytest.raises(argparse.ArgumentTypeError, match="BM,BN,WARPS,STAGES"):
            _tile_set(bad)
