"""Triton row statistics (log-sum-exp, block maxima) vs `row_stats_ref`."""

import pytest
import torch

from infer_cluster.kernels.row_stats import block_maxima, block_maxima_ref, row_stats, row_stats_ref
from infer_cluster.kernels.row_stats_triton import block_maxima_triton, row_stats_triton


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 100), (3, 4096), (5, 5000), (2, 2048 * 3 + 129)])
def test_row_stats_matches_ref(device, dtype, shape):
    x = (4 * torch.randn(shape, device=device)).to(dtype)
    x_before = x.clone()
    lse, bmax = row_stats_triton(x)
    ref_lse, ref_bmax = row_stats_ref(x)
    assert lse.dtype == torch.float32 and bmax.dtype == dtype
    assert bmax.shape == ref_bmax.shape == (shape[0], -(-shape[1] // 128))
    torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-5)
    assert torch.equal(bmax, ref_bmax)  # a maximum is exact in any dtype
    assert torch.equal(x, x_before)


@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")  # the interpreter's log(0) = -inf
def test_row_stats_neg_inf_entries_and_rows(device):
    x = torch.randn(4, 3000, device=device)
    x[0, 5:2900] = float("-inf")          # most of a row banned
    x[1] = float("-inf")                  # a whole row banned: lse -inf, like torch
    x[2, :2048] = float("-inf")           # a whole tile (and so a whole part) banned
    x[3, 17] = 80.0                       # one dominant value: exp must not overflow
    lse, bmax = row_stats_triton(x)
    ref_lse, ref_bmax = row_stats_ref(x)
    assert lse[1].item() == float("-inf")
    torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-5)
    assert torch.equal(bmax, ref_bmax)


def test_row_stats_non_contiguous_rows(device):
    base = torch.randn(6, 2600, device=device)
    x = base[::2, :2500]                  # row stride != vocab
    lse, bmax = row_stats(x)
    ref_lse, ref_bmax = row_stats_ref(x)
    torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-5)
    assert torch.equal(bmax, ref_bmax)


@pytest.mark.parametrize("rows", [1, 256])
def test_row_stats_full_vocab(gpu_device, rows):
    x = (3 * torch.randn(rows, 151936, device=gpu_device)).to(torch.bfloat16)
    lse, bmax = row_stats_triton(x)
    ref_lse, ref_bmax = row_stats_ref(x)
    torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-5)
    assert torch.equal(bmax, ref_bmax)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 100), (3, 4096), (2, 2048 * 3 + 129)])
def test_block_maxima_alone_matches_ref(device, dtype, shape):
    """The maxima-only launch (no exp, no sums) gives `block_maxima_ref` exactly, -inf runs and a
    short last block included; `block_maxima` takes it where Triton runs."""
    x = (4 * torch.randn(shape, device=device)).to(dtype)
    x[0, :min(300, shape[1])] = float("-inf")
    ref = block_maxima_ref(x)
    assert ref.shape == (shape[0], -(-shape[1] // 128))
    assert torch.equal(block_maxima_triton(x), ref)
    if device != "cpu":
        assert torch.equal(block_maxima(x), ref)


@pytest.mark.parametrize("rows", [1, 256])
def test_block_maxima_full_vocab(gpu_device, rows):
    x = (3 * torch.randn(rows, 151936, device=gpu_device)).to(torch.bfloat16)
    assert torch.equal(block_maxima(x), block_maxima_ref(x))


def test_row_stats_rejects_bad_shapes():
    with pytest.raises(ValueError, match="rows, vocab"):
        row_stats(torch.zeros(3))
    with pytest.raises(ValueError, match="rows, vocab"):
        row_stats(torch.zeros(2, 0))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_sampler_logprobs_through_row_stats(device, dtype, monkeypatch):
    """The sampler's kernel path (row_stats + block top-k, no float32 copy for greedy rows)
    gives the log_softmax of the raw logits, on a vocabulary wide enough for the block top-k."""
    from infer_cluster.protocol import SamplingParams
    from infer_cluster.worker.sampling.sampler import Sampler
    from infer_cluster.worker.sampling.draw_io import SamplingRequestState
    if device == "cpu":
        monkeypatch.setenv("INFER_CLUSTER_KERNELS", "triton")  # the interpreter stands in for CUDA
    logits = (3 * torch.randn(3, 4000, device=device)).to(dtype)
    logits[1, 123] = logits[1].max() + 1  # a clear winner inside a block
    rows = [SamplingRequestState(SamplingParams(temperature=0.0, logprobs=n), [], [], None, [])
            for n in (5, 20, 0)]
    out = Sampler()(logits.clone(), rows, logits_writable=True)
    reference = torch.log_softmax(logits.float(), dim=-1)
    assert out.token_ids == reference.argmax(dim=-1).tolist()
    for i, n in enumerate((5, 20, 0)):
        sampled_lp, alts = out.logprobs[i]
        assert sampled_lp == pytest.approx(reference[i, out.token_ids[i]].item(), abs=1e-4)
        top = reference[i].topk(n)  # bf16 logits tie often: which id of a tie comes is free
        assert len(alts) == n
        assert list(alts.values()) == pytest.approx(top.values.tolist(), abs=1e-4)
        assert list(alts.values()) == pytest.approx(reference[i, list(alts)].tolist(), abs=1e-4)
