"""A grammar's packed token bitmask applied to some rows of a step's logits, in place.

Owns `apply_token_bitmask(logits, bitmask, rows, vocab)`: for each row index r in `rows` (int32,
on the logits' device), every column c of `logits[r]` becomes -inf unless c < vocab and bit
c % 32 of `bitmask[r, c // 32]` is set (xgrammar's packed int32 layout, one mask row per logits
row). Columns past `vocab` (an LM head padded past the tokenizer) are never allowed. Rows not in
`rows` are left alone. `apply_token_bitmask_ref` is the contract in plain torch; on CUDA the
public function runs kernels/bitmask_triton.py, one launch.

Why not xgrammar's own CUDA path: its Python wrapper reads the device's properties twice,
converts the indices and clears the bitmask after use on every call, and a padded head needed
two more launches. At batch 1 the constrained draw's host time is the step's (H200, 489b204:
1.26 ms a token with a schema against 0.82 without).
"""

from __future__ import annotations

import torch

from .dispatch import use_triton


def _check(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor, vocab: int) -> None:
    if logits.dim() != 2 or bitmask.dim() != 2 or bitmask.dtype != torch.int32:
        raise ValueError(f"needs 2-D logits and an int32 2-D bitmask, got {tuple(logits.shape)} "
                         f"and {tuple(bitmask.shape)} {bitmask.dtype}")
    if rows.dtype != torch.int32 or rows.dim() != 1:
        raise ValueError(f"rows must be a 1-D int32 tensor, got {rows.dtype} {tuple(rows.shape)}")
    if bitmask.shape[1] * 32 < min(vocab, logits.shape[1]) or bitmask.shape[0] < logits.shape[0]:
        raise ValueError(f"a bitmask of {tuple(bitmask.shape)} cannot cover {vocab} tokens of "
                         f"{logits.shape[0]} rows")


def apply_token_bitmask_ref(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor,
                            vocab: int) -> torch.Tensor:
    _check(logits, bitmask, rows, vocab)
    width = logits.shape[1]
    if not rows.numel() or not width:
        return logits
    idx = rows.long()
    cols = torch.arange(width, device=logits.device)
    words = bitmask[idx][:, (cols // 32).clamp(max=bitmask.shape[1] - 1)]   # [k, width]
    allowed = ((words >> (cols % 32).to(torch.int32)) & 1).bool() & (cols < vocab)
    logits[idx] = logits[idx].masked_fill(~allowed, float("-inf"))
    return logits


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor,
                        vocab: int) -> torch.Tensor:
    if use_triton(logits):
        _check(logits, bitmask, rows, vocab)
        from .bitmask_triton import apply_token_bitmask_triton
        return apply_token_bitmask_triton(logits, bitmask, rows, vocab)
    return apply_token_bitmask_ref(logits, bitmask, rows, vocab)
