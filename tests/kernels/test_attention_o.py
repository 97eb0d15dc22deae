"""Batch-1 decode attention with the split merge and the o projection in one launch
(`kernels/attention_o*.py`) against plain torch: `F.linear(paged_attention_ref(...), W_o)` added
into a float32 accumulator. Forced split counts cover empty partitions and the unsplit path
(the decode writes its output and the GEMV runs); NaN-poisoned pages past each context trap
reads beyond seq_lens. The `gpu` case runs the Qwen3-0.6B shape with the planned split."""

import pytest
import torch
import torch.nn.functional as F

from infer_cluster.kernels import attention_o
from infer_cluster.kernels.attention import paged_attention_ref
from infer_cluster.kernels.attention_o_triton import attention_o_small_triton
from tests.kernels.conftest import tol
from tests.kernels.test_attention import make_batch


def _run(device, dtype, ctx, heads, kv_heads, dim, block_size, hidden, num_splits, block_c=16):
    q, k_cache, v_cache, bt, qsl, lens = make_batch(device, dtype, [1], [ctx], heads, kv_heads, dim,
                                                   block_size)
    w = (torch.randn(hidden, heads * dim, device=device) / (heads * dim) ** 0.5).to(dtype)
    acc = torch.zeros(1, hidden, device=device)
    zero = torch.full((1, hidden), 5.0, device=device)
    out = attention_o_small_triton(q, k_cache, v_cache, bt, qsl, lens, dim ** -0.5, w, acc, zero,
                                   block_c=block_c, num_warps=4, num_splits=num_splits)
    assert out is acc and torch.count_nonzero(zero) == 0
    assert not torch.isnan(acc).any(), "read KV past seq_lens (NaN trap)"
    attn = paged_attention_ref(q, k_cache, v_cache, bt, qsl, lens, dim ** -0.5)
    ref = F.linear(attn.reshape(1, -1).float(), w.float())
    return acc, ref, attn, w


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_splits", [1, 3, 8])
@pytest.mark.parametrize("case", [(130, 4, 2, 32, 16, 48), (33, 2, 1, 16, 16, 40), (9, 4, 4, 64, 32, 64)],
                         ids=lambda c: f"ctx{c[0]}-h{c[1]}/{c[2]}-d{c[3]}-bs{c[4]}-n{c[5]}")
def test_attention_o_matches_torch(device, dtype, num_splits, case):
    ctx, heads, kv_heads, dim, block_size, hidden = case  # hidden 40, 48: not a power of two
    acc, ref, attn, w = _run(device, dtype, ctx, heads, kv_heads, dim, block_size, hidden, num_splits)
    atol, rtol = tol(dtype)
    # The attention output is rounded to the dtype on both sides (the merge's output, the
    # reference's): one ulp of it, times |W_o| summed over the heads' dims.
    bound = atol + rtol * (attn.reshape(1, -1).float().abs() @ w.float().abs().t()) + rtol * ref.abs()
    assert ((acc - ref).abs() <= bound).all()


def test_adds_into_acc_and_block_c_must_divide_head_dim(device):
    q, k_cache, v_cache, bt, qsl, lens = make_batch(device, torch.float32, [1], [50], 2, 1, 16, 16)
    w = torch.randn(24, 32, device=device) / 6
    acc = torch.zeros(1, 24, device=device)
    attention_o_small_triton(q, k_cache, v_cache, bt, qsl, lens, 0.25, w, acc, num_splits=4)
    once = acc.clone()
    attention_o_small_triton(q, k_cache, v_cache, bt, qsl, lens, 0.25, w, acc, num_splits=4)
    torch.testing.assert_close(acc, 2 * once, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="block_c"):
        attention_o_small_triton(q, k_cache, v_cache, bt, qsl, lens, 0.25, w, acc, block_c=12)
    with pytest.raises(ValueError, match="o weight"):
        attention_o_small_triton(q, k_cache, v_cache, bt, qsl, lens, 0.25, w[:, :16], acc)
    with pytest.raises(ValueError, match="acc must be"):
        attention_o_small_triton(q, k_cache, v_cache, bt, qsl, lens, 0.25, w, acc[:, :8])


def test_dispatch_falls_back_for_prefill_rows(device):
    # Two query rows of one sequence (a prefill chunk): the plain attention and the GEMV, same
    # contract (sums added, the other buffer zeroed).
    q, k_cache, v_cache, bt, qsl, lens = make_batch(device, torch.float32, [2], [20], 2, 1, 16, 16)
    w = torch.randn(24, 32, device=device) / 6
    acc, zero = torch.zeros(2, 24, device=device), torch.ones(2, 24, device=device)
    attention_o.attention_o_small(q, k_cache, v_cache, bt, qsl, lens, 0.25, 2, w, acc, zero)
    ref = F.linear(paged_attention_ref(q, k_cache, v_cache, bt, qsl, lens, 0.25).reshape(2, -1), w)
    torch.testing.assert_close(acc, ref, atol=1e-4, rtol=1e-4)
    assert torch.count_nonzero(zero) == 0


def test_gpu_qwen3_shape(gpu_device):
    acc, ref, attn, w = _run(gpu_device, torch.bfloat16, 300, 16, 8, 128, 16, 1024, None)
    bound = 1e-2 + 8e-3 * (attn.reshape(1, -1).float().abs() @ w.float().abs().t()) + 8e-3 * ref.abs()
    assert ((acc - ref).abs() <= bound).all()
