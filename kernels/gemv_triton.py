"""Triton small-batch linear (GEMV-like): `y[M, N] = x[M, K] @ W[N, K]^T (+ bias)` for M <= 16.

Owns: `linear_small_triton`, `silu_mul_linear_small_triton` (the down projection with
`silu(gate) * up` computed in the prologue) and `rms_norm_linear_small_triton` (qkv / gate_up
with the residual add + RMSNorm before them computed in the prologue), launched with a
`GemvConfig` (`gemv_config.py`). Which config a shape gets is `kernels/gemv.py`'s business (a
tuned table); this module never picks one and never autotunes (the kernels are captured in
CUDA graphs, so every choice is made up front).

Why not cuBLAS: at decode batch sizes the product is memory bound; each program here reads one
`[BLOCK_N, K]` slab of W exactly once, `BLOCK_K` columns at a time, and reuses every chunk for all
M rows of x. Two inner products: `use_dot=False` multiplies and sums on the CUDA cores (best for
M = 1, 2), `use_dot=True` pads M to 16 and uses `tl.dot` (tensor cores). Narrow outputs (N = 1024)
give too few programs to fill the GPU, so `split_k > 1` cuts K into slices whose float32 partial
sums a second small kernel adds up (and adds the bias, and casts). `num_stages` > 1 software-
pipelines the K loop (cp.async into shared memory), keeping several chunks of W in flight per
program: the small matrices are latency bound, a program has only a few chunks to read.

Fused add + RMSNorm (`NORM`): every program first sums the squares of its rows' whole
`h = x + residual` (K <= a few thousand elements, re-read from L2), then feeds
`w_norm * round(h * rsqrt(mean + eps))` for its own K slice to the product. The new residual `h`
is stored exactly once, by the programs with `pid_n == 0` (each writes its K slice; with split-K
those slices tile K), so no second kernel and no race.

Numerics: float32 accumulation; the fused SiLU rounds `silu(gate)` and the product to the
activation dtype exactly as `silu_and_mul_ref` materialises them, and the fused norm rounds
`x + residual`, the normalised row and its product with the norm weight as `rms_norm_ref` does
(the row's sum of squares is added up in another order: float32 rounding only). float32 dots
run in IEEE precision (no TF32). Under `TRITON_INTERPRET=1` operands are widened to float32
before `tl.dot` (the interpreter has no bf16 matmul); products of bf16 values are exact in
float32, so results agree with the GPU's bf16 tensor-core dot up to summation order.

One-chunk build (`ONE_CHUNK`; on unless `INFER_CLUSTER_GEMV_ONE_CHUNK=0`): on the CUDA-core
path, when a program's K slice is the one chunk it preloads, the products are summed directly
with no chunk loop, so no float32 tile is carried into one: the same products in far fewer
registers (their float32 sum may be added in another order across lanes).

To extend (another fused prologue, e.g. an input scale): add a constexpr branch where x is loaded
in `_gemv_kernel` and a `*_ref` twin in `kernels/gemv.py`.
"""

from __future__ import annotations

import os
from typing import Optional

import torch
import triton
import triton.language as tl

from .dispatch import env_switch
from .gemv_config import MAX_M, GemvConfig
from .pdl import pdl_enabled, pdl_launch, pdl_release, pdl_wait

