"""The T > 1 greedy step's argmax from vocab shards (worker/models/parallel.py): each shard's
(value, id) pair, then the pick across shards, must equal `torch.argmax` of the whole row,
ties to the lowest id, with padding columns past the vocabulary ignored."""

import pytest
import torch

from infer_cluster.worker.models.parallel import pick_shard_argmax, shard_argmax_pair


def sharded_argmax(full: torch.Tensor, tp: int) -> torch.Tensor:
    """What `ParallelLMHead.greedy_ids` computes, with the gather done by stacking: shards
    of ceil(vocab / tp) columns, the last ones padded with garbage that must be ignored."""
    rows, vocab = full.shape
    shard = -(-vocab // tp)
    pairs = []
    for rank in range(tp):
        start = rank * shard
        local = torch.full((rows, shard), 1e4, dtype=full.dtype)  # padding: larger than any value
        valid = max(0, min(shard, vocab - start))
        local[:, :valid] = full[:, start:start + valid]
        pairs.append(shard_argmax_pair(local[:, :valid], start))
    return pick_shard_argmax(torch.stack(pairs))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tp", [1, 2, 3, 4])
@pytest.mark.parametrize("vocab", [8, 11, 1000, 151_936])
def test_random_rows(dtype, tp, vocab):
    full = torch.randn(6, vocab, generator=torch.Generator().manual_seed(vocab + tp)).to(dtype)
    assert torch.equal(sharded_argmax(full, tp), full.argmax(dim=-1))


@pytest.mark.parametrize("tp", [2, 3, 4])
def test_ties_go_to_the_lowest_id(tp):
    vocab = 10
    full = torch.zeros(5, vocab)
    full[0, [2, 7]] = 3.0    # tie across shards (every tp > 1)
    full[1, [5, 6]] = 3.0    # tie across the boundary 5|6 (tp=4), inside one shard otherwise
    full[2, [8, 9]] = 1.0    # tie inside the last shard
    full[3] = float("-inf")  # every value -inf: id 0
    full[4, 9] = 2.0         # the last real column (padding after it for tp=3, 4)
    expect = full.argmax(dim=-1)
    assert expect.tolist() == [2, 5, 8, 0, 9]
    assert torch.equal(sharded_argmax(full, tp), expect)


def test_empty_shard_never_wins():
    # vocab 5 over tp=4 (shards of 2): rank 3 holds only padding
    full = torch.full((2, 5), -1e30)
    full[0, 4] = -1e29
    full[1, 0] = -1e29
    assert sharded_argmax(full, 4).tolist() == [4, 0]


def test_ids_are_exact_at_large_vocab():
    vocab = 1 << 20
    full = torch.zeros(2, vocab)
    full[0, vocab - 1] = 1.0
    full[1, vocab - 3] = 1.0
    assert sharded_argmax(full, 2).tolist() == [vocab - 1, vocab - 3]
