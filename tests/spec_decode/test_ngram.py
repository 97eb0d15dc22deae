"""Prompt lookup (`NgramIndex`, `NgramProposer`): the longest suffix n-gram that occurred
before, its most recent occurrence, the tokens after it; checked against a brute-force search
while a token list grows, and the caps that keep proposals inside max_tokens / max_model_len."""

import random

import pytest

from infer_cluster.protocol import SamplingParams
from infer_cluster.worker.sched.request import Request
from infer_cluster.worker.spec_decode.ngram import NgramIndex, NgramProposer


def brute_force(tokens, min_n, max_n, k):
    size = len(tokens)
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        suffix = tokens[size - n:]
        for end in range(size - 2, n - 2, -1):  # most recent first
            if tokens[end - n + 1:end + 1] == suffix:
                return tokens[end + 1:end + 1 + k]
    return []


@pytest.mark.parametrize("tokens,min_n,max_n,k,want", [
    ([1, 2, 3, 4, 1, 2, 3], 2, 2, 3, [4, 1, 2]),
    ([1, 2, 3, 4, 1, 2, 3], 3, 3, 2, [4, 1]),
    ([1, 2, 9, 1, 2, 8, 1, 2], 2, 2, 4, [8, 1, 2]),      # the most recent occurrence
    ([5, 1, 2, 3, 7, 2, 3, 6, 1, 2, 3], 1, 3, 2, [7, 2]),  # the longest n wins over a later short one
    ([1, 2, 3, 4, 1, 2, 3, 5, 6], 2, 2, 2, []),          # (5, 6) never occurred before
    ([7, 7, 7, 7], 1, 3, 4, [7]),                        # overlapping: only what is known follows
    ([4], 1, 3, 2, []),
    ([], 1, 3, 2, []),
])
def test_examples(tokens, min_n, max_n, k, want):
    assert NgramIndex(min_n, max_n).propose(tokens, k) == want
    assert brute_force(tokens, min_n, max_n, k) == want


@pytest.mark.parametrize("min_n,max_n,alphabet", [(1, 3, 3), (2, 4, 4), (3, 3, 2), (1, 1, 5)])
def test_matches_brute_force_while_tokens_grow(min_n, max_n, alphabet):
    rng = random.Random(min_n * 100 + max_n * 10 + alphabet)
    for _ in range(20):
        index = NgramIndex(min_n, max_n)
        tokens = []
        for _ in range(60):
            tokens.extend(rng.randrange(alphabet) for _ in range(rng.choice((1, 1, 2, 5))))
            k = rng.randint(1, 6)
            assert index.propose(tokens, k) == brute_force(tokens, min_n, max_n, k), tokens


def test_a_replaced_last_token_is_indexed_by_its_own_keys():
    """A lookup keeps the keys of the last position for the next step's indexing; where that
    token was replaced before the list grew (a redrawn id), the index hashes the new one."""
    rng = random.Random(7)
    for _ in range(100):
        index = NgramIndex(1, 2)
        tokens = [rng.randrange(2) for _ in range(rng.randint(4, 12))]
        for _ in range(12):
            index.propose(tokens, 3)
            tokens[-1] = 1 - tokens[-1]  # no lookup in between
            tokens.append(rng.randrange(2))
            assert index.propose(tokens, 3) == brute_force(tokens, 1, 2, 3), tokens


@pytest.mark.parametrize("min_n,max_n,alphabet,high", [(1, 3, 3, 0), (2, 4, 4, 0), (2, 4, 6, 150_000),
                                                       (3, 5, 2, 1 << 40)])
def test_long_stretches_indexed_at_once_match_brute_force(min_n, max_n, alphabet, high):
    """A prompt, or the output of steps that did not propose, is indexed in one numpy pass
    (hash keys that wrap modulo 2**64, token ids of any size): the same proposals as the
    brute-force search, then as the list grows a few tokens at a time."""
    rng = random.Random(min_n * 100 + max_n * 10 + alphabet)
    for _ in range(10):
        index = NgramIndex(min_n, max_n)
        tokens = [high + rng.randrange(alphabet) for _ in range(rng.randint(50, 400))]
        for _ in range(30):
            k = rng.randint(1, 6)
            assert index.propose(tokens, k) == brute_force(tokens, min_n, max_n, k)
            grow = rng.choice((1, 2, 5, 60, 120))
            tokens.extend(high + rng.randrange(alphabet) for _ in range(grow))


def _request(prompt, output=(), max_tokens=16, **kw):
    req = Request("r", prompt, SamplingParams(max_tokens=max_tokens, **kw), 0)
    for t in output:
        req.append_token(t)
    req.num_computed_tokens = req.num_tokens - 1  # decoding
    return req


