"""The qkv projection with the attention input prep in its epilogue, in Gluon (Hopper).

Owns: `_gemm_prep_kernel` and its launcher `gemm_prep_sm90(x, weight, cfg, positions, cos_cache,
sin_cache, slot_mapping, k_cache, v_cache, ...)`: `qkv_prep(x @ weight^T, ...)` (contract in
kernels/qkv_prep.py) in one launch. It returns q `[M, num_heads, head_dim]` (normed with
`q_norm_weight` when given, rotated) and writes k (normed, rotated) and v into the paged caches at
`slot_mapping` (-1 = padding: nothing written), quantized to int8 with float32 row scales when
the cache is int8. The `[M, (num_heads + 2 * num_kv_heads) * head_dim]` projection is never
written or read back.

Why: in a decode step of 64-256 rows `qkv_prep` was its own launch after the qkv GEMM, a link of
the layer's chain that cost 0.08-0.14 ms a step (bench/RESULTS.md, "What a kernel costs in the
step's chain") for ~2-3 us of its own work a layer.

How: the mainloop is `_gemm_start` and `_gemm_loop` (kernels/gemm_gluon.py) with `block_n == head_dim`, so a
program's tile is one head of 64 rows: query heads first, then k heads, then v heads, as the
fused weight stacks them. The epilogue rounds the tile to the activation dtype (the unfused
GEMM's output), stores it into shared memory and reads back its two halves, so that rotate-half
pairs element d with d + head_dim / 2 in one thread. Then, as `_qkv_prep_kernel`
(qkv_prep_triton.py): the norm rounds `x * rsqrt(mean(x^2) + eps)`, then `weight * h`; cos/sin
are rounded to the activation dtype and the rotated values too; int8 quantizes those rounded
values with `_quantize_store`'s rule (IEEE divisions, round half up); compiled without FMA
contraction. The one difference: the norm's sum of squares adds the halves in another order,
so a value may differ from the unfused path's by a unit in the last place of its row (tested).
Must never allocate inside the kernel, read anything data-dependent on the host, or touch the
cache slot of a padded token: it runs inside CUDA graphs.
To extend (GPT-J rotary, partial rotary, a qkv bias), change `qkv_prep_ref` first, then
`_qkv_prep_kernel`, then this epilogue, and add a case to tests/kernels/test_gemm_prep.py.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .gemm_gluon import _GL_DTYPES, BLOCK_M, GemmConfig, _gemm_loop, _gemm_start
from .kv_append import check_int8_scales
from .pdl import pdl_launch
from .pdl_gluon import pdl_gluon
from .qkv_prep import _check_norms

_barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier  # Triton 3.7 / 3.6 name


@gluon.jit
def _norm_rotate(lo, hi, w_lo, w_hi, eps, cos, sin, dt: gl.constexpr, D: gl.constexpr, HAS_NORM: gl.constexpr):
    """The halves of a head's rows normed (HAS_NORM, weight halves `w_lo`, `w_hi`) and rotated,
    each step rounded to the activation dtype `dt` as `_normed_rotated` rounds it (float32 in
    and out; cos/sin already rounded)."""
    if HAS_NORM:
        inv = gl.rsqrt(gl.sum(lo * lo + hi * hi, axis=1) / D + eps)
        lo = (w_lo[None, :] * (lo * inv[:, None]).to(dt).to(gl.float32)).to(dt).to(gl.float32)
        hi = (w_hi[None, :] * (hi * inv[:, None]).to(dt).to(gl.float32)).to(dt).to(gl.float32)
    out_lo = (lo * cos - hi * sin).to(dt).to(gl.float32)
    out_hi = (hi * cos + lo * sin).to(dt).to(gl.float32)
    return out_lo, out_hi


@gluon.jit
def _quantize_halves(lo, hi, mask, dst, scale_ptrs, row_ok, HALF: gl.constexpr):
    """int8 codes of rows given as two halves, and their float32 scales: `_quantize_store`'s rule
    (kernels/kv_append_triton.py) over the whole row."""
    amax = gl.max(gl.maximum(gl.abs(lo), gl.abs(hi)), axis=1)
    nonzero = amax > 0
    inv = gl.div_rn(gl.full(amax.shape, 127.0, gl.float32, amax.type.layout), gl.where(nonzero, amax, 1.0))
    inv = gl.where(nonzero, inv, 0.0)
    c_lo = gl.minimum(gl.maximum(gl.floor(lo * inv[:, None] + 0.5), -127.0), 127.0)
    c_hi = gl.minimum(gl.maximum(gl.floor(hi * inv[:, None] + 0.5), -127.0), 127.0)
    gl.store(dst, c_lo.to(gl.int8), mask=mask)
    gl.store(dst + HALF, c_hi.to(gl.int8), mask=mask)
    gl.store(scale_ptrs, gl.div_rn(amax, gl.full(amax.shape, 127.0, gl.float32, amax.type.layout)),
             mask=row_ok)


@gluon.jit
def _gemm_prep_kernel(a_desc, w_desc, q_ptr, pos_ptr, cos_ptr, sin_ptr, slot_ptr, kc_ptr, vc_ptr,
                      ks_ptr, vs_ptr, qw_ptr, kw_ptr, n_m, m, num_heads, num_kv_heads, block_size, eps,
                      s_q, s_cos, s_sin, skc_b, skc_s, skc_h, svc_b, svc_s, svc_h,
                      sks_b, sks_h, sks_s, svs_b, svs_h, svs_s,
                      STEPS: gl.constexpr, STAGES: gl.constexpr, HAS_NORM: gl.constexpr,
                      KV_INT8: gl.constexpr, PDL: gl.constexpr, num_warps: gl.constexpr):
    BM: gl.constexpr = a_desc.block_type.shape[0]
    D: gl.constexpr = w_desc.block_type.shape[0]  # block_n: one head
    HALF: gl.constexpr = D // 2
    pdl_gluon(PDL, False)

    tile = gl.program_id(0)  # the programs of one W tile (one head) are adjacent
    off_m = (tile % n_m) * BM
    head = tile // n_m
    is_q = head < num_heads
    is_v = head >= num_heads + num_kv_heads
    dt: gl.constexpr = a_desc.dtype
    half_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    rows = off_m + gl.arange(0, BM, layout=gl.SliceLayout(1, half_l))
    cols = gl.arange(0, HALF, layout=gl.SliceLayout(0, half_l))
    row_in = rows < m
    mask = row_in[:, None] & (cols < HALF)[None, :]
    a_smem, w_smem, u_smem, ready = _gemm_start(a_desc, w_desc, off_m, head * D, 0, 0, STEPS, STAGES, False, PDL)
    # The epilogue's inputs are requested while the ring's first tiles are in flight, so that
    # their latency hides behind the mainloop: step inputs (positions, slots) and constants
    # (cos/sin, norm weights).
    rot_mask = mask & (head < num_heads + num_kv_heads)  # v is neither normed nor rotated
    pos = gl.load(pos_ptr + rows, mask=row_in, other=0).to(gl.int64)
    cos = gl.load(cos_ptr + pos[:, None] * s_cos + cols[None, :], mask=rot_mask, other=0.0)
    sin = gl.load(sin_ptr + pos[:, None] * s_sin + cols[None, :], mask=rot_mask, other=0.0)
    slot = gl.load(slot_ptr + rows, mask=row_in & (head >= num_heads), other=-1).to(gl.int64)
    if HAS_NORM:
        w_ptr = gl.where(is_q, qw_ptr, kw_ptr)
        w_lo = gl.load(w_ptr + cols).to(gl.float32)
        w_hi = gl.load(w_ptr + HALF + cols).to(gl.float32)
    else:
        w_lo = cols.to(gl.float32)  # unused
        w_hi = w_lo
    acc, _ = _gemm_loop(a_desc, w_desc, a_smem, w_smem, u_smem, ready, off_m, head * D, 0, 0, STEPS, STAGES, False,
                        num_warps)

    # The tile rounded as the unfused GEMM stores it, then read back in halves, row-major.
    t_sl: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    t_smem = gl.allocate_shared_memory(dt, [BM, D], t_sl)
    t_smem.store(acc.to(dt))
    _barrier()
    lo = t_smem.slice(0, HALF, dim=1).load(half_l).to(gl.float32)
    hi = t_smem.slice(HALF, HALF, dim=1).load(half_l).to(gl.float32)
    if not is_v:  # q or k: normed and rotated at the row's position
        # cos/sin rounded to the activation dtype first, as apply_rotary (and HF) do.
        lo, hi = _norm_rotate(lo, hi, w_lo, w_hi, eps, cos.to(dt).to(gl.float32), sin.to(dt).to(gl.float32),
                              dt, D, HAS_NORM)
    if is_q:
        q_dst = q_ptr + rows[:, None].to(gl.int64) * s_q + head * D + cols[None, :]
        gl.store(q_dst, lo.to(dt), mask=mask)
        gl.store(q_dst + HALF, hi.to(dt), mask=mask)
    else:
        kv = gl.where(is_v, head - num_heads - num_kv_heads, head - num_heads)
        row_ok = slot >= 0  # a padded token (or a row past M) writes nothing
        wmask = row_ok[:, None] & (cols < HALF)[None, :]
        blk = slot // block_size
        off = slot % block_size
        c_base = gl.where(is_v, vc_ptr, kc_ptr)
        c_b = gl.where(is_v, svc_b, skc_b)
        c_s = gl.where(is_v, svc_s, skc_s)
        c_h = gl.where(is_v, svc_h, skc_h)
        dst = c_base + (blk * c_b + off * c_s + kv * c_h)[:, None] + cols[None, :]
        if KV_INT8:
            s_base = gl.where(is_v, vs_ptr, ks_ptr)
            s_b = gl.where(is_v, svs_b, sks_b)
            s_h = gl.where(is_v, svs_h, sks_h)
            s_s = gl.where(is_v, svs_s, sks_s)
            _quantize_halves(lo, hi, wmask, dst, s_base + blk * s_b + kv * s_h + off * s_s, row_ok, HALF)
        else:
            gl.store(dst, lo.to(kc_ptr.dtype.element_ty), mask=wmask)
            gl.store(dst + HALF, hi.to(kc_ptr.dtype.element_ty), mask=wmask)


def prep_supported(cfg: GemmConfig, head_dim: int) -> bool:
    """Whether `cfg` can carry the prep: one head a tile, unsplit."""
    return cfg.block_n == head_dim and cfg.splits == 1 and head_dim % 16 == 0 and head_dim <= 256


def gemm_prep_sm90(x, weight, cfg: GemmConfig, positions, cos_cache, sin_cache, slot_mapping, k_cache,
                   v_cache, q_norm_weight=None, k_norm_weight=None, eps=1e-6, k_scale=None, v_scale=None,
                   *, num_heads: int, num_kv_heads: int, head_dim: int, pdl: bool = True):
    """`qkv_prep(x @ weight^T, positions, ...)` in one launch (see the module docstring): q
    `[M, num_heads, head_dim]`; k and v written into the caches."""
    m, k = x.shape
    n = (num_heads + 2 * num_kv_heads) * head_dim
    if weight.shape[0] != n:
        raise ValueError(f"a qkv weight for {num_heads} query and {num_kv_heads} KV heads of dim "
                         f"{head_dim} has {n} rows, got {weight.shape[0]}")
    if not prep_supported(cfg, head_dim) or not cfg.fits(m, n, k):
        raise ValueError(f"GemmConfig {cfg} cannot carry the prep of a {m}x{n}x{k} qkv GEMM "
                         f"(block_n must be head_dim {head_dim}, unsplit)")
    _check_norms(q_norm_weight, k_norm_weight, head_dim)
    check_int8_scales(k_cache, k_scale, v_scale)
    if tuple(positions.shape) != (m,) or tuple(slot_mapping.shape) != (m,):
        raise ValueError(f"positions and slot_mapping must be [{m}], got {tuple(positions.shape)} "
                         f"and {tuple(slot_mapping.shape)}")
    if cos_cache.shape != sin_cache.shape or tuple(cos_cache.shape[1:]) != (head_dim // 2,) \
            or cos_cache.stride(1) != 1 or sin_cache.stride(1) != 1:
        raise ValueError(f"cos/sin caches must be row-major [max_positions, {head_dim // 2}]")
    if k_cache.shape != v_cache.shape or tuple(k_cache.shape[2:]) != (num_kv_heads, head_dim) \
            or k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        raise ValueError(f"caches must be [num_blocks, block_size, {num_kv_heads}, {head_dim}] with "
                         f"unit stride over head_dim, got {tuple(k_cache.shape)}")
    dt = _GL_DTYPES[x.dtype]
    q = torch.empty(m, num_heads * head_dim, dtype=x.dtype, device=x.device)
    has_norm = q_norm_weight is not None
    if has_norm and (q_norm_weight.dtype != x.dtype or k_norm_weight.dtype != x.dtype):
        raise ValueError(f"q/k norm weights must have the activation dtype {x.dtype}")
    weights = (q_norm_weight.contiguous(), k_norm_weight.contiguous()) if has_norm else (q, q)
    kv_int8 = k_cache.dtype == torch.int8
    if kv_int8:
        scales, s_strides = (k_scale, v_scale), (*k_scale.stride(), *v_scale.stride())
    else:
        scales, s_strides = (k_cache, v_cache), (0,) * 6
    bk = cfg.block_k
    n_m = -(-m // BLOCK_M)
    a_desc = TensorDescriptor.from_tensor(x, [BLOCK_M, bk], gl.NVMMASharedLayout.get_default_for([BLOCK_M, bk], dt))
    w_desc = TensorDescriptor.from_tensor(weight, [head_dim, bk],
                                          gl.NVMMASharedLayout.get_default_for([head_dim, bk], dt))
    _gemm_prep_kernel[(cfg.programs(m, n), 1)](
        a_desc, w_desc, q, positions, cos_cache, sin_cache, slot_mapping, k_cache, v_cache, *scales,
        *weights, n_m, m, num_heads, num_kv_heads, k_cache.shape[1], eps, q.stride(0),
        cos_cache.stride(0), sin_cache.stride(0), *k_cache.stride()[:3], *v_cache.stride()[:3], *s_strides,
        STEPS=k // bk, STAGES=cfg.stages, HAS_NORM=has_norm, KV_INT8=kv_int8, PDL=pdl, num_warps=4,
        enable_fp_fusion=False, **pdl_launch(pdl))  # no FMA: rounding as the separate ops and the int8 rule
    return q.view(m, num_heads, head_dim)
