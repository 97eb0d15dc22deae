"""Triton KV append vs `kv_append_ref`: scatter by slot, padding skipped, caches in place."""

import pytest
import torch

from infer_cluster.kernels.kv_append import dequantize_int8_ref, kv_append_ref, quantize_int8_ref
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


def _assert_int8_close(got: torch.Tensor, ref: torch.Tensor) -> None:
    """Exact off CUDA; on CUDA scales within 4 ulp and codes within one step."""
    if got.device.type != "cuda":
        torch.testing.assert_close(got, ref, atol=0, rtol=0)
    elif got.dtype == torch.int8:
        assert (got.int() - ref.int()).abs().max().item() <= 1
    else:
        torch.testing.assert_close(got, ref, atol=0, rtol=5e-7)


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


# -- int8 caches: quantize on write ------------------------------------------------------------

def _int8_case(device, dtype, num_tokens, num_kv_heads, head_dim, block_size, num_blocks,
               pad_every):
    key, value, _, _, slots = _case(device, dtype, num_tokens, num_kv_heads, head_dim,
                                    block_size, num_blocks, pad_every)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    # Junk everywhere, so a skipped slot or a stray write shows.
    k_cache = torch.randint(-128, 128, shape, device=device, dtype=torch.int8)
    v_cache = torch.randint(-128, 128, shape, device=device, dtype=torch.int8)
    k_scale = torch.rand(num_blocks, num_kv_heads, block_size, device=device) + 5.0
    v_scale = torch.rand_like(k_scale) + 5.0
    return key, value, k_cache, v_cache, k_scale, v_scale, slots


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens,num_kv_heads,head_dim,block_size,pad_every", [
    (1, 1, 32, 16, 0),
    (7, 2, 64, 16, 3),
    (33, 8, 128, 32, 5),
    (5, 3, 80, 16, 1),        # every token padded: nothing may change
    (6, 40, 64, 16, 4),       # more heads than one program takes (2048 // 64 = 32)
])
def test_kv_append_int8_matches_ref(device, dtype, num_tokens, num_kv_heads, head_dim,
                                    block_size, pad_every):
    case = _int8_case(device, dtype, num_tokens, num_kv_heads, head_dim, block_size, 6, pad_every)
    key, value, *caches, slots = case
    before = [c.clone() for c in caches]
    refs = [c.clone() for c in caches]
    kv_append_ref(key, value, refs[0], refs[1], slots, refs[2], refs[3])
    kv_append_triton(key, value, caches[0], caches[1], slots, caches[2], caches[3])
    # Same rule, same float32 ops (IEEE divisions, no FMA): codes and scales are exact in the
    # interpreter. On CUDA, Triton's float32 division is correct to 2 ulp, not rounded to
    # nearest: scales may differ in the last bits, and a code on a .5 boundary by one step.
    for got, ref, old in zip(caches, refs, before):
        _assert_int8_close(got, ref)
        assert torch.equal(got, old) == (pad_every == 1)


def test_quantize_int8_rule():
    x = torch.tensor([[[1.0, -2.0, 0.5, 0.0]], [[0.0, 0.0, 0.0, 0.0]], [[-3.0, 3.0, 1.5, -1.5]]])
    codes, scale = quantize_int8_ref(x)
    assert codes.dtype == torch.int8 and scale.dtype == torch.float32
    assert codes[0, 0].tolist() == [64, -127, 32, 0]       # 63.5 rounds half up to 64
    assert codes[1, 0].tolist() == [0, 0, 0, 0] and scale[1, 0] == 0   # all-zero row
    assert codes[2, 0].tolist() == [-127, 127, 64, -63]    # -63.5 rounds half up to -63
    torch.testing.assert_close(scale[:, 0], torch.tensor([2 / 127, 0.0, 3 / 127]))
    # Round trip within half a step per element.
    err = (dequantize_int8_ref(codes, scale) - x).abs()
    assert (err <= scale[..., None] / 2 + 1e-7).all()


def test_kv_append_int8_strided_bf16_inputs(device):
    # K and V as slices of a fused bf16 qkv row; an all-zero token row gets scale 0.
    num_tokens, heads, dim = 5, 2, 32
    qkv = torch.randn(num_tokens, 3 * heads * dim, device=device).to(torch.bfloat16)
    qkv[3] = 0
    key = qkv[:, heads * dim:2 * heads * dim].view(num_tokens, heads, dim)
    value = qkv[:, 2 * heads * dim:].view(num_tokens, heads, dim)
    slots = torch.tensor([0, 17, -1, 3, 31], device=device, dtype=torch.int64)
    k_cache = torch.zeros(2, 16, heads, dim, device=device, dtype=torch.int8)
    v_cache = torch.zeros_like(k_cache)
    k_scale = torch.full((2, heads, 16), -1.0, device=device)
    v_scale = k_scale.clone()
    refs = [t.clone() for t in (k_cache, v_cache, k_scale, v_scale)]
    kv_append_ref(key, value, refs[0], refs[1], slots, refs[2], refs[3])
    kv_append_triton(key, value, k_cache, v_cache, slots, k_scale, v_scale)
    for got, ref in zip((k_cache, v_cache, k_scale, v_scale), refs):
        _assert_int8_close(got, ref)
    assert (k_scale[0, :, 3] == 0).all() and (k_cache[0, 3] == 0).all()   # the zero row
    assert (k_scale[0, :, 2] == -1).all()                                  # never named
    back = dequantize_int8_ref(k_cache.view(32, heads, dim)[[0, 17]],
                               k_scale.transpose(1, 2).reshape(32, heads)[[0, 17]])
    torch.testing.assert_close(back, key[[0, 1]].float(), atol=0.03, rtol=0.02)


def test_kv_append_int8_needs_scales():
    key = torch.zeros(2, 1, 16)
    cache = torch.zeros(1, 16, 1, 16, dtype=torch.int8)
    slots = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(ValueError, match="k_scale"):
        kv_append_triton(key, key, cache, cache, slots)
    with pytest.raises(ValueError, match="k_scale"):
        kv_append_ref(key, key, cache, cache, slots, torch.zeros(1, 16, 1), torch.zeros(1, 16, 1))
    with pytest.raises(ValueError, match="only for int8"):
        kv_append_ref(key, key, cache.float(), cache.float(), slots, torch.zeros(1, 1, 16),
                      torch.zeros(1, 1, 16))