_DOT_M = 16  # tl.dot needs M >= 16
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _chunk_product(acc, acc3, w, k0, k_end, K, x_ptr, x_rows, r_rows, h_ptr, nw_ptr, inv_rms,
                   rows_m, mask_m, shm, pid_n, SILU_MUL: tl.constexpr, NORM: tl.constexpr,
                   HAS_RES: tl.constexpr, USE_DOT: tl.constexpr, DOT_F32: tl.constexpr,
                   EVEN_K: tl.constexpr, BLOCK_K: tl.constexpr, FIRST: tl.constexpr = False):
    """One BLOCK_K chunk of the product: x's chunk (through the fused prologue) times W's `w`.
    `FIRST` (CUDA-core path): the products start `acc3` instead of adding to it."""
    act_dtype = x_ptr.dtype.element_ty
    offs_k = k0 + tl.arange(0, BLOCK_K)
    if EVEN_K:
        x = tl.load(x_rows + offs_k[None, :])
    else:
        mask_k = offs_k < k_end
        x = tl.load(x_rows + offs_k[None, :], mask=mask_k[None, :], other=0.0)
    if SILU_MUL:  # x holds the gate; up sits K columns further on
        if EVEN_K:
            up = tl.load(x_rows + (offs_k[None, :] + K))
        else:
            up = tl.load(x_rows + (offs_k[None, :] + K), mask=mask_k[None, :], other=0.0)
        gate = x.to(tl.float32)
        act = (gate / (1.0 + tl.exp(-gate))).to(act_dtype).to(tl.float32)
        x = (act * up.to(tl.float32)).to(act_dtype)
    if NORM:  # x holds the layer input; normalise it as rms_norm_ref does, rounding alike
        # (x may be a fused MLP's float32 sums: rounded to the norm weight's dtype first, as the
        # unfused down projection's output would have been)
        act_dtype = nw_ptr.dtype.element_ty
        in_k = offs_k[None, :] < k_end
        h = x.to(act_dtype).to(tl.float32)
        if HAS_RES:
            r = tl.load(r_rows + offs_k[None, :], mask=in_k, other=0.0).to(tl.float32)
            h = (h + r).to(act_dtype)
            # The new residual, written once: by the programs of the first column block.
            tl.store(h_ptr + rows_m[:, None] * shm + offs_k[None, :], h,
                     mask=mask_m[:, None] & in_k & (pid_n == 0))
            h = h.to(tl.float32)
        nw = tl.load(nw_ptr + offs_k, mask=offs_k < k_end, other=0.0).to(tl.float32)
        x = (nw[None, :] * (h * inv_rms[:, None]).to(act_dtype).to(tl.float32)).to(act_dtype)
    if USE_DOT:
        if DOT_F32:
            acc = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
        else:
            acc = tl.dot(x, tl.trans(w), acc)
    elif FIRST:
        acc3 = x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
    else:
        acc3 += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
    return acc, acc3


@triton.jit
def _load_w(w_rows, k0, k_end, EVEN_K: tl.constexpr, BLOCK_K: tl.constexpr):
    offs_k = k0 + tl.arange(0, BLOCK_K)
    if EVEN_K:
        return tl.load(w_rows + offs_k[None, :])
    return tl.load(w_rows + offs_k[None, :], mask=(offs_k < k_end)[None, :], other=0.0)


