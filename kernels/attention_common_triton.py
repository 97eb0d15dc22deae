"""Pieces both paged attention kernels share: the tl.dot wrapper and the dtype policy.

Owns: `_dot` (a tile product: operands in fp16/bf16 on CUDA, float32 with input_precision="ieee"
elsewhere), `_dot_mode` (picks its LOWP/DOT_DTYPE constexprs from q), `_TL_DTYPES` (the supported
dtypes, which `_check` enforces) and `_LOG2E` (exponentials are base 2, the scale folded into
log2(e)). Must never import the decode, prefill or entry modules: they all import this one, and
keeping it a leaf keeps the package free of import cycles.

Numerics: scores, softmax statistics and accumulators are float32. On CUDA with fp16/bf16 inputs
the tl.dot operands stay in that dtype (probabilities are cast to it for P@V, as usual); in
float32 or on the CPU interpreter the dots run in float32 with input_precision="ieee" (the
interpreter's bf16 math is wrong). To extend: put here only what both kernels use (a new dtype
goes into `_TL_DTYPES` and `_dot_mode`); a helper for one kernel lives in that kernel's module.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_LOG2E = 1.4426950408889634
_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


@triton.jit
def _dot(a, b, LOWP: tl.constexpr, DOT_DTYPE: tl.constexpr):
    if LOWP:
        res = tl.dot(a.to(DOT_DTYPE), b.to(DOT_DTYPE))
    else:
        res = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return res


def _dot_mode(q):
    """(LOWP, DOT_DTYPE): native half-precision dots on CUDA, float32 everywhere else."""
    lowp = q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)
    return lowp, (_TL_DTYPES[q.dtype] if lowp else tl.float32)
