"""The logprob pack in one launch: each row's sampled-token logprob and its top-k alternatives'
as float64, and for greedy rows the sampled token itself, found from the block maxima that
`row_stats` wrote (no second pass over the logits).

`_pack_kernel`, one program per row, from the logits x [n, vocab] (any float dtype), the row's
log-sum-exp (float32, `row_stats`), the top-k values (float32, `topk_select`) and either the
chosen ids or, for greedy rows (`greedy`, a runtime switch), the block maxima [n, ceil(vocab / 128)]:
  * greedy: the row's largest block maximum, the first block holding it, and the first column of
    that block equal to it: torch.argmax's first index of the maximum. A row holding a NaN or
    +inf has a NaN log-sum-exp (exp(inf - inf)); such a row is scanned whole instead, with
    torch's rule (the first NaN, else the first maximum), through `row_argmax`'s `tile_argmax`.
  * values[row] = (x[row, chosen], then the k top values) in float64, minus the lse in float64:
    what `x.gather(...).double() - lse.double()` and `vals.double() - lse.double()` gave.
Its reference is the torch path of `worker.sampling.logprob_pack` (tests/kernels/test_logprob_pack.py).

To extend (e.g. ranks): one more output here and in the torch path.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .argmax_triton import tile_argmax
from .row_stats import PACK_K_MAX

K_PAD = PACK_K_MAX  # alternatives a launch can carry: protocol's MAX_LOGPROBS (20), padded
_SCAN = 2048        # columns a tile of the slow scan (rows with a NaN or +inf)
_BLOCK_TILE = 1024  # block maxima a tile of the greedy search


@triton.jit
def _first_max_by_blocks(x_ptr, sx, bmax_ptr, sb, row, vocab, nblk, BLOCK: tl.constexpr, TILE: tl.constexpr):
    """The first column of the row's maximum, from its block maxima (no NaN in the row): the
    first block holding the largest maximum, then that block's first column equal to it."""
    offs = tl.arange(0, TILE)
    big = tl.full([], float("-inf"), tl.float32)
    first = tl.full([], 0, tl.int32)
    for b0 in range(0, nblk, TILE):  # in block order: a later tile wins only with a larger maximum
        b = b0 + offs
        v = tl.load(bmax_ptr + row * sb + b, mask=b < nblk, other=float("-inf")).to(tl.float32)
        tile_big, tile_first = tile_argmax(v, b, b < nblk, nblk)
        first = tl.where((tile_big > big) | (b0 == 0), tile_first, first)
        big = tl.maximum(big, tile_big)
    c = first * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * sx + c, mask=c < vocab, other=float("-inf")).to(tl.float32)
    return tile_argmax(x, c, c < vocab, vocab)[1].to(tl.int64)


@triton.jit
def _first_max_scan(x_ptr, sx, row, vocab, SCAN: tl.constexpr):
    """torch.argmax of the whole row, tile by tile (`tile_argmax`, as `row_argmax`'s parts): the
    first NaN if any, else the first maximum."""
    offs = tl.arange(0, SCAN)
    best = tl.full([], float("-inf"), tl.float32)
    first = tl.full([], 0, tl.int32)
    for c0 in range(0, vocab, SCAN):  # in column order: a later tile wins with a NaN or a larger value
        c = c0 + offs
        x = tl.load(x_ptr + row * sx + c, mask=c < vocab, other=float("-inf")).to(tl.float32)
        v, i = tile_argmax(x, c, c < vocab, vocab)
        take = (c0 == 0) | ((best == best) & ((v != v) | (v > best)))
        first = tl.where(take, i, first)
        best = tl.where(take, v, best)
    return first.to(tl.int64)


@triton.jit(do_not_specialize=["sx", "sb", "sv", "vocab", "nblk", "k", "greedy"])
def _pack_kernel(x_ptr, sx, lse_ptr, ids_ptr, bmax_ptr, sb, vals_ptr, sv, out_ptr, vocab, nblk, k, greedy,
                 BLOCK: tl.constexpr, TILE: tl.constexpr, SCAN: tl.constexpr, KP: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    lse = tl.load(lse_ptr + row)
    if greedy != 0:  # a runtime switch: one compiled variant serves both kinds of step
        if lse != lse:  # a NaN or +inf in the row: the whole row, torch's rule
            chosen = _first_max_scan(x_ptr, sx, row, vocab, SCAN)
        else:
            chosen = _first_max_by_blocks(x_ptr, sx, bmax_ptr, sb, row, vocab, nblk, BLOCK, TILE)
        tl.store(ids_ptr + row, chosen)
    else:
        chosen = tl.load(ids_ptr + row)
    lse64 = lse.to(tl.float64)
    width = k + 1
    picked = tl.load(x_ptr + row * sx + chosen).to(tl.float32).to(tl.float64)
    tl.store(out_ptr + row * width, picked - lse64)
    j = tl.arange(0, KP)
    v = tl.load(vals_ptr + row * sv + j, mask=j < k, other=0.0).to(tl.float32).to(tl.float64)
    tl.store(out_ptr + row * width + 1 + j, v - lse64, mask=j < k)


def logprob_pack_triton(x: torch.Tensor, lse: torch.Tensor, chosen, vals: torch.Tensor,
                        maxima: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values float64 [n, 1 + k], chosen ids int64 [n]). x [n, vocab] unit column stride; lse
    [n] float32; vals [n, k] float32 (k <= K_PAD); `chosen` int64 [n], or None for greedy rows:
    then each row's argmax, found from `maxima` ([n, ceil(vocab / block)], x's dtype)."""
    n, vocab = x.shape
    k = vals.shape[1]
    out = torch.empty(n, 1 + k, dtype=torch.float64, device=x.device)
    greedy = chosen is None
    ids = torch.empty(n, dtype=torch.int64, device=x.device) if greedy else chosen
    if n:
        _pack_kernel[(n,)](x, x.stride(0), lse, ids, maxima, maxima.stride(0), vals, vals.stride(0), out, vocab,
                           maxima.shape[1], k, int(greedy), BLOCK=block, TILE=_BLOCK_TILE, SCAN=_SCAN,
                           KP=K_PAD, num_warps=4)
    return out, ids