@triton.jit(do_not_specialize=["M"])  # rows vary per step: one compile for every M (docs/kernels.md)
def _gemv_kernel(x_ptr, w_ptr, b_ptr, out_ptr, r_ptr, nw_ptr, h_ptr, eps,
                 M, N, K, k_per_split, sxm, swn, som, sos, srm, shm,
                 HAS_BIAS: tl.constexpr, SILU_MUL: tl.constexpr, NORM: tl.constexpr,
                 HAS_RES: tl.constexpr, PARTIAL: tl.constexpr,
                 USE_DOT: tl.constexpr, DOT_F32: tl.constexpr, EVEN_K: tl.constexpr,
                 STAGES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, NORM_BLOCK: tl.constexpr, PDL: tl.constexpr = False,
                 ONE_CHUNK: tl.constexpr = False):
    pdl_release(PDL)  # the next small linear may start and load its weights (kernels/pdl.py)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    # Out-of-range rows of W read row 0 (always valid) instead of masking: unmasked, vectorised loads.
    rows_n = tl.where(mask_n, offs_n, 0).to(tl.int64)
    offs_m = tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    rows_m = tl.where(mask_m, offs_m, 0).to(tl.int64)
    w_rows = w_ptr + rows_n[:, None] * swn
    x_rows = x_ptr + rows_m[:, None] * sxm
    k_begin = pid_k * k_per_split
    k_end = tl.minimum(k_begin + k_per_split, K)
    # CUDA-core path: the first W chunk is loaded before anything that reads activations. W is
    # never written by a step, so with PDL its HBM latency overlaps the previous kernel's tail,
    # and the fused norm's pre-pass below runs while it is in flight either way. (The dot path's
    # bigger tiles would spill registers holding it.)
    PRELOAD: tl.constexpr = not USE_DOT
    if PRELOAD:
        w_first = _load_w(w_rows, k_begin, k_end, EVEN_K, BLOCK_K)
    else:
        w_first = 0  # never read: the dot path loads every chunk in its loop
    pdl_wait(PDL)
    r_rows = r_ptr + rows_m[:, None] * srm
    inv_rms = tl.zeros([BLOCK_M], dtype=tl.float32)
    if NORM:  # rms of the whole row of h = x (+ r), whatever K slice this program multiplies
        act_dtype = nw_ptr.dtype.element_ty  # x's own, or x is float32 sums to round to it
        sumsq = tl.zeros([BLOCK_M], dtype=tl.float32)
        for c0 in range(0, K, NORM_BLOCK):
            offs_c = c0 + tl.arange(0, NORM_BLOCK)
            mask_c = offs_c[None, :] < K
            hc = tl.load(x_rows + offs_c[None, :], mask=mask_c, other=0.0).to(act_dtype).to(tl.float32)
            if HAS_RES:  # the unfused path rounds the sum to the activation dtype
                rc = tl.load(r_rows + offs_c[None, :], mask=mask_c, other=0.0).to(tl.float32)
                hc = (hc + rc).to(act_dtype).to(tl.float32)
            sumsq += tl.sum(hc * hc, axis=1)
        inv_rms = tl.rsqrt(sumsq / K + eps)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    # CUDA-core path: per-lane partial products, reduced across lanes once after the loop (a
    # reduction per chunk would shuffle, and sync warps, on every iteration).
    if ONE_CHUNK:  # the preloaded chunk is this program's whole K slice: no loop and no
        # float32 tile carried into one, so fewer registers and more programs per SM; the
        # products are the general path's (their sum across lanes may run in another order)
        acc, acc3 = _chunk_product(acc, acc, w_first, k_begin, k_end, K, x_ptr, x_rows, r_rows,
                                   h_ptr, nw_ptr, inv_rms, rows_m, mask_m, shm, pid_n, SILU_MUL, NORM,
                                   HAS_RES, USE_DOT, DOT_F32, EVEN_K, BLOCK_K, FIRST=True)
        acc = tl.sum(acc3, axis=2)
    else:
        acc = _product_loop(acc, w_first, w_rows, k_begin, k_end, K, x_ptr, x_rows, r_rows, h_ptr,
                            nw_ptr, inv_rms, rows_m, mask_m, shm, pid_n, SILU_MUL, NORM, HAS_RES,
                            USE_DOT, DOT_F32, EVEN_K, STAGES, BLOCK_M, BLOCK_N, BLOCK_K, PRELOAD)
    out_mask = mask_m[:, None] & mask_n[None, :]
    out_offs = offs_m[:, None] * som + offs_n[None, :]
    if PARTIAL:
        tl.store(out_ptr + pid_k * sos + out_offs, acc, mask=out_mask)
    else:
        if HAS_BIAS:
            acc += tl.load(b_ptr + rows_n).to(tl.float32)[None, :]
        tl.store(out_ptr + out_offs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _product_loop(acc, w_first, w_rows, k_begin, k_end, K, x_ptr, x_rows, r_rows, h_ptr, nw_ptr,
                  inv_rms, rows_m, mask_m, shm, pid_n, SILU_MUL: tl.constexpr, NORM: tl.constexpr,
                  HAS_RES: tl.constexpr, USE_DOT: tl.constexpr, DOT_F32: tl.constexpr,
                  EVEN_K: tl.constexpr, STAGES: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRELOAD: tl.constexpr):
    """The product over this program's K slice in BLOCK_K chunks (the first one preloaded on
    the CUDA-core path); returns the [BLOCK_M, BLOCK_N] float32 sums."""
    acc3 = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K] if not USE_DOT else [1, 1, 1], dtype=tl.float32)
    k_rest = k_begin
    if PRELOAD:
        acc, acc3 = _chunk_product(acc, acc3, w_first, k_begin, k_end, K, x_ptr, x_rows, r_rows,
                                   h_ptr, nw_ptr, inv_rms, rows_m, mask_m, shm, pid_n, SILU_MUL, NORM,
                                   HAS_RES, USE_DOT, DOT_F32, EVEN_K, BLOCK_K)
        k_rest = k_begin + BLOCK_K
    # The loop's own num_stages pipelines the W loads (cp.async) on the CUDA-core path too; the
    # launch option alone pipelines only loads that feed tl.dot. STAGES=1: plain vector loads.
    for k0 in tl.range(k_rest, k_end, BLOCK_K, num_stages=STAGES):
        w = _load_w(w_rows, k0, k_end, EVEN_K, BLOCK_K)
        acc, acc3 = _chunk_product(acc, acc3, w, k0, k_end, K, x_ptr, x_rows, r_rows, h_ptr, nw_ptr,
                                   inv_rms, rows_m, mask_m, shm, pid_n, SILU_MUL, NORM, HAS_RES,
                                   USE_DOT, DOT_F32, EVEN_K, BLOCK_K)
    if not USE_DOT:
        acc = tl.sum(acc3, axis=2)
    return acc


