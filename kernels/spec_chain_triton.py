"""Triton twin of `spec_chain._chain_inputs_torch`: one program a request of the chained step.

The program verifies the step before (its proposals against its draws), appends the kept
tokens to the slot's row of `hist`, then scans that row for the longest suffix n-gram's most
recent earlier occurrence, BLOCK candidate ends at a time (each n compares n shifted loads with
the suffix's tokens), and writes the chained step's rows. A barrier separates the appends from
the scan (other threads of the program read what they wrote) and the reads of `meta` from its
rewrite. One launch a chained step, on the order of 10 us for ~1k-token rows; its launch shape
depends on the slot count only.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .spec_chain import META_HEAD

BLOCK = 1024  # candidate n-gram ends per scan iteration


# No integer argument is specialized: the block-table stride differs between the graphs' inputs
# and an eager step's; one compiled variant serves them all (it compiles when the engine is
# built, `VerifyChain`, never mid-serving).
@triton.jit(do_not_specialize=["num_slots", "width", "min_n", "max_n", "hist_stride", "meta_stride", "bt_stride"])
def _chain_kernel(draws_ptr, hist_ptr, meta_ptr, lay_ptr, bt_ptr, ids_ptr, pos_ptr, slot_ptr, lens_ptr,
                  num_slots, width, min_n, max_n, hist_stride, meta_stride, bt_stride,
                  PAGE: tl.constexpr, HEAD: tl.constexpr, KP: tl.constexpr, BLOCK: tl.constexpr):
    g = tl.program_id(0)  # the chained step's g-th request, kept in state slot i
    i = tl.load(lay_ptr + 2 * num_slots + g)
    mrow = meta_ptr + i * meta_stride
    length = tl.load(mrow)
    off = tl.load(mrow + 1)
    k = tl.load(mrow + 2)
    j = tl.arange(0, KP)
    real = j < k
    props = tl.load(mrow + HEAD + j, mask=real, other=0)
    drawn = tl.load(draws_ptr + off + j, mask=real, other=0).to(tl.int32)
    a = tl.min(tl.where(real & (props != drawn), j, k), axis=0)
    x = tl.load(draws_ptr + off + a).to(tl.int32)
    hrow = hist_ptr + i.to(tl.int64) * hist_stride
    tl.store(hrow + length + j, props, mask=j < a)
    tl.store(hrow + length + a, x)
    size = length + a + 1
    tl.debug_barrier()
    # the longest suffix n-gram with an earlier occurrence; its most recent end
    best = size * 0 - 1
    for d in range(0, max_n - min_n + 1):
        n = max_n - d
        found = size * 0 - 1
        if n <= size - 1:
            for start in range(0, size - 1, BLOCK):
                ends = start + tl.arange(0, BLOCK)
                ok = (ends >= n - 1) & (ends <= size - 2)
                for t in range(0, n):
                    want = tl.load(hrow + size - n + t)
                    got = tl.load(hrow + ends - n + 1 + t, mask=ok, other=-1)
                    ok = ok & (got == want)
                found = tl.maximum(found, tl.max(tl.where(ok, ends, -1), axis=0))
        best = tl.where(best < 0, found, best)
    src = best + 1
    avail = tl.where(best >= 0, tl.minimum(width, size - src), 0)  # tokens found after the match
    first = tl.load(lay_ptr + g)
    k_new = tl.load(lay_ptr + num_slots + g)
    num = tl.minimum(k_new, avail)
    kept = j < num
    proposals = tl.load(hrow + src + j, mask=kept, other=0)
    proposals = tl.where(kept, proposals, x)
    # each row's input: the new last token, then the proposals
    prev = tl.load(hrow + src + j - 1, mask=(j >= 1) & (j - 1 < num), other=0)
    tokens = tl.where(j == 0, x, tl.where(j - 1 < num, prev, x))
    tl.debug_barrier()
    tl.store(mrow, size)
    tl.store(mrow + 1, first)
    tl.store(mrow + 2, num)
    tl.store(mrow + 3, avail)
    tl.store(mrow + HEAD + j, proposals, mask=j < k_new)
    rows = j <= k_new
    p = size - 1 + j
    block = tl.load(bt_ptr + first.to(tl.int64) * bt_stride + p // PAGE, mask=rows, other=0)
    r = first + j
    tl.store(ids_ptr + r, tokens.to(tl.int64), mask=rows)
    tl.store(pos_ptr + r, p.to(tl.int64), mask=rows)
    tl.store(slot_ptr + r, block.to(tl.int64) * PAGE + p % PAGE, mask=rows)
    tl.store(lens_ptr + r, p + 1, mask=rows)


def chain_inputs_triton(draws, hist, meta, layout, min_n, max_n, block_tables, page,
                        input_ids, positions, slots, seq_lens) -> None:
    width = meta.shape[1] - META_HEAD
    kp = triton.next_power_of_2(width)
    num_slots = layout.shape[1]
    _chain_kernel[(num_slots,)](
        draws, hist, meta, layout, block_tables, input_ids, positions, slots, seq_lens,
        num_slots, width, min_n, max_n, hist.stride(0), meta.stride(0), block_tables.stride(0),
        PAGE=page, HEAD=META_HEAD, KP=kp, BLOCK=BLOCK, num_warps=4)
