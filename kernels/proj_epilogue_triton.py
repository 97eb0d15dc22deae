"""Triton projections with their next op in the epilogue, for decode batches of 17-256 rows.

Owns: `qkv_proj_prep_triton` (the qkv projection with `qkv_prep` in its epilogue: q/k RMSNorm,
rotary, the KV append) and `gate_up_silu_triton` (the gate/up projection with SiLU-and-mul in its
epilogue). Each replaces a cuBLAS GEMM and the kernel after it by one launch that never writes the
projection's output: the qkv kernel returns q and writes k and v straight into the paged caches;
the MLP kernel returns `silu(gate) * up`.

One program owns BLOCK_M rows and a pair of column blocks of W `[N, K]`, kept in two float32
accumulators: for qkv the two halves of one head (the rotate-half pairs: element d with d + D/2),
for the MLP `gate[j]` and `up[j]` (rows j and inter + j of W). So every epilogue sees whole heads
(the q/k norm's sum, an int8 row's max) and whole gate/up pairs without leaving registers. Under
PDL the first K step of W (constant) is loaded before the wait for the previous kernel.

Numerics: the accumulators are rounded to the activation dtype first (the unfused path stores
the GEMM's output), then every step rounds as `qkv_prep_triton` and `silu_and_mul_triton` do;
compiled without FMA contraction, as they are. Only the GEMM's float32 summation order differs
from cuBLAS.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .kv_append import check_int8_scales
from .pdl import pdl_enabled, pdl_launch, pdl_release, pdl_wait

EPI_QKV, EPI_SILU = 0, 1


@triton.jit
def _mm(x, w, acc, LOWP: tl.constexpr):
    """acc + x @ w.T: native 16-bit dots on CUDA, IEEE float32 otherwise (float32 models and the
    CPU interpreter, whose 16-bit dots are not usable)."""
    if LOWP:
        return tl.dot(x, tl.trans(w), acc)
    return tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")


@triton.jit
def _quantize_halves(lo, hi, mask, lo_ptrs, hi_ptrs, scale_ptrs, row_mask):
    """int8 codes and per-row scales of rows split in two halves, as `_quantize_store` does for
    whole rows (IEEE divisions, round half up)."""
    amax = tl.maximum(tl.max(tl.abs(lo), axis=1), tl.max(tl.abs(hi), axis=1))
    nonzero = amax > 0
    inv = tl.div_rn(tl.full(amax.shape, 127.0, tl.float32), tl.where(nonzero, amax, 1.0))
    inv = tl.where(nonzero, inv, 0.0)
    c_lo = tl.minimum(tl.maximum(tl.floor(lo * inv[:, None] + 0.5), -127.0), 127.0)
    c_hi = tl.minimum(tl.maximum(tl.floor(hi * inv[:, None] + 0.5), -127.0), 127.0)
    tl.store(lo_ptrs, c_lo.to(tl.int8), mask=mask)
    tl.store(hi_ptrs, c_hi.to(tl.int8), mask=mask)
    tl.store(scale_ptrs, tl.div_rn(amax, tl.full(amax.shape, 127.0, tl.float32)), mask=row_mask)


@triton.jit
def _proj_epilogue_kernel(
        x_ptr, w_ptr, out_ptr, M, K, sx_m, sw_n, so_m, r0_stride, r1_base,
        pos_ptr, cos_ptr, sin_ptr, slot_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, qw_ptr, kw_ptr,
        num_heads, num_kv_heads, block_size, eps, s_cos, s_sin,
        skc_b, skc_s, skc_h, svc_b, svc_s, svc_h, sks_b, sks_h, sks_s, svs_b, svs_h, svs_s,
        EPI: tl.constexpr, HAS_NORM: tl.constexpr, KV_INT8: tl.constexpr,
        BLOCK_M: tl.constexpr, HALF: tl.constexpr, BLOCK_K: tl.constexpr, LOWP: tl.constexpr,
        PDL: tl.constexpr = False):
    pdl_release(PDL)
    pid_m = tl.program_id(0)
    blk = tl.program_id(1)
    act = x_ptr.dtype.element_ty
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < M
    cols = tl.arange(0, HALF)
    ks = tl.arange(0, BLOCK_K)
    # W rows of the two accumulators: qkv: head `blk`'s halves; MLP: gate and up rows of block j.
    w0_rows = blk.to(tl.int64) * r0_stride + cols
    w1_rows = w0_rows + r1_base
    w0_ptrs = w_ptr + w0_rows[:, None] * sw_n + ks[None, :]
    w1_ptrs = w_ptr + w1_rows[:, None] * sw_n + ks[None, :]
    x_ptrs = x_ptr + rows[:, None].to(tl.int64) * sx_m + ks[None, :]
    # W never changes: its first K step is in flight while the previous kernel drains.
    w0 = tl.load(w0_ptrs)
    w1 = tl.load(w1_ptrs)
    pdl_wait(PDL)
    x = tl.load(x_ptrs, mask=rmask[:, None], other=0.0)
    acc0 = _mm(x, w0, tl.zeros((BLOCK_M, HALF), tl.float32), LOWP)
    acc1 = _mm(x, w1, tl.zeros((BLOCK_M, HALF), tl.float32), LOWP)
    for k in range(BLOCK_K, K, BLOCK_K):
        x = tl.load(x_ptrs + k, mask=rmask[:, None], other=0.0)
        acc0 = _mm(x, tl.load(w0_ptrs + k), acc0, LOWP)
        acc1 = _mm(x, tl.load(w1_ptrs + k), acc1, LOWP)
    # The unfused path stores the projection in the activation dtype: round as it would.
    a0 = acc0.to(act).to(tl.float32)
    a1 = acc1.to(act).to(tl.float32)
    mask = rmask[:, None]
    if EPI == 1:
        # silu(gate) rounded before the multiply, as silu_and_mul_triton.
        g = (a0 / (1.0 + tl.exp(-a0))).to(act).to(tl.float32)
        out_cols = blk * HALF + cols
        tl.store(out_ptr + rows[:, None].to(tl.int64) * so_m + out_cols[None, :],
                 (g * a1).to(out_ptr.dtype.element_ty), mask=mask)
    else:
        head_dim = 2 * HALF
        is_v = blk >= num_heads + num_kv_heads
        if not is_v:
            pos = tl.load(pos_ptr + rows, mask=rmask, other=0).to(tl.int64)
            cos = tl.load(cos_ptr + pos[:, None] * s_cos + cols[None, :], mask=mask,
                          other=0.0).to(act).to(tl.float32)
            sin = tl.load(sin_ptr + pos[:, None] * s_sin + cols[None, :], mask=mask,
                          other=0.0).to(act).to(tl.float32)
            if HAS_NORM:
                nw_ptr = tl.where(blk < num_heads, qw_ptr, kw_ptr)
                w_lo = tl.load(nw_ptr + cols).to(tl.float32)
                w_hi = tl.load(nw_ptr + HALF + cols).to(tl.float32)
                inv = tl.rsqrt((tl.sum(a0 * a0, axis=1) + tl.sum(a1 * a1, axis=1)) / head_dim
                               + eps)
                a0 = (w_lo[None, :] * (a0 * inv[:, None]).to(act).to(tl.float32)).to(act)
                a1 = (w_hi[None, :] * (a1 * inv[:, None]).to(act).to(tl.float32)).to(act)
                a0 = a0.to(tl.float32)
                a1 = a1.to(tl.float32)
            lo = (a0 * cos - a1 * sin).to(act).to(tl.float32)
            hi = (a1 * cos + a0 * sin).to(act).to(tl.float32)
        else:
            lo = a0
            hi = a1
        if blk < num_heads:
            q_ptrs = out_ptr + rows[:, None].to(tl.int64) * so_m + blk * head_dim + cols[None, :]
            tl.store(q_ptrs, lo.to(act), mask=mask)
            tl.store(q_ptrs + HALF, hi.to(act), mask=mask)
        else:
            slot = tl.load(slot_ptr + rows, mask=rmask, other=-1).to(tl.int64)
            row_mask = rmask & (slot >= 0)  # a padded token (slot -1) writes nothing
            smask = row_mask[:, None]
            bk = slot // block_size
            off = slot % block_size
            if is_v:
                h = blk - num_heads - num_kv_heads
                dst = vc_ptr + bk[:, None] * svc_b + off[:, None] * svc_s + h * svc_h + cols[None, :]
                sc = vs_ptr + bk * svs_b + h * svs_h + off * svs_s
            else:
                h = blk - num_heads
                dst = kc_ptr + bk[:, None] * skc_b + off[:, None] * skc_s + h * skc_h + cols[None, :]
                sc = ks_ptr + bk * sks_b + h * sks_h + off * sks_s
            if KV_INT8:
                _quantize_halves(lo, hi, smask, dst, dst + HALF, sc, row_mask)
            else:
                tl.store(dst, lo.to(kc_ptr.dtype.element_ty), mask=smask)
                tl.store(dst + HALF, hi.to(kc_ptr.dtype.element_ty), mask=smask)


def _launch(x, w, out, epi, blocks, r0_stride, r1_base, cfg, qkv_args=None):
    block_m, block_k, warps, stages = cfg
    m, k = x.shape
    if k % block_k:
        raise ValueError(f"K = {k} must be a multiple of block_k = {block_k}")
    pdl = pdl_enabled(x)
    if qkv_args is None:
        dummy = x
        qkv_args = (dummy,) * 10 + (0, 0, 0, 0.0, 0, 0) + (0,) * 12
        flags = dict(HAS_NORM=False, KV_INT8=False)
    else:
        qkv_args, flags = qkv_args
    half = (w.shape[0] // blocks) // 2 if epi == EPI_QKV else r0_stride
    grid = (triton.cdiv(m, block_m), blocks)
    _proj_epilogue_kernel[grid](
        x, w, out, m, k, x.stride(0), w.stride(0), out.stride(0), r0_stride, r1_base,
        *qkv_args, EPI=epi, BLOCK_M=block_m, HALF=half, BLOCK_K=block_k, PDL=pdl,
        LOWP=x.is_cuda and x.dtype in (torch.float16, torch.bfloat16),
        num_warps=warps, num_stages=stages, enable_fp_fusion=False, **pdl_launch(pdl), **flags)
    return out


def gate_up_silu_triton(x, w, cfg=(32, 64, 4, 4), block_n=64):
    """`silu(x @ w[:inter].T) * (x @ w[inter:].T)` for w `[2 * inter, K]`."""
    inter = w.shape[0] // 2
    if inter % block_n:
        raise ValueError(f"intermediate size {inter} must be a multiple of block_n = {block_n}")
    x = x if x.stride(-1) == 1 else x.contiguous()
    out = torch.empty(x.shape[0], inter, dtype=x.dtype, device=x.device)
    if x.shape[0] == 0:
        return out
    return _launch(x, w, out, EPI_SILU, inter // block_n, block_n, inter, cfg)


def qkv_proj_prep_triton(x, w, positions, cos_cache, sin_cache, slot_mapping, k_cache, v_cache,
                         q_norm_weight=None, k_norm_weight=None, eps=1e-6, k_scale=None,
                         v_scale=None, *, num_heads: int, num_kv_heads: int, head_dim: int,
                         cfg=(32, 64, 4, 4)):
    """`qkv_prep(x @ w.T, ...)`: returns q `[n, num_heads, head_dim]` and writes k, v into the
    caches."""
    if head_dim % 32 or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim must be a power of two >= 32, got {head_dim}")
    if w.shape[0] != (num_heads + 2 * num_kv_heads) * head_dim:
        raise ValueError(f"w must have {(num_heads + 2 * num_kv_heads) * head_dim} rows, "
                         f"got {w.shape[0]}")
    check_int8_scales(k_cache, k_scale, v_scale)
    x = x if x.stride(-1) == 1 else x.contiguous()
    n = x.shape[0]
    q = torch.empty(n, num_heads * head_dim, dtype=x.dtype, device=x.device)
    if n == 0:
        return q.view(n, num_heads, head_dim)
    kv_int8 = k_cache.dtype == torch.int8
    if kv_int8:
        scales, s_strides = (k_scale, v_scale), (*k_scale.stride(), *v_scale.stride())
    else:
        scales, s_strides = (k_cache, v_cache), (0,) * 6
    has_norm = q_norm_weight is not None
    weights = (q_norm_weight.contiguous(), k_norm_weight.contiguous()) if has_norm else (x, x)
    if cos_cache.stride(-1) != 1 or sin_cache.stride(-1) != 1 or k_cache.stride(-1) != 1 \
            or v_cache.stride(-1) != 1:
        raise ValueError("cos/sin caches and KV caches must be contiguous in their last dim")
    args = (positions, cos_cache, sin_cache, slot_mapping, k_cache, v_cache, *scales, *weights,
            num_heads, num_kv_heads, k_cache.shape[1], eps, cos_cache.stride(0),
            sin_cache.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), *s_strides)
    flags = dict(HAS_NORM=has_norm, KV_INT8=kv_int8)
    blocks = num_heads + 2 * num_kv_heads
    _launch(x, w, q, EPI_QKV, blocks, head_dim, head_dim // 2, cfg, (args, flags))
    return q.view(n, num_heads, head_dim)