@triton.jit(do_not_specialize=["M"])
def _split_sum_kernel(part_ptr, b_ptr, out_ptr, M, N, SPLIT, sps, spm, som,
                      HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl_release(PDL)
    m = tl.program_id(1)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(0, SPLIT):
        acc += tl.load(part_ptr + s * sps + m * spm + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + m * som + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def one_chunk_enabled() -> bool:
    """A CUDA-core launch whose K slice is one BLOCK_K chunk compiles without the chunk loop
    (same products; 40 registers instead of 71 for the batch-1 4 x 1024 tile; batch-1 TPOT
    0.882 -> 0.865 ms on an H100, docs/kernels.md). `INFER_CLUSTER_GEMV_ONE_CHUNK=0` turns it
    off (A/B). Read per launch like `pdl_enabled`: nothing inside CUDA graphs."""
    return env_switch("INFER_CLUSTER_GEMV_ONE_CHUNK")


def _launch(x, weight, bias, k, cfg: GemvConfig, silu_mul: bool, norm=None):
    """`norm` = (residual or None, norm weight, eps, new-residual buffer or None) for the fused
    add + RMSNorm prologue; the kernel fills the buffer with x + residual."""
    m, n = x.shape[0], weight.shape[0]
    out = torch.empty(m, n, dtype=weight.dtype, device=x.device)
    if m == 0 or n == 0 or k == 0:
        if norm is not None and norm[0] is not None:
            torch.add(x.to(norm[3].dtype), norm[0], out=norm[3])  # the residual stays defined whatever the shape
        if m == 0 or n == 0:
            return out
        return out.zero_() if bias is None else out.copy_(bias.expand(m, n))
    block_m = _DOT_M if cfg.use_dot else triton.next_power_of_2(m)
    block_k = min(cfg.block_k, max(16, triton.next_power_of_2(k)))
    k_per_split = triton.cdiv(triton.cdiv(k, cfg.split_k), block_k) * block_k
    splits = triton.cdiv(k, k_per_split)
    partial = splits > 1
    grid = (triton.cdiv(n, cfg.block_n), splits)
    target = torch.empty(splits, m, n, dtype=torch.float32, device=x.device) if partial else out
    b = bias if bias is not None else weight  # never read without HAS_BIAS
    residual, norm_w, eps, h_out = norm if norm is not None else (None, x, 0.0, None)
    r = residual if residual is not None else x  # never read without HAS_RES
    h = h_out if h_out is not None else x  # never written without HAS_RES
    # The rms pre-pass reads x and residual in chunks of <= 4096 elements over all BLOCK_M rows
    # (one chunk per row at batch 1 up to K = 4096: its loads are serial L2 round trips).
    norm_block = max(16, min(triton.next_power_of_2(k), 4096 // block_m))
    pdl = pdl_enabled(x)
    _gemv_kernel[grid](x, weight, b, target, r, norm_w, h, eps, m, n, k, k_per_split, x.stride(0),
                       weight.stride(0), target.stride(-2), target.stride(0) if partial else 0,
                       r.stride(0), h.stride(0),
                       HAS_BIAS=bias is not None, SILU_MUL=silu_mul, NORM=norm is not None,
                       HAS_RES=residual is not None, PARTIAL=partial, USE_DOT=cfg.use_dot,
                       DOT_F32=weight.dtype == torch.float32 or _interpreting(), EVEN_K=k % block_k == 0,
                       STAGES=cfg.num_stages, BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=block_k,
                       NORM_BLOCK=norm_block, PDL=pdl,
                       ONE_CHUNK=not cfg.use_dot and k_per_split == block_k and one_chunk_enabled(),
                       num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl_launch(pdl))
    if partial:
        block = min(1024, triton.next_power_of_2(n))
        _split_sum_kernel[(triton.cdiv(n, block), m)](target, b, out, m, n, splits, target.stride(0),
                                                      target.stride(1), out.stride(0),
                                                      HAS_BIAS=bias is not None, BLOCK=block, PDL=pdl)
    return out


def _check(x, weight, bias, k, float32_x: bool = False):
    """`float32_x`: x may also be float32 whatever W's dtype (the fused norm's sums input)."""
    if x.dim() != 2 or weight.dim() != 2:
        raise ValueError(f"x and weight must be 2-D, got {tuple(x.shape)} and {tuple(weight.shape)}")
    if x.shape[0] > MAX_M:
        raise ValueError(f"linear_small handles at most {MAX_M} rows, got {x.shape[0]}")
    if weight.shape[1] != k:
        raise ValueError(f"weight {tuple(weight.shape)} does not take inputs of width {k}")
    if x.dtype not in _DTYPES or (weight.dtype != x.dtype and not (float32_x and x.dtype == torch.float32)):
        raise ValueError(f"x and weight must share a float dtype, got {x.dtype} and {weight.dtype}")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"bias must be [{weight.shape[0]}], got {tuple(bias.shape)}")


def _unit_stride(t):
    return t if t.stride(-1) == 1 else t.contiguous()


def linear_small_triton(x, weight, bias: Optional[torch.Tensor] = None, cfg: GemvConfig = GemvConfig()):
    _check(x, weight, bias, x.shape[1] if x.dim() == 2 else -1)
    bias = bias.contiguous() if bias is not None else None
    return _launch(_unit_stride(x), _unit_stride(weight), bias, x.shape[1], cfg, silu_mul=False)


def silu_mul_linear_small_triton(gate_up, weight, cfg: GemvConfig = GemvConfig()):
    """`F.linear(silu(gate) * up, weight)` for `gate_up = [gate | up]` of shape `[M, 2 * I]`."""
    if gate_up.dim() != 2 or gate_up.shape[1] % 2:
        raise ValueError(f"gate_up must be [M, 2 * I], got {tuple(gate_up.shape)}")
    inter = gate_up.shape[1] // 2
    _check(gate_up, weight, None, inter)
    return _launch(_unit_stride(gate_up), _unit_stride(weight), None, inter, cfg, silu_mul=True)


def rms_norm_linear_small_triton(x, residual, norm_weight, eps: float, weight,
                                 bias: Optional[torch.Tensor] = None, cfg: GemvConfig = GemvConfig()):
    """`(F.linear(h_normed, weight, bias), h)` where `h = x + residual` (x when residual is None:
    then h is x itself, not a copy) and `h_normed = rms_norm_ref(h, norm_weight, eps)`: the add and
    the norm run in the GEMV's prologue, one launch instead of two. With a residual, `x` may
    also be float32 sums (a fused MLP's, kernels/mlp_triton.py): rounded to the weight's dtype
    first, so `h` and the output are in the weight's dtype."""
    k = x.shape[1] if x.dim() == 2 else -1
    dtype = weight.dtype
    _check(x, weight, bias, k, float32_x=residual is not None)
    if residual is not None and (residual.shape != x.shape or residual.dtype != dtype):
        raise ValueError(f"residual must match x {tuple(x.shape)} {dtype}, got "
                         f"{tuple(residual.shape)} {residual.dtype}")
    if norm_weight.shape != (k,) or norm_weight.dtype != dtype:
        raise ValueError(f"norm weight must be [{k}] of {dtype}, got {tuple(norm_weight.shape)} "
                         f"{norm_weight.dtype}")
    x_in, x = x, _unit_stride(x)
    residual = _unit_stride(residual) if residual is not None else None
    h = torch.empty(x.shape, dtype=dtype, device=x.device) if residual is not None else x_in
    bias = bias.contiguous() if bias is not None else None
    out = _launch(x, _unit_stride(weight), bias, k, cfg, silu_mul=False,
                  norm=(residual, norm_weight.contiguous(), float(eps), h if residual is not None else None))
    return out, h
