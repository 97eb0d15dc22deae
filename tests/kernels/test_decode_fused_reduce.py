"""The decode kernel's fused reduce (`decode_attention(counters=...)`,
`kernels/attention_decode_triton.py`): with a zeroed int32 counter per (sequence, KV head), the
last partition of each to finish merges the partials, so no `_reduce_kernel` launch follows.
It must match the plain-torch reference and the two-kernel path (same partials, same merge
order), leave every counter at zero for the next launch (CUDA graphs replay it), fall back to
the reduce kernel when the counters are too few, and refuse a counter tensor of the wrong kind.
Empty partitions and rows without a query are in every batch: they arrive at the counter too."""

import pytest
import torch

from infer_cluster.kernels import attention_decode_triton as adt
from infer_cluster.kernels.attention import paged_attention_ref
from infer_cluster.kernels.attention_triton import decode_attention, paged_attention_triton
from tests.kernels.test_attention import make_batch
from tests.kernels.conftest import tol


class _Launches:
    """Wraps a Triton kernel: counts its launches, then launches the real one."""

    def __init__(self, kernel):
        self.kernel, self.count = kernel, 0

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.count += 1
            return self.kernel[grid](*args, **kwargs)
        return launch


def _decode(batch, counters, num_splits, **kw):
    q, k_cache, v_cache, block_tables, qsl, seq_lens = batch
    out = torch.full_like(q, float("nan"))
    decode_attention(q, k_cache, v_cache, block_tables, qsl, seq_lens, 0.1, out,
                     num_splits=num_splits, counters=counters, **kw)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_splits,block_size", [(2, 16), (5, 32), (8, 16)])
def test_fused_reduce_matches_ref_and_the_reduce_kernel(device, monkeypatch, dtype, num_splits,
                                                        block_size):
    batch = make_batch(device, dtype, [1, 1, 0, 1], [130, 1, 9, 37], 8, 2, 64, block_size)
    q, k_cache, v_cache, block_tables, qsl, seq_lens = batch
    reduce = _Launches(adt._reduce_kernel)
    monkeypatch.setattr(adt, "_reduce_kernel", reduce)
    counters = torch.zeros(4 * 2 + 3, dtype=torch.int32, device=device)  # spare slots stay 0
    two_kernels = _decode(batch, None, num_splits)
    assert reduce.count == 1
    for _ in range(2):  # a second launch on the same counters (a graph replay)
        fused = _decode(batch, counters, num_splits)
        assert reduce.count == 1, "the fused path launched the reduce kernel"
        assert torch.equal(counters, torch.zeros_like(counters)), counters
        assert not fused.isnan().any(), "a query row was not merged (or KV past seq_lens was read)"
    ref = paged_attention_ref(q, k_cache, v_cache, block_tables, qsl, seq_lens, 0.1)
    atol, rtol = tol(dtype)
    torch.testing.assert_close(fused, ref, atol=atol, rtol=rtol)
    torch.testing.assert_close(fused, two_kernels, atol=1e-6, rtol=1e-5)


def test_too_few_counters_fall_back_to_the_reduce_kernel(device, monkeypatch):
    batch = make_batch(device, torch.float32, [1, 1], [40, 70], 4, 2, 32, 16)
    reduce = _Launches(adt._reduce_kernel)
    monkeypatch.setattr(adt, "_reduce_kernel", reduce)
    counters = torch.zeros(3, dtype=torch.int32, device=device)  # 2 seqs x 2 KV heads need 4
    out = _decode(batch, counters, 3)
    assert reduce.count == 1
    q, k_cache, v_cache, block_tables, qsl, seq_lens = batch
    ref = paged_attention_ref(q, k_cache, v_cache, block_tables, qsl, seq_lens, 0.1)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_the_switch_turns_it_off(device, monkeypatch):
    batch = make_batch(device, torch.float32, [1], [50], 4, 2, 32, 16)
    reduce = _Launches(adt._reduce_kernel)
    monkeypatch.setattr(adt, "_reduce_kernel", reduce)
    monkeypatch.setenv("INFER_CLUSTER_DECODE_FUSED_REDUCE", "0")
    _decode(batch, torch.zeros(2, dtype=torch.int32, device=device), 3)
    assert reduce.count == 1


def test_one_partition_needs_no_counters(device):
    batch = make_batch(device, torch.float32, [1], [20], 4, 2, 32, 16)
    counters = torch.zeros(2, dtype=torch.int32, device=device)
    out = _decode(batch, counters, 1)
    q, k_cache, v_cache, block_tables, qsl, seq_lens = batch
    torch.testing.assert_close(out, paged_attention_ref(q, k_cache, v_cache, block_tables, qsl,
                                                        seq_lens, 0.1), atol=1e-5, rtol=1e-5)
    assert torch.equal(counters, torch.zeros_like(counters))


@pytest.mark.parametrize("bad", [dict(dtype=torch.int64), dict(dtype=torch.float32)])
def test_wrong_counters_are_refused(device, bad):
    batch = make_batch(device, torch.float32, [1], [50], 4, 2, 32, 16)
    with pytest.raises(ValueError, match="decode counters must be a contiguous int32 tensor"):
        _decode(batch, torch.zeros(4, device=device, **bad), 3)


def test_public_entry_passes_counters(device, monkeypatch):
    batch = make_batch(device, torch.bfloat16, [1, 1], [90, 3], 4, 1, 64, 16)
    q, k_cache, v_cache, block_tables, qsl, seq_lens = batch
    reduce = _Launches(adt._reduce_kernel)
    monkeypatch.setattr(adt, "_reduce_kernel", reduce)
    counters = torch.zeros(2, dtype=torch.int32, device=device)
    got = paged_attention_triton(q, k_cache, v_cache, block_tables, qsl, seq_lens, 0.125, 1,
                                 decode_counters=counters)
    ref = paged_attention_ref(q, k_cache, v_cache, block_tables, qsl, seq_lens, 0.125)
    atol, rtol = tol(torch.bfloat16)
    torch.testing.assert_close(got, ref, atol=atol, rtol=rtol)
    assert reduce.count == 0 and torch.equal(counters, torch.zeros_like(counters))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_fused_reduce_large(gpu_device, dtype):
    """Real concurrency: many programs race for each counter; repeated launches on one tensor."""
    ctx = [1, 17, 600, 611, 4097, 100, 1500, 129]
    batch = make_batch(gpu_device, dtype, [1] * len(ctx), ctx, 16, 8, 128, 16)
    q, k_cache, v_cache, block_tables, qsl, seq_lens = batch
    ref = paged_attention_ref(q, k_cache, v_cache, block_tables, qsl, seq_lens, 0.1)
    counters = torch.zeros(len(ctx) * 8, dtype=torch.int32, device=gpu_device)
    atol, rtol = tol(dtype)
    for splits in (None, 16, 33):
        for _ in range(20):
            out = _decode(batch, counters, splits)
            torch.testing.assert_close(out, ref, atol=atol, rtol=rtol)
        torch.cuda.synchronize()
        assert int(counters.abs().sum()) == 0
