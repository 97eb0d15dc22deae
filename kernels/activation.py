"""SiLU-and-mul: `silu(x[..., :d]) * x[..., d:]` for the merged gate/up projection output."""

from __future__ import annotations

import torch.nn.functional as F

from .dispatch import use_triton


def silu_and_mul_ref(x):
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def silu_and_mul(x):
    if use_triton(x):
        from .activation_triton import silu_and_mul_triton
        return silu_and_mul_triton(x)
    return silu_and_mul_ref(x)
