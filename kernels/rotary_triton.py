"""Triton rotary embedding (neox / rotate-half layout), in place on q and k in one launch.

Owns: `apply_rotary_triton(q, k, positions, cos_cache, sin_cache)`, the GPU twin of
`apply_rotary_ref`. q `[num_tokens, num_heads, head_dim]` and k `[num_tokens, num_kv_heads,
head_dim]` may be strided views (e.g. slices of a fused qkv projection): every stride is passed to
the kernel, nothing is copied. Must never touch anything but q and k.

Grid: (num_tokens,). A program reads the token's cos/sin row once and rotates all of its q heads
and then all of its k heads as [heads, head_dim/2] tiles. Like the reference, cos/sin are rounded
to the activation dtype first when q is not float32 (HF does the same). To extend to the GPT-J
(interleaved) layout, add a constexpr switch in `_rotate_heads` on how the halves are addressed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_heads(ptr, tok, num_heads, s_t, s_h, s_d, half, cos, sin,
                  BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    heads = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_HALF)
    mask = (heads[:, None] < num_heads) & (dims[None, :] < half)
    base = ptr + tok * s_t + heads[:, None] * s_h + dims[None, :] * s_d
    x1 = tl.load(base, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(base + half * s_d, mask=mask, other=0.0).to(tl.float32)
    out1 = x1 * cos[None, :] - x2 * sin[None, :]
    out2 = x2 * cos[None, :] + x1 * sin[None, :]
    tl.store(base, out1.to(ptr.dtype.element_ty), mask=mask)
    tl.store(base + half * s_d, out2.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(q_ptr, k_ptr, pos_ptr, cos_ptr, sin_ptr, num_q_heads, num_k_heads, half,
                   sq_t, sq_h, sq_d, sk_t, sk_h, sk_d, s_cos, s_sin,
                   ROUND_CS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    dims = tl.arange(0, BLOCK_HALF)
    dmask = dims < half
    cos = tl.load(cos_ptr + pos * s_cos + dims, mask=dmask, other=0.0)
    sin = tl.load(sin_ptr + pos * s_sin + dims, mask=dmask, other=0.0)
    if ROUND_CS:
        # Match the reference/HF: cos/sin are cast to the activation dtype before multiplying.
        cos = cos.to(q_ptr.dtype.element_ty)
        sin = sin.to(q_ptr.dtype.element_ty)
    cos = cos.to(tl.float32)
    sin = sin.to(tl.float32)
    _rotate_heads(q_ptr, tok, num_q_heads, sq_t, sq_h, sq_d, half, cos, sin, BLOCK_H, BLOCK_HALF)
    _rotate_heads(k_ptr, tok, num_k_heads, sk_t, sk_h, sk_d, half, cos, sin, BLOCK_H, BLOCK_HALF)


def apply_rotary_triton(q, k, positions, cos_cache, sin_cache) -> None:
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(f"q/k must be [num_tokens, heads, head_dim] with matching tokens and "
                         f"head_dim, got {tuple(q.shape)} and {tuple(k.shape)}")
    num_tokens, num_q_heads, head_dim = q.shape
    if head_dim % 2:
        raise ValueError(f"head_dim must be even, got {head_dim}")
    half = head_dim // 2
    if positions.shape != (num_tokens,):
        raise ValueError(f"positions must be [{num_tokens}], got {tuple(positions.shape)}")
    if cos_cache.dim() != 2 or cos_cache.shape[1] != half or sin_cache.shape != cos_cache.shape:
        raise ValueError(f"cos/sin caches must be [max_positions, {half}], got "
                         f"{tuple(cos_cache.shape)} and {tuple(sin_cache.shape)}")
    if num_tokens == 0:
        return
    # The kernel indexes cos/sin rows by stride but assumes unit stride inside a row.
    cos_cache = cos_cache if cos_cache.stride(-1) == 1 else cos_cache.contiguous()
    sin_cache = sin_cache if sin_cache.stride(-1) == 1 else sin_cache.contiguous()
    block_h = triton.next_power_of_2(max(num_q_heads, k.shape[1]))
    block_half = triton.next_power_of_2(half)
    _rotary_kernel[(num_tokens,)](
        q, k, positions, cos_cache, sin_cache, num_q_heads, k.shape[1], half,
        *q.stride(), *k.stride(), cos_cache.stride(0), sin_cache.stride(0),
        ROUND_CS=q.dtype != torch.float32, BLOCK_H=block_h, BLOCK_HALF=block_half,
        num_warps=4 if block_h * block_half <= 2048 else 8)
