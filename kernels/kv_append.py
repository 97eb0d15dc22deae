"""Fused KV append: scatter new K and V rows into the paged cache by slot mapping.

Shapes: key/value `[num_tokens, num_kv_heads, head_dim]`; caches
`[num_blocks, block_size, num_kv_heads, head_dim]`; `slot_mapping[i]` = block_id * block_size +
offset, or -1 for a padded token (skipped). Reference here; the Triton kernel lives beside it.

int8 caches (`kv_cache_dtype="int8"`): each (token, KV head) row of K and of V is quantized
symmetrically on write, `scale = max|x| / 127`, `code = clamp(floor(x * (127 / max|x|) + 0.5),
-127, 127)` (an all-zero row gets scale 0 and codes 0), and the float32 scale is stored in
`k_scale`/`v_scale` `[num_blocks, num_kv_heads, block_size]` (per-head scales of one page are
contiguous, which is how the attention kernels read them). Readers dequantize as
`code * scale`. `quantize_int8_ref` is that rule, shared by the reference and the tests.
"""

from __future__ import annotations

import torch

from .dispatch import use_triton


def quantize_int8_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8 over the last dim: returns (codes int8, scale float32 [...])."""
    x = x.float()
    amax = x.abs().amax(dim=-1)
    # A tensor numerator: `127.0 / amax` would be reciprocal-then-multiply in torch (not IEEE).
    inv = torch.where(amax > 0, amax.new_tensor(127.0) / amax, torch.zeros_like(amax))
    codes = torch.floor(x * inv[..., None] + 0.5).clamp_(-127, 127).to(torch.int8)
    return codes, amax / 127.0


def dequantize_int8_ref(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 values of int8 codes `[..., D]` with per-row scales `[...]`."""
    return codes.float() * scale[..., None]


def check_int8_scales(k_cache, k_scale, v_scale) -> None:
    """int8 caches need both scale tensors, float32 `[num_blocks, num_kv_heads, block_size]`;
    float caches take none."""
    if k_cache.dtype != torch.int8:
        if k_scale is not None or v_scale is not None:
            raise ValueError(f"k_scale/v_scale are only for int8 caches, not {k_cache.dtype}")
        return
    want = (k_cache.shape[0], k_cache.shape[2], k_cache.shape[1])
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        if s is None or s.dtype != torch.float32 or tuple(s.shape) != want:
            got = None if s is None else f"{s.dtype} {tuple(s.shape)}"
            raise ValueError(f"an int8 KV cache needs {name} float32 {want} "
                             f"[num_blocks, num_kv_heads, block_size], got {got}")


def kv_append_ref(key, value, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None) -> None:
    check_int8_scales(k_cache, k_scale, v_scale)
    num_blocks, block_size = k_cache.shape[:2]
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    if k_cache.dtype == torch.int8:
        blk, pos = slots // block_size, slots % block_size
        for x, cache, scale in ((key, k_cache, k_scale), (value, v_cache, v_scale)):
            codes, s = quantize_int8_ref(x[valid])
            cache[blk, pos] = codes
            scale[blk, :, pos] = s
        return
    k_cache.view(num_blocks * block_size, *k_cache.shape[2:])[slots] = key[valid].to(k_cache.dtype)
    v_cache.view(num_blocks * block_size, *v_cache.shape[2:])[slots] = value[valid].to(v_cache.dtype)


def kv_append(key, value, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None) -> None:
    if use_triton(key):
        from .kv_append_triton import kv_append_triton
        return kv_append_triton(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    return kv_append_ref(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)
