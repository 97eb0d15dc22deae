"""Triton L2 prefetch: ask the memory system to pull byte ranges of device memory into L2.

Owns: `l2_prefetch_triton(ranges, dummy, mode)`, one launch for up to four `(address, nbytes)`
ranges. Nothing is read into registers and nothing is written: each lane of a program hands one
`CHUNK`-byte piece to the hardware and moves on, so the kernel ends as soon as its requests are
issued and the bytes land in L2 while other kernels run (worker/models/l2_prefetch.py says when
that pays). Two modes:

- `"bulk"` (Hopper, sm_90+): `cp.async.bulk.prefetch.L2.global [addr], size` - the copy engine
  inside the SM (TMA) fetches the whole piece; one instruction per lane.
- `"lines"` (sm_80+): `prefetch.global.L2::evict_last [addr]` once per 128-byte line of the piece.

The asm has no output anyone needs; Triton's inline asm must return one, so each lane returns 0
and the program stores it under a mask that is false at run time (`never` = 0), which also keeps
the compiler from treating the asm as dead. Ranges must be 16-byte aligned with sizes a multiple
of 16 (true of every parameter tensor torch allocates; `kernels/l2_prefetch.py` checks).

CUDA only: there is no interpreter twin (prefetching has no result to compare), and
`kernels/l2_prefetch.py` never calls this off CUDA. To extend (another cache hint): a new mode
string here and in `l2_prefetch.MODES`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LANES = 32  # one warp per program: one piece per lane
CHUNK = 16384  # bytes per piece
LINE = 128  # bytes per prefetch.global line
MAX_RANGES = 4


@triton.jit
def _issue(addr, size, BULK: tl.constexpr, CHUNK: tl.constexpr, LINE: tl.constexpr):
    if BULK:
        r = tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;",
                                      "=r,l,r", [addr, size], dtype=tl.int32, is_pure=False, pack=1)
    else:
        r = tl.zeros(addr.shape, dtype=tl.int32)
        for j in tl.static_range(0, CHUNK, LINE):
            line = addr + tl.minimum(j, tl.maximum(size - LINE, 0)).to(tl.int64)
            r += tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1];\n\tmov.u32 $0, 0;",
                                           "=r,l", [line], dtype=tl.int32, is_pure=False, pack=1)
    return r


@triton.jit
def _l2_prefetch_kernel(dummy_ptr, a0, n0, a1, n1, a2, n2, a3, n3, never,
                        BULK: tl.constexpr, LANES: tl.constexpr, CHUNK: tl.constexpr,
                        LINE: tl.constexpr):
    which = tl.program_id(1)
    base = a0.to(tl.int64)
    nbytes = n0.to(tl.int64)
    if which == 1:
        base = a1.to(tl.int64)
        nbytes = n1.to(tl.int64)
    if which == 2:
        base = a2.to(tl.int64)
        nbytes = n2.to(tl.int64)
    if which == 3:
        base = a3.to(tl.int64)
        nbytes = n3.to(tl.int64)
    start = tl.program_id(0).to(tl.int64) * (LANES * CHUNK)
    if start < nbytes:
        lanes = tl.arange(0, LANES)
        offs = start + lanes.to(tl.int64) * CHUNK
        left = nbytes - offs
        # Lanes past the end re-request the range's first 16 bytes: harmless, and no branch per lane.
        size = tl.where(left > 0, tl.minimum(left, CHUNK), 16).to(tl.int32)
        addr = base + tl.where(left > 0, offs, 0)
        r = _issue(addr, size, BULK, CHUNK, LINE)
        tl.store(dummy_ptr + lanes, r, mask=lanes < never)


def l2_prefetch_triton(ranges: list[tuple[int, int]], dummy: torch.Tensor, mode: str = "bulk") -> None:
    """Prefetch up to `MAX_RANGES` `(device address, nbytes)` ranges into L2. `dummy` is a device
    int32 tensor of at least `LANES` elements (never written)."""
    if not 0 < len(ranges) <= MAX_RANGES:
        raise ValueError(f"l2_prefetch takes 1..{MAX_RANGES} ranges, got {len(ranges)}")
    # Unused slots repeat the first address with no bytes: every launch has one signature.
    padded = list(ranges) + [(ranges[0][0], 0)] * (MAX_RANGES - len(ranges))
    most = max(n for _, n in padded)
    if most == 0:
        return
    grid = (triton.cdiv(most, LANES * CHUNK), len(ranges))
    flat = [v for addr, n in padded for v in (addr, n)]
    _l2_prefetch_kernel[grid](dummy, *flat, 0, BULK=mode == "bulk", LANES=LANES, CHUNK=CHUNK,
                              LINE=LINE, num_warps=1)
