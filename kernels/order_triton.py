"""Triton twin of a stable descending argsort of decode context lengths (`decode_order`).

Owns: `_rank_kernel` and `order_desc_triton(seq_lens)`. Each program ranks BLOCK_I sequences
against all of them: the rank of sequence i is the number of sequences j with a longer context,
or an equal one and j < i (so ties keep their order, as `torch.sort(stable=True)`), and the
program writes `order[rank] = i`. The ranks are a permutation, so every slot is written once.

Why: `torch.argsort` on a decode step's lengths is a radix sort of several launches (18 us for
256 sequences on an H200, once a step on the step's critical path); this is one launch of a few
programs (256 sequences: 4 programs of 64, two 128-wide compare tiles each). The work is
quadratic, which is nothing at decode batch sizes (<= a few thousand sequences).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_I = 64   # sequences a program ranks
BLOCK_J = 128  # sequences compared against per step


@triton.jit
def _rank_kernel(lens_ptr, order_ptr, n, BLOCK_I: tl.constexpr, BLOCK_J: tl.constexpr):
    i = tl.program_id(0) * BLOCK_I + tl.arange(0, BLOCK_I)
    i_ok = i < n
    li = tl.load(lens_ptr + i, mask=i_ok, other=0)
    rank = tl.zeros([BLOCK_I], dtype=tl.int32)
    for j0 in range(0, n, BLOCK_J):
        j = j0 + tl.arange(0, BLOCK_J)
        lj = tl.load(lens_ptr + j, mask=j < n, other=0)
        ahead = (lj[None, :] > li[:, None]) | ((lj[None, :] == li[:, None]) & (j[None, :] < i[:, None]))
        rank += tl.sum((ahead & (j[None, :] < n)).to(tl.int32), axis=1)
    tl.store(order_ptr + rank, i.to(tl.int32), mask=i_ok)


def order_desc_triton(seq_lens: torch.Tensor) -> torch.Tensor:
    """int32 `[n]`: the indices of `seq_lens` (1-D, integer) longest first, ties in index order."""
    n = seq_lens.shape[0]
    order = torch.empty(n, dtype=torch.int32, device=seq_lens.device)
    if n:
        _rank_kernel[(triton.cdiv(n, BLOCK_I),)](seq_lens, order, n, BLOCK_I=BLOCK_I, BLOCK_J=BLOCK_J,
                                                 num_warps=4)
    return order
