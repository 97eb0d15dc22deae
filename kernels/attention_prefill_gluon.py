"""Prefill attention over float caches in Gluon for Hopper: warpgroup MMAs, tile j's scores
issued with tile j-1's values and the softmax run while the values are on the tensor cores.

Owns: `_prefill_gluon_kernel` (the Triton prefill kernel's grid, contract and numerics for
16-bit queries over a cache of their dtype, head_dim 128, sm_90, no split KV),
`prefill_gluon_fits` (which calls it takes; `gluon_shapes_fit`, the shapes both kernels take),
`GLUON_TILES` (its tiles), and the pieces the int8 kernel (attention_prefill_int8_gluon.py)
shares: `_program_rows` (a program's query tile), `_load_q`, `_issue_tile` (a K/V tile's
page-gathered copies), `_masked`, `_softmax_step`, `_store_o`.

Why: `_prefill_kernel` (attention_prefill_triton.py) waits for each tile's q @ K^T before its
softmax and each P @ V before the next tile's scores, so the tensor cores idle while the
softmax runs: 31-38% of the bf16 matmul peak on 1k-token chunks over a cached prefix. Here each
iteration issues the scores of tile j and the values of tile j-1 as asynchronous warpgroup MMAs
(`warpgroup_mma`), waits for the scores only, and runs tile j's softmax while P(j-1) @ V(j-1)
is still on the tensor cores: the order FlashAttention-3 calls intra-warpgroup overlap. The
K/V tiles are gathered page by page (`cp.async`, 16-byte rows through the block table) into
STAGES shared-memory buffers, tile j + STAGES - 2 issued while tile j is computed.

Grid as `_prefill_kernel`'s with GQA packing: (query tiles, KV heads), a tile's BLOCK_M rows
are BLOCK_M / GROUP positions of the GROUP query heads that share a KV head, position-major. The
query tiles are (sequence, query block) for a dense grid (`dense_blocks` > 0, optionally longest
first) or numbered sequence by sequence and found by a scan of the query starts
(`_tile_owner`); SKIP_SINGLE leaves one-row sequences to the decode kernel.

Numerics as the Triton kernel: fp16 / bf16 MMA operands, float32 scores, softmax statistics and
accumulator; the probabilities are rounded to q's dtype for P @ V after their sum is taken. Must
never read KV positions at or past a row's context, nor the block table there (masked copies
read nothing and fill zeros).
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .attention_common_triton import _dense_tile

_barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier  # Triton 3.7 / 3.6 name

# (BLOCK_M, BLOCK_N, num_warps, STAGES): one warpgroup of 64 query rows, 64-key tiles, three K/V
# buffers (one tile of lead for the copies). Shared memory q 16 KB + 3 x 32 KB and 148 registers,
# so two programs share a SM and one's softmax also overlaps the other's MMAs. H200, 2026-11-30
# (bench/int8_prefill.py --gluon, Qwen3-0.6B heads, against the Triton kernel's default tiles):
# two 1k-token chunks over 2k cached tokens 1.58x (54% of the bf16 matmul peak), four 512-token
# chunks 1.62x, 16 fresh prompts 1.54x, 8 prompts beside 192 decode rows 1.71x; 128 x 64 with
# two warpgroups (one program a SM) 1.08-1.44x, 128 x 128 1.08-1.48x.
GLUON_TILES = (64, 64, 4, 3)


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def _tile_owner(qsl_ptr, num_seqs, tile, PACK: gl.constexpr, BLOCK_M: gl.constexpr,
                SEQ_CHUNK: gl.constexpr, SKIP_SINGLE: gl.constexpr, num_warps: gl.constexpr):
    """(sequence, query block) of the step's `tile`-th query tile: the Triton kernel's
    `_tile_owner` (attention_prefill_triton.py), the same scan."""
    lay: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
    before = 0
    start = 0
    carry = 0
    for base in range(0, num_seqs, SEQ_CHUNK):
        offs = base + gl.arange(0, SEQ_CHUNK, layout=lay)
        valid = offs < num_seqs
        lo = gl.load(qsl_ptr + offs, mask=valid, other=0)
        hi = gl.load(qsl_ptr + offs + 1, mask=valid, other=0)
        rows = hi - lo
        if SKIP_SINGLE:
            rows = gl.where(rows == 1, 0, rows)
        count = gl.where(valid, rows * PACK + BLOCK_M - 1, 0) // BLOCK_M
        ends = gl.associative_scan(count, 0, _add) + carry
        done = valid & (ends <= tile)
        before += gl.sum(done.to(gl.int32), 0)
        start = gl.maximum(start, gl.max(gl.where(done, ends, 0), 0))
        carry += gl.sum(count, 0)
    return before, tile - start


@gluon.jit
def _program_rows(qsl_ptr, lens_ptr, num_seqs, dense_blocks, GROUP: gl.constexpr,
                  BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, SEQ_CHUNK: gl.constexpr,
                  LONGEST_FIRST: gl.constexpr, SKIP_SINGLE: gl.constexpr, num_warps: gl.constexpr):
    """This program's query tile: (sequence, query block, KV head, the sequence's first query
    row, its query length (0 for a tile past the step's last or a skipped one-row sequence), its
    context, the end of the keys every row sees (whole BLOCK_N tiles), the end of the keys any
    row sees)."""
    hid = gl.program_id(1)  # a group of GROUP query heads: KV head `hid`
    if dense_blocks > 0:  # a grid over (sequence, query block): few sequences, none padded
        seq, mblk, hid = _dense_tile(gl.program_id(0), gl.program_id(1), gl.num_programs(0),
                                     gl.num_programs(1), dense_blocks, LONGEST_FIRST)
    else:
        seq, mblk = _tile_owner(qsl_ptr, num_seqs, gl.program_id(0), GROUP, BLOCK_M, SEQ_CHUNK,
                                SKIP_SINGLE, num_warps)
    owned = seq < num_seqs
    seq = gl.minimum(seq, num_seqs - 1)
    row0 = gl.load(qsl_ptr + seq)
    q_len = gl.where(owned, gl.load(qsl_ptr + seq + 1) - row0, 0)
    if SKIP_SINGLE:
        q_len = gl.where(q_len == 1, 0, q_len)
    ctx = gl.load(lens_ptr + seq)
    first_m = (mblk * BLOCK_M) // GROUP
    active = first_m < q_len
    first_pos = ctx - q_len + first_m
    # Keys before the block's first query position are visible to every row: whole tiles of
    # them skip the mask; the rest (up to the last row's position) take it.
    full_hi = gl.where(active, (first_pos // BLOCK_N) * BLOCK_N, 0)
    last_pos = ctx - q_len + gl.minimum((mblk * BLOCK_M + BLOCK_M - 1) // GROUP, q_len - 1)
    hi = gl.where(active, gl.minimum(ctx, last_pos + 1), 0)
    return seq, mblk, hid, row0, q_len, ctx, full_hi, hi


@gluon.jit
def _load_q(q_ptr, row0, q_len, mblk, hid, sq_t, sq_h, GROUP: gl.constexpr,
            BLOCK_M: gl.constexpr, BLOCK_D: gl.constexpr, ld_l: gl.constexpr):
    """The tile's q rows: row r is position r // GROUP of head hid * GROUP + r % GROUP (rows
    past the query read as 0)."""
    r_ld = mblk * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, ld_l))
    d_ld = gl.arange(0, BLOCK_D, layout=gl.SliceLayout(0, ld_l))
    m_ld = r_ld // GROUP
    q_at = (row0 + m_ld).to(gl.int64) * sq_t + (hid * GROUP + r_ld % GROUP) * sq_h
    q_ok = gl.expand_dims(m_ld < q_len, 1) & gl.expand_dims(d_ld < BLOCK_D, 0)
    return gl.load(q_ptr + gl.expand_dims(q_at, 1) + gl.expand_dims(d_ld, 0), mask=q_ok, other=0.0)


@gluon.jit
def _masked(s, start, full_hi, hi, q_pos, BLOCK_N: gl.constexpr, col_s: gl.constexpr):
    """Scores of key tile [start, start+BLOCK_N) with -inf where a key is past the context or
    after the row's own position; tiles wholly below `full_hi` are returned as they are."""
    if start + BLOCK_N > full_hi:  # the diagonal, or the context's end
        n = start + gl.arange(0, BLOCK_N, layout=col_s)
        seen = gl.expand_dims(n < hi, 0) & (gl.expand_dims(n, 0) <= gl.expand_dims(q_pos, 1))
        s = gl.where(seen, s, float("-inf"))
    return s


