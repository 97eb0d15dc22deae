"""RMSNorm, optionally fused with the residual add that precedes it.

`rms_norm(x, weight, eps, residual=None)`: without residual returns `norm(x)`; with residual
returns `(norm(x + residual), x + residual)` — the sum is the next layer's residual. The
reference matches HF transformers bit for bit in float32: the add happens in x's dtype, the
normalisation in float32, the weight multiply after casting back. Triton kernel beside it.
`add_rms_norm(x, residual, weight, eps)` always returns `(normed, residual)`, with x itself as
the residual when `residual` is None (the first layer), for callers that fuse either way.
"""

from __future__ import annotations

import torch

from .dispatch import use_triton


def rms_norm_ref(x, weight, eps, residual=None):
    if residual is not None:
        x = x + residual
        residual = x
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    out = weight * h.to(dtype)
    return out if residual is None else (out, residual)


def rms_norm(x, weight, eps, residual=None):
    if use_triton(x):
        from .norm_triton import rms_norm_triton
        return rms_norm_triton(x, weight, eps, residual)
    return rms_norm_ref(x, weight, eps, residual)


def add_rms_norm(x, residual, weight, eps, norm=rms_norm):
    """`(norm(x + residual), x + residual)`, or `(norm(x), x)` when residual is None. `norm`:
    `rms_norm` or `rms_norm_ref`. A float32 `x` beside a residual of another dtype (a fused
    MLP's sums, kernels/mlp.py) is rounded to the residual's dtype first. `x` may also be
    split-K partial sums (float32 `[splits, rows_pad, hidden]`, kernels/gemm.py) beside a
    `[rows, hidden]` residual: they are added split by split in float32 and rounded to the
    residual's dtype, as a GEMM rounds its output; the Triton kernel does that as it reads them."""
    if residual is not None and x.dim() == residual.dim() + 1:
        if norm is rms_norm and use_triton(residual):
            from .norm_triton import add_rms_norm_partials_triton
            return add_rms_norm_partials_triton(x, residual, weight, eps)
        from .gemm import sum_partials
        x = sum_partials(x, residual.shape[0])
    if residual is None:
        return norm(x, weight, eps), x
    if x.dtype != residual.dtype:
        x = x.to(residual.dtype)
    return norm(x, weight, eps, residual)
