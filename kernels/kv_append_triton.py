"""Triton fused KV append: scatter new K and V rows into the paged cache in one launch.

Owns: `kv_append_triton`, the GPU twin of `kv_append_ref` (same shapes, same in-place effect on
the caches; slot -1 marks a padded token that is skipped). Must never read or write a cache slot
for a padded token, and never allocate: it runs inside CUDA graphs.

Grid: (num_tokens, cdiv(num_kv_heads * head_dim, BLOCK)). Each program copies one token's chunk of
the flattened (head, dim) row for K and for V, so one launch covers both caches. To extend (e.g.
an fp8 cache with a scale), add the conversion at the store; keep K and V in the same program.
"""

from __future__ import annotations

import triton
import triton.language as tl


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


def kv_append_triton(key, value, k_cache, v_cache, slot_mapping) -> None:
    if key.dim() != 3 or value.shape != key.shape:
        raise ValueError(f"key/value must both be [num_tokens, num_kv_heads, head_dim], got "
                         f"{tuple(key.shape)} and {tuple(value.shape)}")
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape or k_cache.shape[2:] != key.shape[1:]:
        raise ValueError(f"caches must be [num_blocks, block_size, {key.shape[1]}, {key.shape[2]}],"
                         f" got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    num_tokens, num_kv_heads, head_dim = key.shape
    if slot_mapping.shape != (num_tokens,):
        raise ValueError(f"slot_mapping must be [{num_tokens}], got {tuple(slot_mapping.shape)}")
    if num_tokens == 0:
        return
    row_len = num_kv_heads * head_dim
    block = min(triton.next_power_of_2(row_len), 2048)
    grid = (num_tokens, triton.cdiv(row_len, block))
    _kv_append_kernel[grid](
        key, value, k_cache, v_cache, slot_mapping, head_dim, row_len, k_cache.shape[1],
        *key.stride(), *value.stride(), *k_cache.stride(), *v_cache.stride(), BLOCK=block)