@gluon.jit
def _softmax_step(s, m_i, l_i, scale_log2):
    """Raw scores of one tile (masked columns -inf) into the running state: (probabilities,
    the rescale of what came before, new max, new sum), in log2 units of `scale_log2`. Every
    row sees key 0 in the first tile, so the max is finite from then on."""
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * scale_log2)
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s * scale_log2 - gl.expand_dims(m_new, 1))
    return p, alpha, m_new, l_i * alpha + gl.sum(p, axis=1)


@gluon.jit
def _store_o(out_ptr, acc, l_i, row0, q_len, mblk, hid, so_t, so_h, GROUP: gl.constexpr,
             BLOCK_M: gl.constexpr, BLOCK_D: gl.constexpr, o_l: gl.constexpr):
    """acc / l into the query's rows of `out` (rows past the query are not written)."""
    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_l))
    o = acc / gl.expand_dims(gl.where(l_o == 0.0, 1.0, l_o), 1)
    r_o = mblk * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_l))
    d_o = gl.arange(0, BLOCK_D, layout=gl.SliceLayout(0, o_l))
    m_o = r_o // GROUP
    o_at = (row0 + m_o).to(gl.int64) * so_t + (hid * GROUP + r_o % GROUP) * so_h
    o_ok = gl.expand_dims(m_o < q_len, 1) & gl.expand_dims(d_o < BLOCK_D, 0)
    gl.store(out_ptr + gl.expand_dims(o_at, 1) + gl.expand_dims(d_o, 0),
             o.to(out_ptr.dtype.element_ty), mask=o_ok)


