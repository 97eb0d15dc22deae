"""The top `width` values of each bf16 / fp16 logits row and their ids, sorted highest first, in
one launch: what `worker.sampling.ops.topk_by_blocks` computes with two torch top-ks, two
gathers and index arithmetic (~0.12 ms at 256 x 151,936 on an H200, most of the sampled draw).

One program a row, given the row's block maxima (`kernels.row_stats`, runs of `BLOCK` columns):
  1. the block threshold: the `width`-th largest block maximum, by bisection over 16-bit
     order-preserving keys (`_key16`) of the maxima held in registers. Every value of the row's
     top `width` lies in a block whose maximum reaches it (a block below it holds only smaller
     values, and `width` blocks at or above it hold at least `width` values at or above it);
  2. those blocks' ids, compacted into a scratch row;
  3. the common case, one pass: every value of those blocks at or above the block threshold,
     packed (key, id) into a scratch row. The `width` blocks at or above it hold `width` values
     at or above it, so the row's top `width` is among them; where they are at most `MAX_WIDTH`
     (a row without a wide tie at the top), the sort below takes them all. On an H200 this cut
     the call at 256 x 151,936 with width 114 (top_k 50) from 151 us to 43 us (2026-12-01);
  4. otherwise, the value threshold T: the `width`-th largest key among those blocks' values,
     from two 8-bit histograms (high byte, then the low byte within the chosen high byte); then
     every value above T and the first (lowest-id) values equal to T, as many as make `width`,
     packed into the scratch row;
  5. one sort of the packs, the first `width` unpacked into values (float32) and ids.
Exact: the same values as `torch.topk` (ties at T broken by the lowest id, which torch leaves
unspecified). Its reference is `topk_by_blocks`' torch path; tests/kernels/test_topk_select.py
compares them, ties and -inf rows included.

Launch arguments never depend on the row count, and strides, the vocabulary and the width are
not specialized (the final sort is always `MAX_WIDTH` wide), so one compiled variant a logits
dtype and vocabulary serves every step and every top_k.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_WIDTH = 512     # widest selection (the sampler's MAX_CANDIDATES)
_TB = 8             # blocks a tile of the value passes (8 x 128 = 1,024 values)


@triton.jit
def _key16(x):
    """An int32 key in [0, 65535] of a bf16 / fp16 value whose integer order is the value order."""
    bits = x.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    return tl.where(bits >= 0x8000, 0xFFFF - bits, bits | 0x8000)


@triton.jit
def _unkey16(k, DTYPE: tl.constexpr):
    bits = tl.where(k >= 0x8000, k & 0x7FFF, 0xFFFF - k)
    return bits.to(tl.int16).to(DTYPE, bitcast=True)


@triton.jit
def _pick_bin(hist, bins, need):
    """The highest bin b whose count together with the bins above it reaches `need`, and the
    count of the bins above b."""
    total = tl.sum(hist, axis=0)
    below_or_at = tl.cumsum(hist, axis=0)
    at_or_above = total - below_or_at + hist
    b = tl.max(tl.where(at_or_above >= need, bins, -1), axis=0)
    above = tl.sum(tl.where(bins == b, total - below_or_at, 0), axis=0)
    return b, above


@triton.jit
def _tile(x_ptr, row, sx, blk_ptr, i, nq, vocab, BLOCK: tl.constexpr, TB: tl.constexpr):
    """Keys, ids and validity of candidate blocks i .. i + TB (flattened, id order)."""
    j = i + tl.arange(0, TB)
    blk = tl.load(blk_ptr + j, mask=j < nq, other=0)
    cols = blk[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    ok = (j[:, None] < nq) & (cols < vocab)
    k = _key16(tl.load(x_ptr + row * sx + cols, mask=ok, other=0.0))
    return tl.reshape(k, [TB * BLOCK]), tl.reshape(cols, [TB * BLOCK]), tl.reshape(ok, [TB * BLOCK])


@triton.jit(do_not_specialize=["sx", "sb", "sv", "si", "nblk", "vocab", "width"])
def _topk_select_kernel(x_ptr, sx, bmax_ptr, sb, scratch_ptr, packs_ptr, vals_ptr, sv, ids_ptr, si, nblk, vocab,
                        width, NBLK_PAD: tl.constexpr, BLOCK: tl.constexpr, TB: tl.constexpr, WPAD: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    # 1. the block threshold (keys of padding: -1, below every real key)
    b = tl.arange(0, NBLK_PAD)
    bk = tl.where(b < nblk, _key16(tl.load(bmax_ptr + row * sb + b, mask=b < nblk, other=0.0)), -1)
    lo = 0       # count(bk >= lo) >= width (or lo stays 0: fewer blocks than width, all taken)
    hi = 65536   # count(bk >= hi) < width
    for _ in tl.static_range(16):
        mid = (lo + hi) // 2
        enough = tl.sum((bk >= mid).to(tl.int32), axis=0) >= width
        lo = tl.where(enough, mid, lo)
        hi = tl.where(enough, hi, mid)
    # 2. the candidate blocks, compacted
    q = (bk >= lo).to(tl.int32)
    nq = tl.sum(q, axis=0)
    blk_ptr = scratch_ptr + row * NBLK_PAD
    tl.store(blk_ptr + tl.cumsum(q, axis=0) - 1, b, mask=q != 0)
    tl.debug_barrier()
    # 3. every value at or above the block threshold, packed (key, 2^31 - 1 - id) so that one
    # descending sort orders it (at most WPAD of them are kept: more go the way of step 4)
    packs = packs_ptr + row * WPAD
    found = 0
    for i in range(0, nq, TB):
        k, cols, ok = _tile(x_ptr, row, sx, blk_ptr, i, nq, vocab, BLOCK, TB)
        take = (ok & (k >= lo)).to(tl.int32)
        at = found + tl.cumsum(take, axis=0) - 1
        packed = (k.to(tl.int64) << 32) | (0x7FFFFFFF - cols).to(tl.int64)
        tl.store(packs + at, packed, mask=(take != 0) & (at < WPAD))
        found += tl.sum(take, axis=0)
    if found > WPAD:  # a wide tie at the top: the exact threshold first
        tl.debug_barrier()  # step 3's stores land before this step's, which write over them
        _select_by_threshold(x_ptr, row, sx, blk_ptr, nq, vocab, width, packs, BLOCK, TB)
        found = width
    tl.debug_barrier()
    # 5. one sort; the first `width` packs, unpacked
    w = tl.arange(0, WPAD)
    packed = tl.load(packs + w, mask=w < found, other=-1)
    packed = tl.sort(packed, descending=True)
    key = (packed >> 32).to(tl.int32)
    ids = 0x7FFFFFFF - (packed & 0x7FFFFFFF)
    vals = _unkey16(key, x_ptr.dtype.element_ty).to(tl.float32)
    tl.store(vals_ptr + row * sv + w, vals, mask=w < width)
    tl.store(ids_ptr + row * si + w, ids, mask=w < width)


@triton.jit
def _select_by_threshold(x_ptr, row, sx, blk_ptr, nq, vocab, width, packs, BLOCK: tl.constexpr, TB: tl.constexpr):
    """Step 4: the row's top `width` packs into `packs`, from the exact threshold T."""
    # the value threshold T, a byte at a time (lanes outside the candidates count in bin 256)
    bins = tl.arange(0, 512)
    hist = tl.zeros([512], tl.int32)
    for i in range(0, nq, TB):
        k, cols, ok = _tile(x_ptr, row, sx, blk_ptr, i, nq, vocab, BLOCK, TB)
        hist += tl.histogram(tl.where(ok, k >> 8, 256), 512)
    h, above = _pick_bin(tl.where(bins < 256, hist, 0), bins, width)
    hist = tl.zeros([512], tl.int32)
    for i in range(0, nq, TB):
        k, cols, ok = _tile(x_ptr, row, sx, blk_ptr, i, nq, vocab, BLOCK, TB)
        hist += tl.histogram(tl.where(ok & ((k >> 8) == h), k & 255, 256), 512)
    lo_byte, above_lo = _pick_bin(tl.where(bins < 256, hist, 0), bins, width - above)
    t = h * 256 + lo_byte
    ties_wanted = width - above - above_lo   # values equal to T to take (>= 1)
    # the selection: every value above T, and the lowest-id values equal to T
    taken = 0
    ties = 0
    for i in range(0, nq, TB):
        k, cols, ok = _tile(x_ptr, row, sx, blk_ptr, i, nq, vocab, BLOCK, TB)
        eq = (ok & (k == t)).to(tl.int32)
        take = ((ok & (k > t)) | ((eq != 0) & (ties + tl.cumsum(eq, axis=0) <= ties_wanted))).to(tl.int32)
        packed = (k.to(tl.int64) << 32) | (0x7FFFFFFF - cols).to(tl.int64)
        tl.store(packs + taken + tl.cumsum(take, axis=0) - 1, packed, mask=take != 0)
        taken += tl.sum(take, axis=0)
        ties += tl.sum(eq, axis=0)


def topk_select(x: torch.Tensor, maxima: torch.Tensor, width: int,
                block: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """(values [n, width] float32, ids [n, width] int64): each row's top `width`, highest first,
    from x [n, vocab] and its block maxima [n, ceil(vocab / block)] (`kernels.sample.topk_select_fits`
    must hold)."""
    n, vocab = x.shape
    nblk = maxima.shape[1]
    vals = torch.empty(n, width, dtype=torch.float32, device=x.device)
    ids = torch.empty(n, width, dtype=torch.int64, device=x.device)
    if n:
        nblk_pad = triton.next_power_of_2(nblk)
        scratch = torch.empty(n, nblk_pad, dtype=torch.int32, device=x.device)
        packs = torch.empty(n, MAX_WIDTH, dtype=torch.int64, device=x.device)
        _topk_select_kernel[(n,)](x, x.stride(0), maxima, maxima.stride(0), scratch, packs, vals, vals.stride(0),
                                  ids, ids.stride(0), nblk, vocab, width, NBLK_PAD=nblk_pad, BLOCK=block,
                                  TB=_TB, WPAD=MAX_WIDTH, num_warps=8)  # 64 registers on sm_90, no spill (4 warps spill)
    return vals, ids
