"""Triton fused decoder MLP for a few rows: add + RMSNorm, gate_up, SiLU * up and down in one launch.

Owns: `fused_mlp_small_triton(x, residual, norm_weight, eps, gate_up_weight, down_weight, acc,
zero, cfg)`. Each program owns `block_c` intermediate channels: it loads their gate and up rows
of W_gate_up and their columns of W_down before its PDL wait (weights are never written by a
step, so with PDL the whole slab is in flight while the previous kernel finishes), then
normalises `x + residual` (every program the whole row, like the fused-norm GEMV), computes its
channels' `silu(gate) * up`, multiplies them by its W_down columns and adds the float32 partial
row into `acc` with atomics. The caller hands a zeroed `acc`; `zero` (optional, same shape) is
another accumulator that program 0 zeroes after its wait, so a chain of layers can alternate
two buffers with no memset launch between them (worker/models/decoder.py does).

Why: at batch 1 the down GEMV is its own launch on the step's critical path (~4.3 µs for 6.3 MB
on the H100), and the gate_up GEMV before it can only preload what its resident programs hold.
Here the down weights ride with gate_up's, and one launch boundary per layer goes.

Numerics: the rounding of the unfused path (`kernels/gemv.py`): the normalised row, gate and up
(stored bf16 there), `silu(gate)` and the product are rounded to the activation dtype; the down
sums are float32, added up across programs in atomic order, so their order (and the last bit
of the bf16 the consumer rounds to) may vary from run to run. `x` may be the float32 output of
the previous layer's fused MLP: it is rounded to the activation dtype (the norm weight's)
first, as the unfused down projection's bf16 output would have been.

To extend (another activation): its rounding next to the SiLU below, and its twin in
`kernels/mlp.py`'s reference.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .pdl import pdl_enabled, pdl_launch, pdl_release, pdl_wait

MAX_M = 4  # rows one launch handles (weights are shared across rows, activations are per row)


@triton.jit(do_not_specialize=["M"])
def _mlp_kernel(x_ptr, r_ptr, h_ptr, nw_ptr, wgu_ptr, wd_ptr, acc_ptr, zero_ptr, eps,
                M, K, I, sxm, srm, shm, swgu, swd, sam,
                HAS_RES: tl.constexpr, HAS_ZERO: tl.constexpr, EVEN_K: tl.constexpr,
                EVEN_C: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr,
                PDL: tl.constexpr = False):
    pdl_release(PDL)
    pid = tl.program_id(0)
    offs_c = pid * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_c = offs_c < I
    offs_k = tl.arange(0, BLOCK_K)
    mask_k = offs_k < K
    # Weights first (never written by a step): with PDL these loads overlap the previous kernel.
    # Unmasked where the shape allows: masks (or a tl.where on the offsets) along the contiguous
    # axis would cost the loads their vector width. Gate / up rows run along K; the W_down
    # columns a program owns are BLOCK_C contiguous values in each of its K rows.
    gate_rows = wgu_ptr + offs_c.to(tl.int64)[:, None] * swgu + offs_k[None, :]
    down_cols = wd_ptr + offs_k.to(tl.int64)[:, None] * swd + offs_c[None, :]  # [BLOCK_K, BLOCK_C]
    if EVEN_K and EVEN_C:
        wg = tl.load(gate_rows)
        wu = tl.load(gate_rows + I * swgu)
        wd = tl.load(down_cols)
    else:
        tile = mask_c[:, None] & mask_k[None, :]
        wg = tl.load(gate_rows, mask=tile, other=0.0)
        wu = tl.load(gate_rows + I * swgu, mask=tile, other=0.0)
        wd = tl.load(down_cols, mask=mask_k[:, None] & mask_c[None, :], other=0.0)
    pdl_wait(PDL)
    act_dtype = nw_ptr.dtype.element_ty
    nw = tl.load(nw_ptr + offs_k, mask=mask_k, other=0.0).to(tl.float32)
    for m in tl.static_range(BLOCK_M):
        row = mask_k & (m < M)
        x = tl.load(x_ptr + m * sxm + offs_k, mask=row, other=0.0).to(act_dtype).to(tl.float32)
        if HAS_RES:
            r = tl.load(r_ptr + m * srm + offs_k, mask=row, other=0.0).to(tl.float32)
            h = (x + r).to(act_dtype)
            tl.store(h_ptr + m * shm + offs_k, h, mask=row & (pid == 0))  # the new residual, once
            hf = h.to(tl.float32)
        else:
            hf = x
        inv_rms = tl.rsqrt(tl.sum(hf * hf, axis=0) / K + eps)
        xn = (nw * (hf * inv_rms).to(act_dtype).to(tl.float32)).to(act_dtype).to(tl.float32)
        gate = tl.sum(wg.to(tl.float32) * xn[None, :], axis=1).to(act_dtype).to(tl.float32)
        up = tl.sum(wu.to(tl.float32) * xn[None, :], axis=1).to(act_dtype).to(tl.float32)
        act = (gate / (1.0 + tl.exp(-gate))).to(act_dtype).to(tl.float32)
        act = (act * up).to(act_dtype).to(tl.float32)  # 0 for masked channels (their W is 0)
        part = tl.sum(wd.to(tl.float32) * act[None, :], axis=1)  # [BLOCK_K] float32
        tl.atomic_add(acc_ptr + m * sam + offs_k, part, mask=row, sem="relaxed")
        if HAS_ZERO:
            tl.store(zero_ptr + m * sam + offs_k, tl.zeros([BLOCK_K], dtype=tl.float32),
                     mask=row & (pid == 0))


def _check(x, residual, norm_weight, gate_up_weight, down_weight, acc, zero):
    if x.dim() != 2 or not 0 < x.shape[0] <= MAX_M:
        raise ValueError(f"fused MLP takes [1..{MAX_M}, hidden] inputs, got {tuple(x.shape)}")
    m, k = x.shape
    inter = down_weight.shape[1] if down_weight.dim() == 2 else -1
    if gate_up_weight.shape != (2 * inter, k) or down_weight.shape != (k, inter):
        raise ValueError(f"weights must be gate_up [2I, {k}] and down [{k}, I], got "
                         f"{tuple(gate_up_weight.shape)} and {tuple(down_weight.shape)}")
    dtype = norm_weight.dtype
    if norm_weight.shape != (k,) or gate_up_weight.dtype != dtype or down_weight.dtype != dtype:
        raise ValueError(f"norm weight [{k}] and both weights must share one dtype, got "
                         f"{tuple(norm_weight.shape)} {norm_weight.dtype}, {gate_up_weight.dtype}, "
                         f"{down_weight.dtype}")
    if residual is None and x.dtype != dtype:
        raise ValueError(f"without a residual x must be {dtype} (it becomes the residual), got {x.dtype}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != dtype):
        raise ValueError(f"residual must be {tuple(x.shape)} {dtype}, got {tuple(residual.shape)} "
                         f"{residual.dtype}")
    for name, t in (("acc", acc), ("zero", zero)):
        if t is not None and (t.shape != x.shape or t.dtype != torch.float32 or t.stride(-1) != 1):
            raise ValueError(f"{name} must be a float32 [{m}, {k}] buffer with unit column stride, "
                             f"got {tuple(t.shape)} {t.dtype}")
    if zero is not None and zero.stride() != acc.stride():
        raise ValueError("acc and zero must have the same strides")


def fused_mlp_small_triton(x, residual, norm_weight, eps: float, gate_up_weight, down_weight,
                           acc, zero: Optional[torch.Tensor] = None, block_c: int = 16,
                           num_warps: int = 8):
    """Adds `down(silu(gate) * up)` of `rms_norm(x + residual)` into the zeroed float32 `acc`
    and returns `(acc, x + residual)` (`x` itself when residual is None). Zeroes `zero` too."""
    _check(x, residual, norm_weight, gate_up_weight, down_weight, acc, zero)
    m, k = x.shape
    inter = down_weight.shape[1]
    if x.stride(-1) != 1:
        x = x.contiguous()
    gate_up_weight, down_weight = gate_up_weight.contiguous(), down_weight.contiguous()
    if residual is not None:
        residual = residual if residual.stride(-1) == 1 else residual.contiguous()
        h = torch.empty(x.shape, dtype=residual.dtype, device=x.device)
    else:
        h = x
    r = residual if residual is not None else h  # never read without HAS_RES
    z = zero if zero is not None else acc  # never written without HAS_ZERO
    pdl = pdl_enabled(x)
    block_k = triton.next_power_of_2(k)
    _mlp_kernel[(triton.cdiv(inter, block_c),)](
        x, r, h, norm_weight, gate_up_weight, down_weight, acc, z, eps, m, k, inter,
        x.stride(0), r.stride(0), h.stride(0), gate_up_weight.stride(0), down_weight.stride(0),
        acc.stride(0), HAS_RES=residual is not None, HAS_ZERO=zero is not None,
        EVEN_K=block_k == k, EVEN_C=inter % block_c == 0, BLOCK_M=triton.next_power_of_2(m), BLOCK_C=block_c, BLOCK_K=block_k,
        PDL=pdl, num_warps=num_warps, **pdl_launch(pdl))
    return acc, h
