"""Triton attention input prep: q/k RMSNorm + rotary + KV cache append in one launch.

Owns: `qkv_prep_triton`, the GPU twin of `qkv_prep_ref` (contract in `kernels/qkv_prep.py`). It
reads the qkv projection output once, rotates q in place inside `qkv` and returns it as a strided
view `[n, num_heads, head_dim]` (the attention kernels take q's strides), and writes k and v
straight into the paged caches (k is never written back to `qkv`). Must never allocate, read
anything data-dependent on the host, or touch a cache slot of a padded token (slot -1): it runs
inside CUDA graphs.

Grid: (num_tokens, q_groups + kv_groups). A program owns BLOCK_H heads of one token: the first
q_groups programs of a token handle query heads, the rest KV heads (k and v of the same heads,
so an int8 row's max is known before any code is written). Tiles are whole rows
[BLOCK_H, BLOCK_D]; rotate-half pairs element d with d +- head_dim/2, which is loaded a second
time as the "partner" tile (an L1 hit) instead of splitting halves, so the norm's sum and the int8
row max see the full row in one tile and `_quantize_store` (kv_append_triton) is reused as is.

Numerics follow the unfused ops exactly: the norm rounds `x * rsqrt(mean(x^2) + eps)` to the
activation dtype, then `weight * h` again (rms_norm); cos/sin are rounded to the activation dtype
and the rotated values too (apply_rotary); int8 quantizes those rounded values (kv_append). The
kernel is compiled without FMA contraction, like the reference's separate torch ops and the int8
rule require. To extend (GPT-J interleaved rotary, partial rotary, fp8 cache), change `partner`/
the cos index in `_normed_rotated` or add a branch beside KV_INT8, and keep the reference in step.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .kv_append import check_int8_scales
from .kv_append_triton import _quantize_store
from .pdl import pdl_enabled, pdl_launch, pdl_release, pdl_wait
from .qkv_prep import _check_norms, split_qkv

_ACT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_TILE = 2048  # the most elements a program's tile holds: 16 heads x 128
_MIN_H = 4  # the fewest heads a program holds by default (fewer: many tiny programs)


@triton.jit
def _norm_weights(w_ptr, dims, partner, head_dim, HAS_NORM: tl.constexpr):
    """The q or k norm weight at `dims` and at their rotate-half partners (float32; zeros
    without HAS_NORM). Constant: loaded before the PDL wait."""
    if HAS_NORM:
        dmask = dims < head_dim
        w = tl.load(w_ptr + dims, mask=dmask, other=0.0).to(tl.float32)
        wp = tl.load(w_ptr + partner, mask=dmask, other=0.0).to(tl.float32)
    else:
        w = tl.zeros(dims.shape, tl.float32)
        wp = w
    return w, wp


@triton.jit
def _normed_rotated(row_ptr, heads, dims, partner, lo, mask, cos, sin, w, wp, head_dim, eps,
                    HAS_NORM: tl.constexpr):
    """float32 [BLOCK_H, BLOCK_D]: rows `heads` at `row_ptr`, normed (HAS_NORM, weights `w` at
    dims and `wp` at partners) and rotated, each step rounded to the activation dtype as the
    unfused kernels store it."""
    act = row_ptr.dtype.element_ty
    base = row_ptr + heads[:, None] * head_dim
    x = tl.load(base + dims[None, :], mask=mask, other=0.0).to(tl.float32)
    p = tl.load(base + partner[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_NORM:
        inv = tl.rsqrt(tl.sum(x * x, axis=1) / head_dim + eps)
        x = (w[None, :] * (x * inv[:, None]).to(act).to(tl.float32)).to(act).to(tl.float32)
        p = (wp[None, :] * (p * inv[:, None]).to(act).to(tl.float32)).to(act).to(tl.float32)
    out = tl.where(lo[None, :], x * cos[None, :] - p * sin[None, :],
                   x * cos[None, :] + p * sin[None, :])
    return tl.where(mask, out.to(act).to(tl.float32), 0.0)


@triton.jit
def _qkv_prep_kernel(qkv_ptr, pos_ptr, cos_ptr, sin_ptr, slot_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr,
                     qw_ptr, kw_ptr, num_heads, num_kv_heads, head_dim, block_size, q_groups, eps,
                     s_tok, s_cos, s_sin, skc_b, skc_s, skc_h, skc_d, svc_b, svc_s, svc_h, svc_d,
                     sks_b, sks_h, sks_s, svs_b, svs_h, svs_s,
                     HAS_NORM: tl.constexpr, KV_INT8: tl.constexpr,
                     BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = False):
    pdl_release(PDL)  # PDL: launched early, waits for the qkv projection (kernels/pdl.py)
    # Before the wait: only step inputs (positions, slots) and constants (cos/sin, norm weights).
    tok = tl.program_id(0).to(tl.int64)
    group = tl.program_id(1)
    act = qkv_ptr.dtype.element_ty
    half = head_dim // 2
    dims = tl.arange(0, BLOCK_D)
    dmask = dims < head_dim
    lo = dims < half
    partner = tl.where(lo, dims + half, dims - half)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    cs_idx = tl.where(lo, dims, dims - half)
    # Rounded to the activation dtype first, as apply_rotary (and HF) do; a no-op for float32.
    cos = tl.load(cos_ptr + pos * s_cos + cs_idx, mask=dmask, other=0.0).to(act).to(tl.float32)
    sin = tl.load(sin_ptr + pos * s_sin + cs_idx, mask=dmask, other=0.0).to(act).to(tl.float32)
    row = qkv_ptr + tok * s_tok
    is_q = group < q_groups
    w, wp = _norm_weights(tl.where(is_q, qw_ptr, kw_ptr), dims, partner, head_dim, HAS_NORM)
    slot = tl.load(slot_ptr + tok, mask=group >= q_groups, other=-1).to(tl.int64)
    pdl_wait(PDL)
    if is_q:
        heads = group * BLOCK_H + tl.arange(0, BLOCK_H)
        mask = (heads < num_heads)[:, None] & dmask[None, :]
        q = _normed_rotated(row, heads, dims, partner, lo, mask, cos, sin, w, wp, head_dim, eps,
                            HAS_NORM)
        tl.store(row + heads[:, None] * head_dim + dims[None, :], q.to(act), mask=mask)
    else:
        heads = (group - q_groups) * BLOCK_H + tl.arange(0, BLOCK_H)
        # A padded token keeps every lane masked off: nothing is read or written for it.
        row_mask = (heads < num_kv_heads) & (slot >= 0)
        mask = row_mask[:, None] & dmask[None, :]
        blk = slot // block_size
        off = slot % block_size
        k = _normed_rotated(row + num_heads * head_dim, heads, dims, partner, lo, mask, cos, sin,
                            w, wp, head_dim, eps, HAS_NORM)
        v = tl.load(row + (num_heads + num_kv_heads) * head_dim + heads[:, None] * head_dim
                    + dims[None, :], mask=mask, other=0.0)
        k_dst = kc_ptr + blk * skc_b + off * skc_s + heads[:, None] * skc_h + dims[None, :] * skc_d
        v_dst = vc_ptr + blk * svc_b + off * svc_s + heads[:, None] * svc_h + dims[None, :] * svc_d
        if KV_INT8:
            _quantize_store(k, mask, k_dst, ks_ptr + blk * sks_b + heads * sks_h + off * sks_s,
                            row_mask)
            _quantize_store(v.to(tl.float32), mask, v_dst,
                            vs_ptr + blk * svs_b + heads * svs_h + off * svs_s, row_mask)
        else:
            tl.store(k_dst, k.to(kc_ptr.dtype.element_ty), mask=mask)
            tl.store(v_dst, v.to(vc_ptr.dtype.element_ty), mask=mask)


def plan_groups(num_heads: int, num_kv_heads: int, head_dim: int, block_h: int | None = None):
    """(BLOCK_H, BLOCK_D, q_groups, kv_groups): heads per program, padded row length, and
    programs per token for q and for k/v. By default a program holds the KV heads' count
    (rounded up to a power of two, at least `_MIN_H`, at most `_TILE` elements), so the k/v
    program's tile is not half masked off where there are half as many KV heads as query heads.
    H200, 2026-12-01, `bench/qkv_prep.py --block-h` at the Qwen3-0.6B shape (16 / 8 heads),
    CUDA-graph replays, µs at 64 / 256 / 2,048 / 8,192 tokens, eight heads a program against
    sixteen: bf16 cache 1.63 / 2.43 / 12.40 / 59.29 against 1.75 / 2.98 / 12.64 / 61.25, int8
    cache 2.05 / 3.03 / 14.70 / 62.42 against 2.65 / 3.60 / 21.29 / 103.74 (four and two heads
    a program were slower from 256 tokens on)."""
    block_d = triton.next_power_of_2(head_dim)
    if block_h is None:
        block_h = max(1, min(max(_MIN_H, triton.next_power_of_2(num_kv_heads)), _TILE // block_d,
                             triton.next_power_of_2(max(num_heads, num_kv_heads))))
    if block_h < 1 or block_h & (block_h - 1):
        raise ValueError(f"block_h must be a power of two >= 1, got {block_h}")
    return block_h, block_d, triton.cdiv(num_heads, block_h), triton.cdiv(num_kv_heads, block_h)


def _check(qkv, positions, cos_cache, sin_cache, slot_mapping, k_cache, v_cache, q_norm_weight,
           k_norm_weight, num_kv_heads, head_dim):
    n = qkv.shape[0]
    if qkv.dtype not in _ACT_DTYPES:
        raise ValueError(f"unsupported dtype {qkv.dtype}; expected float32, float16 or bfloat16")
    if head_dim % 2:
        raise ValueError(f"head_dim must be even, got {head_dim}")
    _check_norms(q_norm_weight, k_norm_weight, head_dim)
    for name, w in (("q_norm_weight", q_norm_weight), ("k_norm_weight", k_norm_weight)):
        if w is not None and w.dtype != qkv.dtype:
            # The unfused norm would return weight.dtype x qkv.dtype promoted; the kernel rounds
            # to qkv's dtype, so mixed dtypes would silently differ.
            raise ValueError(f"{name} must have qkv's dtype {qkv.dtype}, got {w.dtype}")
    for name, t in (("positions", positions), ("slot_mapping", slot_mapping)):
        if tuple(t.shape) != (n,):
            raise ValueError(f"{name} must be [{n}], got {tuple(t.shape)}")
    half = head_dim // 2
    if cos_cache.dim() != 2 or cos_cache.shape[1] != half or sin_cache.shape != cos_cache.shape:
        raise ValueError(f"cos/sin caches must be [max_positions, {half}], got "
                         f"{tuple(cos_cache.shape)} and {tuple(sin_cache.shape)}")
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape \
            or tuple(k_cache.shape[2:]) != (num_kv_heads, head_dim):
        raise ValueError(f"caches must be [num_blocks, block_size, {num_kv_heads}, {head_dim}], "
                         f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")


def qkv_prep_triton(qkv, positions, cos_cache, sin_cache, slot_mapping, k_cache, v_cache,
                    q_norm_weight=None, k_norm_weight=None, eps=1e-6, k_scale=None, v_scale=None,
                    *, num_heads: int, num_kv_heads: int, head_dim: int, block_h=None):
    split_qkv(qkv, num_heads, num_kv_heads, head_dim)  # shape check
    _check(qkv, positions, cos_cache, sin_cache, slot_mapping, k_cache, v_cache, q_norm_weight,
           k_norm_weight, num_kv_heads, head_dim)
    check_int8_scales(k_cache, k_scale, v_scale)
    if qkv.stride(1) != 1:
        qkv = qkv.contiguous()  # not on the model's path: the projection output is contiguous
    q = split_qkv(qkv, num_heads, num_kv_heads, head_dim)[0]
    n = qkv.shape[0]
    if n == 0:
        return q
    cos_cache = cos_cache if cos_cache.stride(-1) == 1 else cos_cache.contiguous()
    sin_cache = sin_cache if sin_cache.stride(-1) == 1 else sin_cache.contiguous()
    block_h, block_d, q_groups, kv_groups = plan_groups(num_heads, num_kv_heads, head_dim, block_h)
    has_norm = q_norm_weight is not None
    kv_int8 = k_cache.dtype == torch.int8
    if kv_int8:
        scales, s_strides = (k_scale, v_scale), (*k_scale.stride(), *v_scale.stride())
    else:
        scales, s_strides = (k_cache, v_cache), (0,) * 6
    weights = (q_norm_weight.contiguous(), k_norm_weight.contiguous()) if has_norm else (qkv, qkv)
    pdl = pdl_enabled(qkv)
    _qkv_prep_kernel[(n, q_groups + kv_groups)](
        qkv, positions, cos_cache, sin_cache, slot_mapping, k_cache, v_cache, *scales, *weights,
        num_heads, num_kv_heads, head_dim, k_cache.shape[1], q_groups, eps,
        qkv.stride(0), cos_cache.stride(0), sin_cache.stride(0), *k_cache.stride(),
        *v_cache.stride(), *s_strides, HAS_NORM=has_norm, KV_INT8=kv_int8, BLOCK_H=block_h,
        BLOCK_D=block_d, PDL=pdl, num_warps=4 if block_h * block_d <= 2048 else 8,
        enable_fp_fusion=False, **pdl_launch(pdl))  # no FMA: rounding as the separate ops and the int8 rule
    return q
