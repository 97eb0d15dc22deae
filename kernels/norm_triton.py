"""Triton RMSNorm with an optional fused residual add.

Owns: `rms_norm_triton(x, weight, eps, residual=None)`, the GPU twin of `rms_norm_ref`: returns
`norm(x)`, or `(norm(x + residual), x + residual)`. Inputs are never modified; the sum and the
output are new tensors. Rounding follows the reference (HF): the add is rounded to the input
dtype, the normalisation runs in float32 and is rounded back before the weight multiply.

`add_rms_norm_partials_triton(partials, residual, weight, eps)` is the same add + norm of
split-K partial sums (float32 `[splits, rows_pad, hidden]`, kernels/gemm.py), added in split
order and rounded to the residual's dtype as they are read.

Grid: (num_rows,), one program per row with the whole hidden size in one tile (hidden sizes of
the models we serve are <= 16k). On sm_90 the kernel is launched with PDL (kernels/pdl.py): it
lets the next kernel's programs start at once (a Gluon GEMM then has its weight tiles in flight
while the norm runs) and loads its weight before it waits for the kernel ahead. Left out of a
decode step, the norms took 0.24 ms of a 5.25 ms 256-row step (H200) against 0.12 ms of their
own kernel time: without PDL each one was a point where nothing overlapped. To extend (e.g. a
+1 offset on the weight), change the kernel's final multiply and keep the reference in step.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pdl import pdl_enabled, pdl_launch, pdl_release, pdl_wait

_MAX_HIDDEN = 65536
_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr, n_cols, eps,
                     sx, sr, so, ss, s_split, ACT_DTYPE: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                     BLOCK: tl.constexpr, SPLITS: tl.constexpr, PDL: tl.constexpr = False):
    pdl_release(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)  # never written in a step
    pdl_wait(PDL)  # x and the residual come from kernels before
    x = tl.load(x_ptr + row * sx + cols, mask=mask, other=0.0).to(tl.float32)
    if SPLITS > 1:  # split-K partial sums: added in split order, rounded as the GEMM's output
        for s in tl.static_range(1, SPLITS):
            x += tl.load(x_ptr + s * s_split + row * sx + cols, mask=mask, other=0.0)
        x = x.to(ACT_DTYPE).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * sr + cols, mask=mask, other=0.0).to(tl.float32)
        # The reference adds in the activation dtype; round the sum the same way.
        x = (x + r).to(ACT_DTYPE)
        tl.store(sum_ptr + row * ss + cols, x, mask=mask)
        x = x.to(tl.float32)
    inv = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    h = (x * inv).to(ACT_DTYPE).to(tl.float32)
    tl.store(out_ptr + row * so + cols, (w * h).to(out_ptr.dtype.element_ty), mask=mask)


def _rows(t, hidden):
    # Row stride is passed to the kernel; only the hidden dim has to be unit-stride.
    t2 = t.reshape(-1, hidden)
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def _launch(x2, s_split, splits, r2, weight, eps, act_dtype, shape, has_residual):
    """Run the kernel over the rows of `x2` (`[rows, hidden]` views; with `splits` > 1 the first
    split of partials `s_split` elements apart): `(out, summed)`, new tensors of `shape`, summed
    only with a residual (else `out` twice)."""
    rows, hidden = r2.shape
    weight = weight.contiguous()
    # the weight multiply promotes exactly as `weight * h.to(dtype)` does in the reference
    out = torch.empty(shape, dtype=torch.promote_types(weight.dtype, act_dtype), device=r2.device)
    summed = torch.empty(shape, dtype=act_dtype, device=r2.device) if has_residual else out
    if rows and hidden:
        sum2, out2 = summed.view(-1, hidden), out.view(-1, hidden)
        block = triton.next_power_of_2(hidden)
        pdl = pdl_enabled(r2)
        _rms_norm_kernel[(rows,)](x2, r2, weight, out2, sum2, hidden, eps,
                                  x2.stride(0), r2.stride(0), out2.stride(0), sum2.stride(0), s_split,
                                  ACT_DTYPE=_TL_DTYPES[act_dtype], HAS_RESIDUAL=has_residual,
                                  BLOCK=block, SPLITS=splits, PDL=pdl,
                                  num_warps=4 if block <= 2048 else (8 if block <= 8192 else 16),
                                  **pdl_launch(pdl))
    return out, summed


def _check(hidden, weight, act_dtype):
    if weight.shape != (hidden,):
        raise ValueError(f"weight must be [{hidden}], got {tuple(weight.shape)}")
    if hidden > _MAX_HIDDEN:
        raise ValueError(f"hidden size {hidden} > {_MAX_HIDDEN} is not supported")
    if act_dtype not in _TL_DTYPES:
        raise ValueError(f"unsupported dtype {act_dtype}; expected float32, float16 or bfloat16")


def rms_norm_triton(x, weight, eps, residual=None):
    hidden = x.shape[-1]
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual shape {tuple(residual.shape)} != x shape {tuple(x.shape)}")
    # dtype of the (optional) sum, where the normalisation is rounded
    act_dtype = x.dtype if residual is None else torch.promote_types(x.dtype, residual.dtype)
    _check(hidden, weight, act_dtype)
    x2 = _rows(x, hidden)
    r2 = _rows(residual, hidden) if residual is not None else x2
    out, summed = _launch(x2, 0, 1, r2, weight, eps, act_dtype, x.shape, residual is not None)
    return out if residual is None else (out, summed)


def add_rms_norm_partials_triton(partials, residual, weight, eps):
    """`(norm(sum(partials) + residual), sum(partials) + residual)` with the sum rounded to the
    residual's dtype first (`kernels.norm.add_rms_norm`'s contract for partials)."""
    rows, hidden = residual.shape
    if partials.dim() != 3 or partials.dtype != torch.float32 or partials.shape[2] != hidden \
            or partials.shape[1] < rows or partials.stride(2) != 1:
        raise ValueError(f"partials must be float32 [splits, >= {rows}, {hidden}] with unit column "
                         f"stride, got {partials.dtype} {tuple(partials.shape)}")
    _check(hidden, weight, residual.dtype)
    return _launch(partials[0], partials.stride(0), partials.shape[0], _rows(residual, hidden), weight,
                   eps, residual.dtype, residual.shape, True)
