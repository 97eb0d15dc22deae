"""Rotary position embedding (neox / rotate-half layout), applied in place by position.

`apply_rotary(q, k, positions, cos_cache, sin_cache)`: q `[num_tokens, num_heads, head_dim]`,
k `[num_tokens, num_kv_heads, head_dim]`, positions `[num_tokens]` int, caches
`[max_positions, head_dim // 2]` float32 (built once by `build_rope_cache`). Rotates the first
and second halves of each head: `x1' = x1*c - x2*s`, `x2' = x2*c + x1*s`, as HF transformers'
`rotate_half` does. Triton kernel beside it.
"""

from __future__ import annotations

import torch

from .dispatch import use_triton


def build_rope_cache(inv_freq: torch.Tensor, max_positions: int):
    """cos/sin tables `[max_positions, head_dim // 2]` in float32, the same products HF forms."""
    pos = torch.arange(max_positions, dtype=torch.float32, device=inv_freq.device)
    freqs = pos[:, None] * inv_freq.float()[None, :]
    return freqs.cos(), freqs.sin()


def _rotate_ref(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    c, s = cos[:, None, :], sin[:, None, :]
    # Both halves are computed before either is written: for float32 `.float()` is a view of x.
    out1 = (x1 * c - x2 * s).to(x.dtype)
    out2 = (x2 * c + x1 * s).to(x.dtype)
    x[..., :half] = out1
    x[..., half:] = out2


def apply_rotary_ref(q, k, positions, cos_cache, sin_cache) -> None:
    cos = cos_cache[positions.long()]
    sin = sin_cache[positions.long()]
    if q.dtype != torch.float32:
        # HF casts cos/sin to the activation dtype before multiplying.
        cos, sin = cos.to(q.dtype).float(), sin.to(q.dtype).float()
    _rotate_ref(q, cos, sin)
    _rotate_ref(k, cos, sin)


def apply_rotary(q, k, positions, cos_cache, sin_cache) -> None:
    if use_triton(q):
        from .rotary_triton import apply_rotary_triton
        return apply_rotary_triton(q, k, positions, cos_cache, sin_cache)
    return apply_rotary_ref(q, k, positions, cos_cache, sin_cache)
