"""Triton KV append vs `kv_append_ref`: scatter by slot, padding skipped, caches in place."""

import pytest
import torch

from infer_cluster.kernels.kv_append import kv_append_ref
from infer_cluster.kernels.kv_append_triton import kv_append_triton
from tests.kernels.conftest import tol


def _case(device, dtype, num_tokens, num_kv_heads, head_dim, block_size, num_blocks, pad_every):
    key = torch.randn(num_tokens, num_kv_heads, head_dim, device=device, dtype=dtype)
    value = torch.randn_like(key)
    slots = torch.randperm(num_blocks * block_size, device=device)[:num_tokens].to(torch.int32)
    if pad_every:
        slots[::pad_every] = -1
    # Caches start from random junk so that skipped slots are detectably untouched.
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, device=device,
                          dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    return key, value, k_cache, v_cache, slots


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens,num_kv_heads,head_dim,block_size,pad_every", [
    (1, 1, 32, 16, 0),
    (7, 2, 64, 16, 3),
    (33, 8, 128, 32, 5),
    (5, 3, 80, 16, 1),        # every token padded: nothing may change
])
def test_kv_append_matches_ref(device, dtype, num_tokens, num_kv_heads, head_dim, block_size,
                               pad_every):
    key, value, k_cache, v_cache, slots = _case(device, dtype, num_tokens, num_kv_heads, head_dim,
                                                block_size, 6, pad_every)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    kv_append_ref(key, value, k_ref, v_ref, slots)
    kv_append_triton(key, value, k_cache, v_cache, slots)
    # A copy must be exact.
    torch.testing.assert_close(k_cache, k_ref, atol=0, rtol=0)
    torch.testing.assert_close(v_cache, v_ref, atol=0, rtol=0)


def test_kv_append_strided_inputs_and_dtype_cast(device):
    # K and V as slices of a fused qkv row, and a bf16 cache fed float32 rows.
    num_tokens, heads, dim = 9, 2, 32
    qkv = torch.randn(num_tokens, 3 * heads * dim, device=device)
    key = qkv[:, heads * dim:2 * heads * dim].view(num_tokens, heads, dim)
    value = qkv[:, 2 * heads * dim:].view(num_tokens, heads, dim)
    slots = torch.tensor([0, 17, -1, 3, 31, 16, -1, 8, 9], device=device, dtype=torch.int64)
    k_cache = torch.zeros(2, 16, heads, dim, device=device, dtype=torch.bfloat16)
    v_cache = torch.zeros_like(k_cache)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    kv_append_ref(key, value, k_ref, v_ref, slots)
    kv_append_triton(key, value, k_cache, v_cache, slots)
    # float32 -> bf16 may differ by one bf16 ulp: Triton's interpreter truncates, torch rounds.
    atol, rtol = tol(torch.bfloat16)
    torch.testing.assert_close(k_cache, k_ref, atol=atol, rtol=rtol)
    torch.testing.assert_close(v_cache, v_ref, atol=atol, rtol=rtol)
    assert (k_cache.view(32, heads, dim)[[2, 4, 5, 6]] == 0).all()  # slots never named stay zero
    assert k_cache.abs().sum() > 0


def test_kv_append_rejects_bad_slot_mapping():
    key = torch.zeros(3, 1, 16)
    cache = torch.zeros(1, 16, 1, 16)
    with pytest.raises(ValueError, match="slot_mapping"):
        kv_append_triton(key, key, cache, cache, torch.zeros(4, dtype=torch.int32))