def test_proposer_caps_by_max_tokens_and_max_model_len():
    prompt = [1, 2, 3, 4, 5, 6, 7, 8] * 4
    proposer = NgramProposer(4, 1, 3, max_model_len=100)
    req = _request(prompt, [1, 2], max_tokens=16)
    proposer.propose([req])
    assert req.spec_token_ids == [3, 4, 5, 6]
    req = _request(prompt, [1, 2], max_tokens=5)  # 2 out, 3 left: 2 proposals + 1 more at most
    proposer.propose([req])
    assert req.spec_token_ids == [3, 4]
    req = _request(prompt, [1, 2], max_tokens=3)  # the next token is the last: nothing to verify
    proposer.propose([req])
    assert req.spec_token_ids == []
    short = NgramProposer(4, 1, 3, max_model_len=len(prompt) + 4)  # 34 tokens, room for 2 more
    req = _request(prompt, [1, 2], max_tokens=16)
    short.propose([req])
    assert req.spec_token_ids == [3]


def test_proposer_skips_rows_that_do_not_decode():
    proposer = NgramProposer(3, 1, 2, max_model_len=100)
    req = _request([1, 2, 3, 1, 2], max_tokens=16)
    req.spec_token_ids = [9, 9]  # stale: cleared
    req.num_computed_tokens = 2  # still prefilling
    proposer.propose([req])
    assert req.spec_token_ids == []
    req.num_computed_tokens = 4
    req.num_pending = 1  # a token on its way (async scheduling): never speculated on
    proposer.propose([req])
    assert req.spec_token_ids == []
    req.num_pending = 0  # (a grammar's rows: tests/structured/test_masks.py, grammar_prefix)
    proposer.propose([req])
    assert req.spec_token_ids == [3, 1, 2]


def test_rows_get_fewer_proposals_as_the_batch_grows():
    """A verify step stays a decode step (at most DECODE_SHAPED_MAX_ROWS positions) where one
    proposal a row allows it: k at small batches, fewer as the batch grows, never none."""
    from infer_cluster.worker.spec_decode.ngram import row_limit
    from infer_cluster.worker.spec_decode.verify import DECODE_SHAPED_MAX_ROWS
    assert DECODE_SHAPED_MAX_ROWS == 48
    assert [row_limit(8, b) for b in (1, 5, 6, 8, 16, 24, 48, 256)] == [8, 8, 7, 5, 2, 1, 1, 1]
    assert row_limit(4, 1) == 4
    proposer = NgramProposer(8, 1, 2, 4096)
    reqs = [_request([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 1], max_tokens=64) for _ in range(8)]
    proposer.propose(reqs)
    assert all(req.spec_token_ids == [2, 3, 4, 5, 6] for req in reqs)
    proposer.propose(reqs[:1])
    assert reqs[0].spec_token_ids == [2, 3, 4, 5, 6, 7, 8, 9]


def test_verify_max_rows_sets_the_rows_a_verify_step_may_run_as_decode_rows(monkeypatch):
    """`INFER_CLUSTER_VERIFY_MAX_ROWS` raises the decode-shaped verify step's positions, so each
    row of a batch gets more proposals; a bad value is refused naming the variable."""
    from infer_cluster.worker.config import ConfigError
    from infer_cluster.worker.spec_decode.ngram import row_limit
    from infer_cluster.worker.spec_decode.verify import verify_max_rows
    monkeypatch.delenv("INFER_CLUSTER_VERIFY_MAX_ROWS", raising=False)
    assert verify_max_rows() == 48
    monkeypatch.setenv("INFER_CLUSTER_VERIFY_MAX_ROWS", "128")
    assert verify_max_rows() == 128
    assert [row_limit(15, b, 128) for b in (1, 8, 9, 16, 64, 128)] == [15, 15, 13, 7, 1, 1]
    proposer = NgramProposer(15, 1, 2, 4096, max_rows=verify_max_rows())
    reqs = [_request([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 1], max_tokens=64) for _ in range(16)]
    proposer.propose(reqs)  # 7 a row, where the default's 48 positions give 2
    assert all(req.spec_token_ids == [2, 3, 4, 5, 6, 7, 8] for req in reqs)
    for bad in ("0", "1", "513", "many", "-4"):
        monkeypatch.setenv("INFER_CLUSTER_VERIFY_MAX_ROWS", bad)
        with pytest.raises(ConfigError, match=f"INFER_CLUSTER_VERIFY_MAX_ROWS='{bad}' must be .* 2..512"):
            verify_max_rows()
