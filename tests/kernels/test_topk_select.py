"""The one-launch top-k of 16-bit logits rows (kernels/topk_select_triton.py) against torch.topk:
the same values highest first, ids that hold those values, each id once, ties at the threshold
taken by the lowest id; rows of ties, -inf and a short last block included; and the sampler's
`topk_by_blocks` taking it where the kernels run."""

import pytest
import torch

from infer_cluster.kernels.row_stats import block_maxima_ref
from infer_cluster.kernels.sample import topk_select_fits
from infer_cluster.kernels.topk_select_triton import topk_select


def _check(x, width):
    vals, ids = topk_select(x, block_maxima_ref(x), width)
    want = x.float().topk(width, dim=-1).values
    assert vals.dtype == torch.float32 and ids.dtype == torch.int64
    assert torch.equal(vals, want)
    assert torch.equal(x.float().gather(1, ids), vals)
    for r in range(x.shape[0]):
        row_ids = ids[r].tolist()
        assert len(set(row_ids)) == width
        # ties with the smallest kept value: the lowest ids of that value
        t = vals[r, -1].item()
        tied = (x[r].float() == t).nonzero().flatten().tolist()
        kept = sorted(i for i in row_ids if x[r, i].item() == t)
        assert kept == tied[:len(kept)]
    return vals, ids


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("vocab, width", [(5000, 1), (5000, 5), (5000, 114), (3 * 128, 300), (8192, 512)])
def test_topk_select_matches_torch(device, dtype, vocab, width):
    x = (3 * torch.randn(4, vocab, device=device)).to(dtype)
    _check(x, width)


def test_topk_select_ties_and_neg_inf(device):
    x = torch.randn(5, 4999, device=device).to(torch.bfloat16)
    x[0] = 1.0                               # every value tied
    x[1, ::3] = 8.0                          # a tie group wider than the width, spread over blocks
    x[2] = float("-inf")                     # a row masked out but for a few tokens
    x[2, [7, 900, 4998]] = torch.tensor([0.5, -1.0, 3.0], dtype=torch.bfloat16, device=device)
    x[3, 4990:] = 50.0                       # the winners in the short last block
    x[4, :2000] = float("-inf")
    x[4, 100] = -0.0                         # signed zero beside positive and negative values
    vals, ids = _check(x, 40)
    assert ids[1].tolist() == list(range(0, 120, 3))  # the lowest ids of the tie
    assert ids[2, :3].tolist() == [4998, 7, 900] and vals[2, 3:].eq(float("-inf")).all()
    assert set(ids[3, :9].tolist()) == set(range(4990, 4999))


def test_sampler_block_topk_takes_the_kernel(device, monkeypatch):
    """`topk_by_blocks` (the sampler's candidates, the logprobs' alternatives) gives the kernel's
    values where the sampler's kernels run, the torch path's elsewhere; both are torch.topk's."""
    from infer_cluster.worker.sampling.ops import topk_by_blocks
    x = (3 * torch.randn(3, 64 * 128 + 77, device=device)).to(torch.bfloat16)
    got = {}
    for mode in ("torch", "triton"):
        monkeypatch.setenv("INFER_CLUSTER_KERNELS", mode)
        vals, ids = topk_by_blocks(x, 114)
        got[mode] = (vals.float(), ids)
        assert torch.equal(x.float().gather(1, ids), vals.float())
    assert torch.equal(got["torch"][0], got["triton"][0])
    assert got["triton"][0].dtype == torch.float32  # the kernel's values (the torch path keeps bf16)


def test_fits():
    x = torch.zeros(2, 1000, dtype=torch.bfloat16)
    m = block_maxima_ref(x)
    assert topk_select_fits(x, m, 114, 128)
    assert not topk_select_fits(x.float(), m.float(), 114, 128)   # float32 logits: torch's topk
    assert not topk_select_fits(x, m, 513, 128)                   # past MAX_CANDIDATES
    assert not topk_select_fits(x[:, :100], block_maxima_ref(x[:, :100]), 101, 128)  # wider than the row
    assert not topk_select_fits(x, m, 0, 128)
