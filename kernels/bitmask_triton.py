"""Triton: a grammar's packed token bitmask applied to some rows of a step's logits, in place.

Owns: `apply_token_bitmask(logits, bitmask, rows, vocab)`: for each row index r in `rows` (int32,
on the logits' device), every column c of `logits[r]` becomes -inf unless c < vocab and bit
c % 32 of `bitmask[r, c // 32]` is set (xgrammar's packed int32 layout, one mask row per logits
row). Columns past `vocab` (an LM head padded past the tokenizer) are never allowed: one pass
does both.

Why not xgrammar's own kernel: its Python wrapper reads the device's properties twice, converts
the indices and clears the bitmask after use on every call, and a padded head needed two more
launches; at batch 1 the constrained draw's host time is the step's (H200, 489b204: 1.26 ms a
token with a schema against 0.82 without).
Must never synchronize. Under `TRITON_INTERPRET=1` the same program runs on CPU tensors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096  # columns per program


@triton.jit(do_not_specialize=["width", "vocab"])
def _apply_bitmask_kernel(logits_ptr, mask_ptr, rows_ptr, stride_l, stride_m, width, vocab,
                          BLOCK: tl.constexpr):
    row = tl.load(rows_ptr + tl.program_id(0)).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    words = tl.load(mask_ptr + row * stride_m + cols // 32, mask=cols < vocab, other=0)
    allowed = ((words >> (cols % 32)) & 1) != 0
    tl.store(logits_ptr + row * stride_l + cols, float("-inf"), mask=(cols < width) & ~allowed)


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor,
                        vocab: int) -> torch.Tensor:
    """`logits[rows]` restricted to the bits of `bitmask[rows]` over the first `vocab` columns."""
    if logits.dim() != 2 or bitmask.dim() != 2 or bitmask.dtype != torch.int32:
        raise ValueError(f"needs 2-D logits and an int32 2-D bitmask, got {tuple(logits.shape)} "
                         f"and {tuple(bitmask.shape)} {bitmask.dtype}")
    if rows.dtype != torch.int32 or rows.dim() != 1:
        raise ValueError(f"rows must be a 1-D int32 tensor, got {rows.dtype} {tuple(rows.shape)}")
    if bitmask.shape[1] * 32 < min(vocab, logits.shape[1]) or bitmask.shape[0] < logits.shape[0]:
        raise ValueError(f"a bitmask of {tuple(bitmask.shape)} cannot cover {vocab} tokens of "
                         f"{logits.shape[0]} rows")
    if logits.stride(1) != 1 or bitmask.stride(1) != 1:
        raise ValueError("logits and bitmask rows must be contiguous")
    width = logits.shape[1]
    if rows.shape[0] and width:
        grid = (rows.shape[0], triton.cdiv(width, BLOCK))
        _apply_bitmask_kernel[grid](logits, bitmask, rows, logits.stride(0), bitmask.stride(0),
                                    width, min(vocab, width), BLOCK=BLOCK)
    return logits
