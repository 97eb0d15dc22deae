"""The logprob pack kernel (kernels/logprob_pack_triton.py) against torch: greedy rows' ids equal
`torch.argmax` (ties to the lowest column, the first NaN where a row holds one, +inf rows, rows
of -inf), and the float64 values equal `x.gather(...).double() - lse` and `vals.double() - lse`
bit for bit, from the same `row_stats` log-sum-exp and top-k."""

import pytest
import torch

from infer_cluster.kernels.row_stats import logprob_pack, row_stats
from infer_cluster.worker.sampling.ops import TOPK_BLOCK, topk_by_blocks


def _logits(vocab: int, dtype, device) -> torch.Tensor:
    g = torch.Generator().manual_seed(vocab)
    x = (torch.randn(12, vocab, generator=g) * 3).to(dtype)
    x[1, 5] = x[1, vocab - 3] = x[1].max() + 4          # a tie across blocks: the lower column
    x[2, 300:303] = x[2].max() + 1                      # a tie inside one block
    x[3] = float("-inf")                                # a masked-out row: column 0, as torch
    x[4, 7] = float("nan")                              # NaN wins, as torch.argmax
    x[4, 900] = float("nan")
    x[5, 11] = float("inf")                             # +inf: the whole row is scanned
    x[6, : vocab // 2] = float("-inf")                  # a grammar-style mask
    x[7, vocab - 1] = x[7].max() + 1                    # the last (short) block
    x[8, 0] = x[8].max() + 1                            # the first column
    return x.to(device)


@pytest.mark.parametrize("vocab", [1000, 1024])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("k", [0, 5, 20])
def test_greedy_pack_equals_torch(device, monkeypatch, vocab, dtype, k):
    monkeypatch.setenv("INFER_CLUSTER_KERNELS", "triton")
    x = _logits(vocab, dtype, device)
    lse, maxima = row_stats(x, TOPK_BLOCK)
    vals = topk_by_blocks(x, k, maxima)[0] if k else torch.empty(x.shape[0], 0, device=device)
    values, ids = logprob_pack(x, lse, None, vals, maxima)
    want_ids = torch.argmax(x.float(), dim=-1)
    assert ids.tolist() == want_ids.tolist()
    finite = [r for r in range(x.shape[0]) if r not in (3, 4, 5)]  # lse of NaN / +inf / -inf rows
    want = x.gather(1, want_ids.unsqueeze(1)).double() - lse.double().unsqueeze(1)
    if k:
        want = torch.cat([want, vals.double() - lse.double().unsqueeze(1)], dim=1)
    assert values.shape == (x.shape[0], 1 + k)
    assert torch.equal(values[finite], want[finite])


def test_chosen_ids_are_taken_as_given(device, monkeypatch):
    monkeypatch.setenv("INFER_CLUSTER_KERNELS", "triton")
    x = _logits(1000, torch.bfloat16, device)[[0, 1, 2, 6, 7, 8]]
    lse, maxima = row_stats(x, TOPK_BLOCK)
    chosen = torch.tensor([3, 999, 0, 998, 17, 500], dtype=torch.int64, device=device)
    vals = topk_by_blocks(x, 3, maxima)[0]
    values, ids = logprob_pack(x, lse, chosen, vals, maxima)
    assert ids is chosen
    want = torch.cat([x.gather(1, chosen.unsqueeze(1)).double(), vals.double()], dim=1) - lse.double().unsqueeze(1)
    assert torch.equal(values, want)


@pytest.mark.parametrize("k", [0, 3])
@pytest.mark.parametrize("greedy", [True, False])
def test_sampler_pack_takes_the_kernel_or_the_torch_path_alike(device, monkeypatch, k, greedy):
    """`worker.sampling.logprob_pack`: the one launch (Triton) and the torch ops give the same
    values, alternative ids and sampled ids from the same log-sum-exp and block maxima, with
    and without alternatives (logprobs=0: the sampled token's alone)."""
    from infer_cluster.worker.sampling.logprob_pack import logprob_pack as pack
    x = _logits(1000, torch.bfloat16, device)[[0, 1, 2, 6, 7, 8]]
    monkeypatch.setenv("INFER_CLUSTER_KERNELS", "triton")
    lse, maxima = row_stats(x, TOPK_BLOCK)
    chosen = None if greedy else torch.tensor([3, 999, 0, 998, 17, 500], dtype=torch.int64, device=device)
    values, alt_ids, ids = pack(x, lse, chosen, k, maxima)
    monkeypatch.setenv("INFER_CLUSTER_KERNELS", "torch")
    want_values, want_alt_ids, want_ids = pack(x, lse, chosen, k, maxima)
    assert torch.equal(values, want_values) and torch.equal(ids, want_ids)
    # alternatives of equal value may come in either order (row 2 holds a three-way tie)
    assert alt_ids.shape == want_alt_ids.shape == (x.shape[0], k)
    assert alt_ids.sort(dim=1).values.tolist() == want_alt_ids.sort(dim=1).values.tolist()


def test_greedy_ids_over_many_tiles(device, monkeypatch):
    """Small tiles (`_BLOCK_TILE` of 4 block maxima, `_SCAN` of 256 columns), so the search over
    the maxima and the whole-row scan each merge several tiles: a later tile wins only with a
    larger value or (the scan) a NaN, ties keep the first column."""
    from infer_cluster.kernels import logprob_pack_triton as lp
    monkeypatch.setattr(lp, "_BLOCK_TILE", 4)
    monkeypatch.setattr(lp, "_SCAN", 256)
    monkeypatch.setenv("INFER_CLUSTER_KERNELS", "triton")
    x = _logits(1000, torch.bfloat16, device)
    x[9, 900] = x[9].max() + 2                          # the maximum in the last tile of maxima
    x[10, 700] = float("nan")                           # a NaN in a later scan tile than +inf
    x[10, 300] = float("inf")
    x[11, 600] = x[11, 650] = float("inf")              # +inf twice: the first
    lse, maxima = row_stats(x, TOPK_BLOCK)
    vals = topk_by_blocks(x, 2, maxima)[0]
    _, ids = logprob_pack(x, lse, None, vals, maxima)
    assert ids.tolist() == torch.argmax(x.float(), dim=-1).tolist()
