"""Triton twin of `torch.argmax(x, dim=-1)` for [rows, vocab] logits: a split row argmax.

`_part_kernel`, grid (rows, parts): each program takes BLOCK columns of a row (loaded as
float32, which is exact for bf16 / fp16) and writes the part's largest value and the first
column that holds it; a part holding a NaN writes NaN and its first NaN's column. `_pick_kernel`,
one program per row: the first part's column among those holding a NaN, else among those whose
value equals the row's maximum. Parts are in column order, so "first" is the lowest column,
and the result is torch's bit for bit (ties to the lowest index, NaN wins).

The part count depends on the vocabulary only, so one compiled variant serves every batch size
and a CUDA graph can capture it. To tune: BLOCK (columns per program) and the warps, with
`bench/decode_timeline.py` showing the two launches in a step.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 2048    # columns per program: 75 programs for a 151,936-wide row
_WARPS = 4


@triton.jit
def tile_argmax(x, cols, inside, vocab):
    """torch.argmax over one tile, as (value, column): where the tile holds a NaN, NaN and its
    lowest column; else the largest value and the lowest column holding it. `x` float32 with
    -inf outside `inside`; `cols` the lanes' columns (or, merging parts, their columns found)."""
    nan = (x != x) & inside
    big = tl.max(tl.where(nan, float("-inf"), x), axis=0)
    first_max = tl.min(tl.where((x == big) & inside, cols, vocab), axis=0)
    first_nan = tl.min(tl.where(nan, cols, vocab), axis=0)
    has_nan = first_nan < vocab
    return tl.where(has_nan, float("nan"), big), tl.where(has_nan, first_nan, first_max)


@triton.jit
def _part_kernel(x_ptr, sx, vocab, val_ptr, idx_ptr, nparts, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    cols = part * BLOCK + tl.arange(0, BLOCK)
    inside = cols < vocab
    x = tl.load(x_ptr + row * sx + cols, mask=inside, other=float("-inf")).to(tl.float32)
    val, idx = tile_argmax(x, cols, inside, vocab)
    tl.store(val_ptr + row * nparts + part, val)
    tl.store(idx_ptr + row * nparts + part, idx)


@triton.jit
def _pick_kernel(val_ptr, idx_ptr, out_ptr, nparts, vocab, BLOCK_P: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_P)
    inside = offs < nparts
    val = tl.load(val_ptr + row * nparts + offs, mask=inside, other=float("-inf"))
    idx = tl.load(idx_ptr + row * nparts + offs, mask=inside, other=vocab)
    # parts are in column order: the first part's column among NaN parts, else among the maxima
    _, first = tile_argmax(val, idx, inside, vocab)
    tl.store(out_ptr + row, first.to(tl.int64))


def row_argmax_triton(x: torch.Tensor) -> torch.Tensor:
    n, vocab = x.shape
    nparts = triton.cdiv(vocab, BLOCK)
    out = torch.empty(n, dtype=torch.int64, device=x.device)
    if n == 0:
        return out
    val = torch.empty(n, nparts, dtype=torch.float32, device=x.device)
    idx = torch.empty(n, nparts, dtype=torch.int32, device=x.device)
    _part_kernel[(n, nparts)](x, x.stride(0), vocab, val, idx, nparts, BLOCK=BLOCK, num_warps=_WARPS)
    _pick_kernel[(n,)](val, idx, out, nparts, vocab, BLOCK_P=max(2, triton.next_power_of_2(nparts)),
                       num_warps=1)
    return out
