"""Triton twin of `row_stats_ref`: log-sum-exp and block maxima of each logits row, one read.

Grid (rows, splits): each program walks one part of a row in tiles of NB x BLOCK columns,
keeping a running maximum and a running sum of exp(x - max) in float32 (rescaled when the
maximum grows), and writes the tile's block maxima as it goes. `_merge_kernel` (one program per
row) turns the parts' (max, sum) pairs into the row's log-sum-exp. Splits give enough programs to fill the GPU at small batch
(a decode step at batch 8 is 8 rows). Never writes anything [rows, vocab]-sized.

To extend: a new per-row output is one more running value in `_row_stats_kernel` and one more
merge line in `row_stats_triton`; keep `row_stats_ref` in step. Launch arguments must not
depend on the row count (see `_SPLITS`).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

# Launch defaults from bench/row_stats.py on the H100 (2026-11-24, 256 x 151,936 bf16):
# 32 x 128 columns per tile, 8 parts per row, 4 warps: 0.067 ms (1.16 TB/s) vs 0.114 ms for
# 16 / 16 / 4; at 32 rows every variant is launch-bound (~0.08 ms).
_NB = 32            # blocks per tile: 32 x 128 = 4,096 columns per iteration
_WARPS = 4
_SPLITS = 8         # parts per row: 8 programs per row at batch 1, 2,048 at batch 256


@triton.jit
def _row_stats_kernel(x_ptr, sx, vocab, part_tiles, m_ptr, s_ptr, bmax_ptr, sbm, n_blocks,
                      BLOCK: tl.constexpr, NB: tl.constexpr, WITH_LSE: tl.constexpr = True):
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    nsplit = tl.num_programs(1)
    # Parts are whole tiles, so every tile starts at a multiple of NB * BLOCK: the compiler can
    # prove the alignment and load 16 bytes per lane (a runtime part length in columns would
    # leave it with scalar loads, 3x slower on the H100).
    part_len = part_tiles * (NB * BLOCK)
    start = split * part_len
    end = tl.minimum(start + part_len, vocab)
    offs_b = tl.arange(0, NB)
    offs_c = tl.arange(0, BLOCK)
    m = tl.full([1], float("-inf"), tl.float32)
    s = tl.zeros([1], tl.float32)
    for off in range(start, end, NB * BLOCK):
        cols = off + offs_b[:, None] * BLOCK + offs_c[None, :]
        x = tl.load(x_ptr + row * sx + cols, mask=cols < end, other=float("-inf"))
        bm = tl.max(x, axis=1)
        blk = off // BLOCK + offs_b
        tl.store(bmax_ptr + row * sbm + blk, bm, mask=blk < n_blocks)
        if WITH_LSE:  # False: the block maxima alone (`block_maxima_triton`), no exp
            xf = x.to(tl.float32)
            m_new = tl.maximum(m, tl.max(bm.to(tl.float32), axis=0))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            s = s * tl.exp(m - m_safe) + tl.sum(tl.sum(tl.exp(xf - m_safe[:, None]), axis=1), axis=0)
            m = m_new
    if WITH_LSE:
        one = tl.arange(0, 1)
        tl.store(m_ptr + row * nsplit + split + one, m)
        tl.store(s_ptr + row * nsplit + split + one, s)


@triton.jit
def _merge_kernel(m_ptr, s_ptr, lse_ptr, nsplit, BLOCK_S: tl.constexpr):
    """lse of one row from its parts' (max, sum of exp(x - max)): one program per row."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_S)
    mask = offs < nsplit
    m = tl.load(m_ptr + row * nsplit + offs, mask=mask, other=float("-inf"))
    s = tl.load(s_ptr + row * nsplit + offs, mask=mask, other=0.0)
    big = tl.max(m, axis=0)
    big = tl.where(big == float("-inf"), 0.0, big)
    tl.store(lse_ptr + row, big + tl.log(tl.sum(s * tl.exp(m - big), axis=0)))


def _parts(vocab: int, block: int, cfg: dict) -> tuple[int, int, int]:
    """(splits, tiles a part, blocks a row) of a launch over `vocab` columns."""
    tile = cfg["nb"] * block
    n_tiles = triton.cdiv(vocab, tile)
    # The split count depends on the vocabulary only, never on the row count, so one compiled
    # variant serves every batch size (warm-up compiles it; nothing compiles while serving).
    splits = min(n_tiles, cfg["splits"])
    part_tiles = triton.cdiv(n_tiles, splits)   # whole tiles: block maxima never straddle parts
    return triton.cdiv(vocab, part_tiles * tile), part_tiles, triton.cdiv(vocab, block)


def block_maxima_triton(x: torch.Tensor, block: int = 128, config: Optional[dict] = None) -> torch.Tensor:
    """The block maxima of `row_stats_triton` alone, in x's dtype (the sampler's top-k when no
    row asks for logprobs): the same kernel without its exp and sums, one read of `x`."""
    cfg = {"nb": _NB, "splits": _SPLITS, "num_warps": _WARPS, **(config or {})}
    n, vocab = x.shape
    splits, part_tiles, n_blocks = _parts(vocab, block, cfg)
    bmax = torch.empty(n, n_blocks, dtype=x.dtype, device=x.device)
    if n:  # WITH_LSE=False never touches the (max, sum) outputs: bmax stands in for their pointers
        _row_stats_kernel[(n, splits)](x, x.stride(0), vocab, part_tiles, bmax, bmax, bmax,
                                       bmax.stride(0), n_blocks, BLOCK=block, NB=cfg["nb"], WITH_LSE=False,
                                       num_warps=cfg["num_warps"])
    return bmax


def row_stats_triton(x: torch.Tensor, block: int = 128,
                     config: Optional[dict] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`config` overrides the launch (`nb` blocks per tile, `splits`, `num_warps`); for
    bench/row_stats.py."""
    cfg = {"nb": _NB, "splits": _SPLITS, "num_warps": _WARPS, **(config or {})}
    n, vocab = x.shape
    splits, part_tiles, n_blocks = _parts(vocab, block, cfg)
    stats = torch.empty(2 * n * splits + n, dtype=torch.float32, device=x.device)
    m, s, lse = stats[:n * splits], stats[n * splits:2 * n * splits], stats[2 * n * splits:]
    bmax = torch.empty(n, n_blocks, dtype=x.dtype, device=x.device)
    if n:
        _row_stats_kernel[(n, splits)](x, x.stride(0), vocab, part_tiles, m, s, bmax,
                                       bmax.stride(0), n_blocks, BLOCK=block, NB=cfg["nb"],
                                       num_warps=cfg["num_warps"])
        _merge_kernel[(n,)](m, s, lse, splits, BLOCK_S=max(2, triton.next_power_of_2(splits)),
                            num_warps=1)
    return lse, bmax
