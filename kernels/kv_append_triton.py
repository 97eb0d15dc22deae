"""Triton fused KV append: scatter new K and V rows into the paged cache in one launch.

Owns: `kv_append_triton`, the GPU twin of `kv_append_ref` (same shapes, same in-place effect on
the caches and, for int8 caches, the scales; slot -1 marks a padded token that is skipped).
Must never read or write a cache slot for a padded token, and never allocate: it runs inside
CUDA graphs.

Two kernels, picked by the cache dtype on the host, so the float path carries no int8 code:
- `_kv_append_kernel`, grid (num_tokens, cdiv(num_kv_heads * head_dim, BLOCK)): each program
  copies one token's chunk of the flattened (head, dim) row for K and for V; the dtype cast
  happens at the store.
- `_kv_append_int8_kernel`, grid (num_tokens, cdiv(num_kv_heads, BLOCK_H)): each program
  quantizes whole (head, dim) rows of one token (a row's max is needed before any code), K and
  V, and writes codes plus one float32 scale per row (rule in `kernels/kv_append.py`).
To extend (e.g. an fp8 cache), add a kernel beside the int8 one; keep K and V in one program.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .kv_append import check_int8_scales


@triton.jit
def _kv_append_kernel(key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
                      head_dim, row_len, block_size,
                      sk_t, sk_h, sk_d, sv_t, sv_h, sv_d,
                      skc_b, skc_s, skc_h, skc_d, svc_b, svc_s, svc_h, svc_d,
                      BLOCK: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    # A padded token keeps every lane masked off: nothing is read or written for it.
    mask = (offs < row_len) & (slot >= 0)
    head = offs // head_dim
    dim = offs % head_dim
    blk = slot // block_size
    pos = slot % block_size
    k = tl.load(key_ptr + tok * sk_t + head * sk_h + dim * sk_d, mask=mask)
    v = tl.load(value_ptr + tok * sv_t + head * sv_h + dim * sv_d, mask=mask)
    # Pure copy (no arithmetic), so the dtype conversion happens only at the store.
    tl.store(k_cache_ptr + blk * skc_b + pos * skc_s + head * skc_h + dim * skc_d,
             k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + blk * svc_b + pos * svc_s + head * svc_h + dim * svc_d,
             v.to(v_cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _quantize_store(x, mask, cache_ptrs, scale_ptrs, row_mask):
    """Quantize float32 rows `x` [BLOCK_H, BLOCK_D] (masked lanes hold 0) to int8 codes and
    per-row scales, exactly as `quantize_int8_ref` (IEEE divisions, round half up)."""
    amax = tl.max(tl.abs(x), axis=1)
    nonzero = amax > 0
    inv = tl.div_rn(tl.full(amax.shape, 127.0, tl.float32), tl.where(nonzero, amax, 1.0))
    inv = tl.where(nonzero, inv, 0.0)
    codes = tl.floor(x * inv[:, None] + 0.5)
    codes = tl.minimum(tl.maximum(codes, -127.0), 127.0)
    tl.store(cache_ptrs, codes.to(tl.int8), mask=mask)
    tl.store(scale_ptrs, tl.div_rn(amax, tl.full(amax.shape, 127.0, tl.float32)), mask=row_mask)


@triton.jit
def _kv_append_int8_kernel(key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, ks_ptr, vs_ptr, slot_ptr,
                           num_kv_heads, head_dim, block_size,
                           sk_t, sk_h, sk_d, sv_t, sv_h, sv_d,
                           skc_b, skc_s, skc_h, skc_d, svc_b, svc_s, svc_h, svc_d,
                           sks_b, sks_h, sks_s, svs_b, svs_h, svs_s,
                           BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_D)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    # A padded token keeps every lane masked off: nothing is read or written for it.
    row_mask = (heads < num_kv_heads) & (slot >= 0)
    mask = row_mask[:, None] & (dims < head_dim)[None, :]
    blk = slot // block_size
    pos = slot % block_size
    k = tl.load(key_ptr + tok * sk_t + heads[:, None] * sk_h + dims[None, :] * sk_d,
                mask=mask, other=0.0).to(tl.float32)
    _quantize_store(k, mask,
                    k_cache_ptr + blk * skc_b + pos * skc_s + heads[:, None] * skc_h
                    + dims[None, :] * skc_d,
                    ks_ptr + blk * sks_b + heads * sks_h + pos * sks_s, row_mask)
    v = tl.load(value_ptr + tok * sv_t + heads[:, None] * sv_h + dims[None, :] * sv_d,
                mask=mask, other=0.0).to(tl.float32)
    _quantize_store(v, mask,
                    v_cache_ptr + blk * svc_b + pos * svc_s + heads[:, None] * svc_h
                    + dims[None, :] * svc_d,
                    vs_ptr + blk * svs_b + heads * svs_h + pos * svs_s, row_mask)


def kv_append_triton(key, value, k_cache, v_cache, slot_mapping, k_scale=None,
                     v_scale=None) -> None:
    if key.dim() != 3 or value.shape != key.shape:
        raise ValueError(f"key/value must both be [num_tokens, num_kv_heads, head_dim], got "
                         f"{tuple(key.shape)} and {tuple(value.shape)}")
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape or k_cache.shape[2:] != key.shape[1:]:
        raise ValueError(f"caches must be [num_blocks, block_size, {key.shape[1]}, {key.shape[2]}],"
                         f" got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    check_int8_scales(k_cache, k_scale, v_scale)
    num_tokens, num_kv_heads, head_dim = key.shape
    if slot_mapping.shape != (num_tokens,):
        raise ValueError(f"slot_mapping must be [{num_tokens}], got {tuple(slot_mapping.shape)}")
    if num_tokens == 0:
        return
    if k_cache.dtype == torch.int8:
        block_d = triton.next_power_of_2(head_dim)
        block_h = max(1, min(triton.next_power_of_2(num_kv_heads), 2048 // block_d))
        grid = (num_tokens, triton.cdiv(num_kv_heads, block_h))
        _kv_append_int8_kernel[grid](
            key, value, k_cache, v_cache, k_scale, v_scale, slot_mapping, num_kv_heads, head_dim,
            k_cache.shape[1], *key.stride(), *value.stride(), *k_cache.stride(),
            *v_cache.stride(), *k_scale.stride(), *v_scale.stride(),
            BLOCK_H=block_h, BLOCK_D=block_d, enable_fp_fusion=False)  # no FMA: codes as the ref
        return
    row_len = num_kv_heads * head_dim
    block = min(triton.next_power_of_2(row_len), 2048)
    grid = (num_tokens, triton.cdiv(row_len, block))
    _kv_append_kernel[grid](
        key, value, k_cache, v_cache, slot_mapping, head_dim, row_len, k_cache.shape[1],
        *key.stride(), *value.stride(), *k_cache.stride(), *v_cache.stride(), BLOCK=block)
