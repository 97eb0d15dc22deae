"""Triton: `apply_token_bitmask` (kernels/bitmask.py holds the contract and the reference).

One program per (listed row, 4,096 columns): it reads the row's packed mask words and writes
-inf over the columns that are not allowed, those past the vocabulary included. Must never
synchronize. Under `TRITON_INTERPRET=1` the same program runs on CPU tensors.
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


def apply_token_bitmask_triton(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor,
                                vocab: int) -> torch.Tensor:
    """Shapes checked by the caller (kernels/bitmask.py); the rows must be contiguous."""
    if logits.stride(1) != 1 or bitmask.stride(1) != 1:
        raise ValueError("logits and bitmask rows must be contiguous")
    width = logits.shape[1]
    if rows.shape[0] and width:
        grid = (rows.shape[0], triton.cdiv(width, BLOCK))
        _apply_bitmask_kernel[grid](logits, bitmask, rows, logits.stride(0), bitmask.stride(0),
                                    width, min(vocab, width), BLOCK=BLOCK)
    return logits
