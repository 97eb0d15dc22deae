"""Triton rotary embedding vs `apply_rotary_ref`, in place, including strided q/k views."""

import pytest
import torch

from infer_cluster.kernels.rotary import apply_rotary_ref, build_rope_cache
from infer_cluster.kernels.rotary_triton import apply_rotary_triton
from tests.kernels.conftest import tol


def _rope(device, head_dim, max_pos=512):
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
    return build_rope_cache(inv_freq, max_pos)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens,num_heads,num_kv_heads,head_dim", [
    (1, 2, 1, 32), (7, 4, 2, 64), (33, 16, 8, 128), (5, 3, 3, 80)])
def test_rotary_matches_ref(device, dtype, num_tokens, num_heads, num_kv_heads, head_dim):
    cos, sin = _rope(device, head_dim)
    q = torch.randn(num_tokens, num_heads, head_dim, device=device, dtype=dtype)
    k = torch.randn(num_tokens, num_kv_heads, head_dim, device=device, dtype=dtype)
    positions = torch.randint(0, 512, (num_tokens,), device=device)
    q_ref, k_ref = q.clone(), k.clone()
    apply_rotary_ref(q_ref, k_ref, positions, cos, sin)
    q_in = q.clone()
    apply_rotary_triton(q, k, positions, cos, sin)
    atol, rtol = tol(dtype)
    torch.testing.assert_close(q, q_ref, atol=atol, rtol=rtol)
    torch.testing.assert_close(k, k_ref, atol=atol, rtol=rtol)
    if num_tokens > 1:
        assert not torch.equal(q, q_in)  # it really rotated in place


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_on_fused_qkv_views(device, dtype):
    # The model slices q and k out of one qkv projection; v must stay untouched.
    n, heads, kv_heads, dim = 9, 4, 2, 64
    q_size, kv_size = heads * dim, kv_heads * dim
    qkv = torch.randn(n, q_size + 2 * kv_size, device=device, dtype=dtype)
    ref = qkv.clone()
    cos, sin = _rope(device, dim)
    positions = torch.arange(100, 100 + n, device=device, dtype=torch.int32)
    apply_rotary_ref(ref[:, :q_size].view(n, heads, dim),
                     ref[:, q_size:q_size + kv_size].view(n, kv_heads, dim), positions, cos, sin)
    apply_rotary_triton(qkv[:, :q_size].view(n, heads, dim),
                        qkv[:, q_size:q_size + kv_size].view(n, kv_heads, dim), positions, cos, sin)
    atol, rtol = tol(dtype)
    torch.testing.assert_close(qkv, ref, atol=atol, rtol=rtol)
    assert torch.equal(qkv[:, q_size + kv_size:], ref[:, q_size + kv_size:])


def test_rotary_rejects_odd_head_dim():
    q = torch.zeros(2, 1, 7)
    with pytest.raises(ValueError, match="even"):
        apply_rotary_triton(q, q.clone(), torch.zeros(2, dtype=torch.long), torch.zeros(4, 3),
                            torch.zeros(4, 3))


def test_rotary_ref_float32_matches_rotate_half_formula():
    # Guards the reference itself: in float32 `.float()` is a view, so writing the first half
    # before computing the second would corrupt it.
    cos, sin = _rope("cpu", 16)
    x = torch.randn(3, 2, 16)
    positions = torch.tensor([0, 5, 9])
    c, s = cos[positions][:, None, :], sin[positions][:, None, :]
    x1, x2 = x[..., :8], x[..., 8:]
    expected = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)
    q, k = x.clone(), x.clone()
    apply_rotary_ref(q, k, positions, cos, sin)
    torch.testing.assert_close(q, expected)
    torch.testing.assert_close(k, expected)
