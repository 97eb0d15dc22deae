"""The full path's top-p cut: per row, the smallest logit value v with mass(x > v) <
top_p * mass(x >= tau), the masses of exp((x - max) / T).

Owns `top_p_threshold`, the plain-torch reference (an exact bisection over the float32 bit
order, batched; the CPU's path), and `top_p_threshold_kernel`, its launch on CUDA
(kernels/top_p_cut_triton.py: a 16-way search with the same answer). `sampling_ops` calls them
for full-path rows and for top-p-alone rows wider than their candidates. To extend: change both
and the cases in tests/kernels/test_sample_draw.py.
"""

from __future__ import annotations

import torch

from infer_cluster.kernels.sample import top_p_threshold as _top_p_threshold_launch

_BISECT_STEPS = 32


def _float_key(v: torch.Tensor) -> torch.Tensor:
    """float32 -> int64 with the same order (-0.0 just below +0.0)."""
    bits = v.contiguous().view(torch.int32).to(torch.int64)
    return torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


def _key_float(k: torch.Tensor) -> torch.Tensor:
    bits = torch.where(k < 0, k ^ 0x7FFFFFFF, k).to(torch.int32)
    return bits.view(torch.float32)


def top_p_threshold_kernel(x, m, inv_t, tau, top_p, active=None, active_code: int = 0,
                           mass=None) -> torch.Tensor:
    """`top_p_threshold` by its kernel (kernels/sample_triton.py): one launch. With `active`
    (int8 codes), only the rows whose code is `active_code` are computed; `mass` ([n] float32,
    rows with tau = -inf): their whole masses, known already (one pass fewer)."""
    return _top_p_threshold_launch(x, m.contiguous(), inv_t.contiguous(), tau.contiguous(),
                                   top_p.float().contiguous(), active, active_code, mass)


def top_p_threshold(x, m, inv_t, tau, top_p) -> torch.Tensor:
    """[n, 1] smallest logit value v of the row with mass(x > v) < top_p * mass(x >= tau), the
    masses taken of exp((x - m) * inv_t). Exact: a bisection over the float32 bit order, 32
    fixed steps for the whole batch (float sums are monotone in their terms, so it converges).
    The reference of `top_p_threshold_kernel`, whose multi-way search finds the same key."""
    w = torch.exp((x - m) * inv_t).masked_fill_(x < tau, 0.0)
    target = top_p * w.sum(dim=-1, keepdim=True)
    lo = _float_key(torch.full_like(m, float("-inf")))
    hi = _float_key(m)
    for _ in range(_BISECT_STEPS):
        mid = (lo + hi) // 2
        mass = torch.where(x > _key_float(mid), w, 0.0).sum(dim=-1, keepdim=True)
        below = mass < target
        hi = torch.where(below, mid, hi)
        lo = torch.where(below, lo, mid)
    return _key_float(hi)
