"""Pieces both paged attention kernels share: the tl.dot wrapper and the dtype policy.

Owns: `_dot` (a tile product: operands in fp16/bf16 on CUDA, float32 with input_precision="ieee"
elsewhere), `_dot_mode` (picks its LOWP/DOT_DTYPE constexprs from q and the cache dtype),
`_TL_DTYPES` (the supported dtypes, which `_check` enforces), `_LOG2E` (exponentials are base 2, the scale folded into
log2(e)) and `_dense_tile` (the prefill kernels' order over a dense grid, Triton's and Gluon's). Must never import the decode, prefill or entry modules: they all import this one, and
keeping it a leaf keeps the package free of import cycles.

Numerics: scores, softmax statistics and accumulators are float32. On CUDA with fp16/bf16 inputs
the tl.dot operands stay in that dtype (probabilities are cast to it for P@V, as usual); in
float32 or on the CPU interpreter the dots run in float32 with input_precision="ieee" (the
interpreter's bf16 math is wrong). int8 KV caches: codes become fp16 dot operands on CUDA
(whatever the model dtype: exact for |code| <= 127, and made by integer arithmetic rather than
the slow int->float conversion, which would cost more than the bytes it saves) and float32
elsewhere; the per-token scales multiply score columns (K) and probability columns (V) in
float32, so an int8 tile is never dequantized in full (the conversions live in
`attention_int8_triton`). To extend: put here only what both kernels use (a new dtype
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


def _dot_mode(q, kv_dtype=None):
    """(LOWP, DOT_DTYPE): native half-precision dots on CUDA, float32 everywhere else. With an
    int8 cache the CUDA dots run in fp16 (see `_int8_operand`)."""
    lowp = q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)
    if not lowp:
        return False, tl.float32
    return True, (tl.float16 if kv_dtype == torch.int8 else _TL_DTYPES[q.dtype])


@triton.jit
def _dense_tile(pid0, pid1, n0, n1, dense_blocks, LONGEST_FIRST: tl.constexpr):
    """The (sequence, query block, head group) of program (pid0, pid1) on a dense grid of
    (sequence x query block, head group) = (n0, n1) programs. LONGEST_FIRST: programs start in
    launch order, the first axis fastest, so the query blocks are dealt out last-first over
    every sequence and head: a chunk's last blocks see the most keys, so the longest programs
    run in the first wave and short ones fill in. Scalars only: the Gluon kernels call it too."""
    if LONGEST_FIRST:
        lin = pid0 + pid1 * n0
        per_blk = (n0 // dense_blocks) * n1
        return (lin % per_blk) // n1, dense_blocks - 1 - lin // per_blk, lin % n1
    else:
        return pid0 // dense_blocks, pid0 % dense_blocks, pid1