@gluon.jit
def _issue_tile(k_smem, v_smem, k_head, v_head, bt_row, start, hi, sk_b, sk_s, sv_b, sv_s,
                PAGE: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr,
                ld_l: gl.constexpr):
    """Copies of K and V (16-bit values, or int8 codes for the int8 kernel) for tokens
    [start, start+BLOCK_N) below `hi` into one buffer of each, as one commit group, each thread
    copying the row pieces `ld_l` gives it; tokens at or past `hi` read nothing (not even the
    block table)."""
    tok = start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ld_l))
    ok = tok < hi
    blk = gl.load(bt_row + tok // PAGE, mask=ok, other=0).to(gl.int64)
    pos = (tok % PAGE).to(gl.int64)
    d = gl.arange(0, BLOCK_D, layout=gl.SliceLayout(0, ld_l))
    mask = gl.expand_dims(ok, 1) & gl.expand_dims(d < BLOCK_D, 0)
    cp.async_copy_global_to_shared(k_smem, gl.expand_dims(k_head + blk * sk_b + pos * sk_s, 1)
                                   + gl.expand_dims(d, 0), mask=mask)
    cp.async_copy_global_to_shared(v_smem, gl.expand_dims(v_head + blk * sv_b + pos * sv_s, 1)
                                   + gl.expand_dims(d, 0), mask=mask)
    cp.commit_group()


@gluon.jit(do_not_specialize=["s_bt", "num_seqs", "dense_blocks"])  # they vary per step
def _prefill_gluon_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, qsl_ptr, lens_ptr, out_ptr, scale_log2,
                          num_seqs, dense_blocks, sq_t, sq_h, sk_b, sk_s, sk_h, sv_b, sv_s, sv_h,
                          s_bt, so_t, so_h,
                          GROUP: gl.constexpr, PAGE: gl.constexpr, BLOCK_M: gl.constexpr,
                          BLOCK_N: gl.constexpr, STAGES: gl.constexpr, SEQ_CHUNK: gl.constexpr,
                          LONGEST_FIRST: gl.constexpr, SKIP_SINGLE: gl.constexpr,
                          num_warps: gl.constexpr):
    BLOCK_D: gl.constexpr = 128
    gl.static_assert(STAGES >= 3, "the copies of tile j + STAGES - 2 need a free buffer")
    dt: gl.constexpr = q_ptr.dtype.element_ty
    s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BLOCK_N, 16])
    o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BLOCK_D, 16])
    p_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=2)
    ld_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    sw_l: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_l)
    col_s: gl.constexpr = gl.SliceLayout(0, s_l)

    seq, mblk, hid, row0, q_len, ctx, full_hi, hi = _program_rows(
        qsl_ptr, lens_ptr, num_seqs, dense_blocks, GROUP, BLOCK_M, BLOCK_N, SEQ_CHUNK,
        LONGEST_FIRST, SKIP_SINGLE, num_warps)
    q = _load_q(q_ptr, row0, q_len, mblk, hid, sq_t, sq_h, GROUP, BLOCK_M, BLOCK_D, ld_l)
    q_smem = gl.allocate_shared_memory(dt, [BLOCK_M, BLOCK_D], sw_l, q)
    k_smem = gl.allocate_shared_memory(dt, [STAGES, BLOCK_N, BLOCK_D], sw_l)
    v_smem = gl.allocate_shared_memory(dt, [STAGES, BLOCK_N, BLOCK_D], sw_l)
    # The first iteration's P @ V reads the last buffer with P = 0: zeros, never junk (0 * NaN).
    v_smem.index(STAGES - 1).store(gl.zeros([BLOCK_N, BLOCK_D], dt, ld_l))

    bt_row = bt_ptr + seq.to(gl.int64) * s_bt
    k_head = k_ptr + hid * sk_h
    v_head = v_ptr + hid * sv_h
    for t in gl.static_range(STAGES - 2):
        _issue_tile(k_smem.index(t), v_smem.index(t), k_head, v_head, bt_row, t * BLOCK_N, hi,
                    sk_b, sk_s, sv_b, sv_s, PAGE, BLOCK_N, BLOCK_D, ld_l)

    q_pos = ctx - q_len + (mblk * BLOCK_M + gl.arange(0, BLOCK_M, layout=row_s)) // GROUP
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_s)
    l_i = gl.full([BLOCK_M], 0.0, gl.float32, row_s)
    acc = gl.zeros([BLOCK_M, BLOCK_D], gl.float32, o_l)
    p = gl.zeros([BLOCK_M, BLOCK_N], dt, p_l)
    s0 = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_l)
    n_tiles = gl.cdiv(hi, BLOCK_N)
    for j in range(n_tiles):
        cp.wait_group(STAGES - 3)  # tile j's copies from this thread have landed
        fence_async_shared()  # ... and are visible to the tensor cores,
        _barrier()  # from every thread; every warp is past tile j-1, so buffer j-2 is free
        nxt = j + STAGES - 2
        _issue_tile(k_smem.index(nxt % STAGES), v_smem.index(nxt % STAGES), k_head, v_head,
                    bt_row, nxt * BLOCK_N, hi, sk_b, sk_s, sv_b, sv_s, PAGE, BLOCK_N, BLOCK_D,
                    ld_l)
        s = warpgroup_mma(q_smem, k_smem.index(j % STAGES).permute((1, 0)), s0, use_acc=False,
                          is_async=True)
        acc = warpgroup_mma(p, v_smem.index((j + STAGES - 1) % STAGES), acc, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s, ))
        s = _masked(s, j * BLOCK_N, full_hi, hi, q_pos, BLOCK_N, col_s)
        p32, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, scale_log2)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_l)), 1)
        p = gl.convert_layout(p32.to(dt), p_l)
    acc = warpgroup_mma(p, v_smem.index((n_tiles + STAGES - 1) % STAGES), acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    cp.wait_group(0)

    _store_o(out_ptr, acc, l_i, row0, q_len, mblk, hid, so_t, so_h, GROUP, BLOCK_M, BLOCK_D, o_l)


def gluon_shapes_fit(q, k_cache, v_cache, out, splits: int, pack: int) -> bool:
    """What both Gluon prefill kernels are written for, whatever the cache's dtype: CUDA sm_90,
    fp16 / bf16 q, head_dim 128, unit strides along it, GQA packing whose group divides the
    tile, no split KV."""
    return (q.is_cuda and splits == 1 and q.dtype in (torch.float16, torch.bfloat16)
            and q.shape[2] == 128 and pack == q.shape[1] // k_cache.shape[2]
            and GLUON_TILES[0] % pack == 0
            and torch.cuda.get_device_capability(q.device)[0] == 9
            and q.stride(2) == k_cache.stride(3) == v_cache.stride(3) == out.stride(2) == 1)


def prefill_gluon_fits(q, k_cache, v_cache, out, splits: int, pack: int) -> bool:
    """Whether `_prefill_gluon_kernel` takes a prefill call: `gluon_shapes_fit` over a cache of
    q's dtype."""
    return (k_cache.dtype == q.dtype and v_cache.dtype == q.dtype
            and gluon_shapes_fit(q, k_cache, v_cache, out, splits, pack))
