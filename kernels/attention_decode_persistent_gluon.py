"""Persistent decode attention over float (bf16 / fp16) caches, in Gluon.

Owns: `_decode_persistent_kernel` (plain decode rows, head_dim 128, CUDA sm_80+) and
`persistent_grid` (how many programs, and the rounds each may take).

Why: `_decode_kernel` runs one program per (sequence, KV head, partition). At batch 256 that is
2,048 programs in five waves of three a SM, and each program pays a chain of dependent loads
(its sequence, its block ids, its first K tile) before its first tile's compute, with no load in
flight while it starts or ends: with contexts of 10-20 tokens a layer's decode attention still
took 28 us (bench/RESULTS.md, "Workload A throughput"). Here a grid of as many programs as the
GPU holds at once walks every (sequence, KV head, partition) item, and one program's tiles form a
single stream across its items: the next item's first K/V tile and query rows are in flight
while the current item's last tile computes and its output is stored.

Items: `lin` in [0, seqs x splits x kv_heads): the sequence of rank `lin // (splits x kv_heads)`
in `order` (longest context first), its partition `(lin // kv_heads) % splits` and KV head
`lin % kv_heads`, so items come about longest first (a sequence's partitions are equal but for
the last). Program p takes item r x P + p in even rounds r and r x P + (P - 1 - p) in odd ones
(a snake: the program that took the longest item of one round takes the shortest of the next),
which keeps the programs' totals within about one item of each other. A program
reads its rounds' metadata once, as vectors of MAX_ROUNDS lanes, and skips items whose range is
empty (a padded row, a partition past a short context).

Pipeline (one K and one V buffer, as in kernels/attention_decode_gluon.py): three cursors walk
the tile stream, one tile apart: block ids are loaded two tiles ahead, copies issued one tile
ahead (K(t+1) once K(t) has been read into registers, V(t+1) once V(t) has), and tile t
computes. An item's query rows ride in its first tile's K copy group.

Numerics: `_decode_kernel`'s for float caches (16-bit q @ K^T and P @ V on tensor cores, float32
scores, softmax state and accumulator, base-2 exponent); partitions and their partial outputs
as `_split_part` and `_reduce_kernel` expect. Must never read KV positions at or past a row's
context (masked copies read nothing) nor the block table for a masked lane.
"""

from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from .attention_decode_gluon import _barrier, _tile_blocks
from .attention_decode_tile_triton import _softmax_step, _split_part
from .pdl_gluon import pdl_gluon

MAX_ROUNDS = gl.constexpr(32)  # items a program may take (one lane each of the metadata vectors)


def persistent_grid(items: int, resident: int, sms: int, programs: int | None = None) -> int:
    """Programs for `items` items: as many as `resident` a SM keep at once (or `programs`),
    never more than the items, and enough that no program takes more than MAX_ROUNDS."""
    want = programs if programs else resident * sms
    return max(1, min(items, want), triton.cdiv(items, MAX_ROUNDS.value))


@gluon.jit
def _program_items(order_ptr, qsl_ptr, lens_ptr, num_seqs, num_splits, KV_HEADS: gl.constexpr,
                   SPLIT: gl.constexpr, ORDERED: gl.constexpr, BLOCK_N: gl.constexpr,
                   MAX_R: gl.constexpr, lane_l: gl.constexpr):
    """This program's items, one lane each (module docstring): (lanes, tiles, lo, hi, sequence,
    query row, KV head, partition) vectors, and the tiles they hold in all. An item without a
    one-row query (a mixed step's prompt, a padded row) or past the items has no tiles."""
    p = gl.program_id(0)
    nprog = gl.num_programs(0)
    lanes = gl.arange(0, MAX_R, layout=lane_l)
    lin = lanes * nprog + gl.where(lanes % 2 == 0, p, nprog - 1 - p)
    valid = lin < num_seqs * num_splits * KV_HEADS
    rank = lin // (num_splits * KV_HEADS)
    split_v = (lin // KV_HEADS) % num_splits
    kvh_v = lin % KV_HEADS
    if ORDERED:
        seq_v = gl.load(order_ptr + rank, mask=valid, other=0)
    else:
        seq_v = rank
    row_v = gl.load(qsl_ptr + seq_v, mask=valid, other=0)
    one_row = (gl.load(qsl_ptr + seq_v + 1, mask=valid, other=0) - row_v) == 1
    ctx_v = gl.where(one_row, gl.load(lens_ptr + seq_v, mask=valid & one_row, other=0), 0)
    if SPLIT:
        part = _split_part(ctx_v, num_splits, BLOCK_N)
        lo_v = split_v * part
        hi_v = gl.maximum(gl.minimum(lo_v + part, ctx_v), lo_v)
    else:
        lo_v = gl.zeros_like(ctx_v)
        hi_v = ctx_v
    n_v = gl.where(valid, gl.cdiv(hi_v - lo_v, BLOCK_N), 0)
    return lanes, n_v, lo_v, hi_v, seq_v, row_v, kvh_v, split_v, gl.sum(n_v, axis=0)


@gluon.jit
def _pick(vec, lanes, j):
    """Lane j of a metadata vector (0 where no lane is j)."""
    return gl.sum(gl.where(lanes == j, vec, 0), axis=0)


@gluon.jit
def _item(j_from, lanes, n_v, lo_v, hi_v, seq_v, row_v, kvh_v, split_v, MAX_R: gl.constexpr):
    """The first item at lane >= j_from with tiles: (lane, lo, hi, seq, row, kvh, split); lane
    MAX_R and empty ranges once there is none."""
    j = gl.min(gl.where((lanes >= j_from) & (n_v > 0), lanes, MAX_R), axis=0)
    return (j, _pick(lo_v, lanes, j), _pick(hi_v, lanes, j), _pick(seq_v, lanes, j),
            _pick(row_v, lanes, j), _pick(kvh_v, lanes, j), _pick(split_v, lanes, j))


@gluon.jit
def _advance(j, start, lo, hi, seq, row, kvh, split, lanes, n_v, lo_v, hi_v, seq_v, row_v, kvh_v,
             split_v, BLOCK_N: gl.constexpr, MAX_R: gl.constexpr):
    """The cursor's next tile: the next BLOCK_N tokens of its item, else the next item's first."""
    nxt = start + BLOCK_N
    if nxt >= hi:
        j, lo, hi, seq, row, kvh, split = _item(j + 1, lanes, n_v, lo_v, hi_v, seq_v, row_v,
                                                kvh_v, split_v, MAX_R)
        nxt = lo
    return j, nxt, lo, hi, seq, row, kvh, split


@gluon.jit
def _seq_blocks(bt_ptr, s_bt, seq, start, hi, PAGE: gl.constexpr, BLOCK_N: gl.constexpr,
                tok_l: gl.constexpr):
    """`_tile_blocks` of sequence `seq`'s block-table row."""
    return _tile_blocks(bt_ptr + seq.to(gl.int64) * s_bt, start, hi, PAGE, BLOCK_N, tok_l)


@gluon.jit
def _issue_rows(smem, head, blk, start, hi, s_b, s_s, PAGE: gl.constexpr, BLOCK_N: gl.constexpr,
                BLOCK_D: gl.constexpr, tok_l: gl.constexpr, tile_l: gl.constexpr):
    """Copies of the K or V rows of tokens [start, start+BLOCK_N) below `hi` (`blk` their
    blocks) into `smem`; tokens at or past `hi` copy nothing (their rows are zero-filled)."""
    tok = start + gl.arange(0, BLOCK_N, layout=tok_l)
    ok = gl.convert_layout(tok < hi, gl.SliceLayout(1, tile_l))
    at = blk.to(gl.int64) * s_b + (tok % PAGE) * s_s  # widened here: no wait on the early load
    rows = gl.convert_layout(head + at, gl.SliceLayout(1, tile_l))
    d = gl.arange(0, BLOCK_D, layout=gl.SliceLayout(0, tile_l))
    cp.async_copy_global_to_shared(smem, gl.expand_dims(rows, 1) + gl.expand_dims(d, 0),
                                   mask=gl.expand_dims(ok, 1) & gl.expand_dims(d < BLOCK_D, 0))


@gluon.jit(do_not_specialize=["num_seqs", "num_splits", "s_bt", "spo_s", "spo_h", "spl_s", "spl_h"])
def _decode_persistent_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, qsl_ptr, lens_ptr, order_ptr, out_ptr,
                              po_ptr, plse_ptr, scale_log2, num_seqs, num_splits,
                              sq_t, sq_h, sk_b, sk_s, sk_h, sv_b, sv_s, sv_h, s_bt,
                              so_t, so_h, spo_s, spo_h, spo_p, spl_s, spl_h,
                              KV_HEADS: gl.constexpr, SPLIT: gl.constexpr, GROUP: gl.constexpr,
                              PAGE: gl.constexpr, BLOCK_N: gl.constexpr, ORDERED: gl.constexpr,
                              PDL: gl.constexpr = False):
    """A program walks its rounds' items (module docstring); 4 warps, 16 padded query rows,
    head_dim 128. SPLIT (`num_splits` > 1) writes partial outputs for `_reduce_kernel`, else `out`."""
    BLOCK_G: gl.constexpr = 16
    BLOCK_D: gl.constexpr = 128
    MAX_R: gl.constexpr = MAX_ROUNDS
    dtype: gl.constexpr = k_ptr.dtype.element_ty
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 4],
                                                  instr_shape=[16, 8])
    a16: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b16: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    row_l: gl.constexpr = gl.SliceLayout(1, mma)
    col_l: gl.constexpr = gl.SliceLayout(0, mma)
    lane_l: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    tok_l: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    # 16 threads copy one 256-byte row in 16-byte pieces; 8 rows a pass of 4 warps
    tile_l: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
    kv_sl: gl.constexpr = gl.SwizzledSharedLayout(8, 1, 8, [1, 0])

    pdl_gluon(PDL, False)
    pdl_gluon(PDL, True)  # q, this step's K/V rows and the order come from kernels before

    lanes, n_v, lo_v, hi_v, seq_v, row_v, kvh_v, split_v, tiles = _program_items(
        order_ptr, qsl_ptr, lens_ptr, num_seqs, num_splits, KV_HEADS, SPLIT, ORDERED, BLOCK_N,
        MAX_R, lane_l)

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_G, BLOCK_D], kv_sl)
    k_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_D], kv_sl)
    v_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_D], kv_sl)
    g_q = gl.arange(0, BLOCK_G, layout=gl.SliceLayout(1, tile_l))
    d_q = gl.arange(0, BLOCK_D, layout=gl.SliceLayout(0, tile_l))
    q_cols = gl.expand_dims(g_q * sq_h, 1) + gl.expand_dims(d_q, 0)
    q_ok = gl.expand_dims(g_q < GROUP, 1) & gl.expand_dims(d_q < BLOCK_D, 0)

    # Cursors: c computes, i has its copies issued, b has its block ids loaded
    cj, clo, chi, cseq, crow, ckvh, csplit = _item(0, lanes, n_v, lo_v, hi_v, seq_v, row_v, kvh_v,
                                                   split_v, MAX_R)
    cs = clo
    blk = _seq_blocks(bt_ptr, s_bt, cseq, cs, chi, PAGE, BLOCK_N, tok_l)
    cp.async_copy_global_to_shared(q_smem, q_ptr + crow.to(gl.int64) * sq_t + ckvh * GROUP * sq_h + q_cols,
                                   mask=q_ok & (cs < chi))
    _issue_rows(k_smem, k_ptr + ckvh * sk_h, blk, cs, chi, sk_b, sk_s, PAGE, BLOCK_N, BLOCK_D,
                tok_l, tile_l)
    cp.commit_group()
    _issue_rows(v_smem, v_ptr + ckvh * sv_h, blk, cs, chi, sv_b, sv_s, PAGE, BLOCK_N, BLOCK_D,
                tok_l, tile_l)
    cp.commit_group()
    ij, i_s, ilo, ihi, iseq, irow, ikvh, isplit = _advance(cj, cs, clo, chi, cseq, crow, ckvh, csplit,
                                                           lanes, n_v, lo_v, hi_v, seq_v, row_v,
                                                           kvh_v, split_v, BLOCK_N, MAX_R)
    blk_i = _seq_blocks(bt_ptr, s_bt, iseq, i_s, ihi, PAGE, BLOCK_N, tok_l)
    bj, bs, blo, bhi, bseq, brow, bkvh, bsplit = _advance(ij, i_s, ilo, ihi, iseq, irow, ikvh, isplit,
                                                          lanes, n_v, lo_v, hi_v, seq_v, row_v,
                                                          kvh_v, split_v, BLOCK_N, MAX_R)

    g = gl.arange(0, BLOCK_G, layout=row_l)
    d = gl.arange(0, BLOCK_D, layout=col_l)
    o_ok = gl.expand_dims(g < GROUP, 1) & gl.expand_dims(d < BLOCK_D, 0)
    m_i = gl.full([BLOCK_G], float("-inf"), gl.float32, row_l)
    l_i = gl.full([BLOCK_G], 0.0, gl.float32, row_l)
    acc = gl.full([BLOCK_G, BLOCK_D], 0.0, gl.float32, mma)
    for _ in range(tiles):
        blk_b = _seq_blocks(bt_ptr, s_bt, bseq, bs, bhi, PAGE, BLOCK_N, tok_l)
        cp.wait_group(1)  # K(c) (and c's query rows) are in; V(c) may still be on its way
        _barrier()
        q = q_smem.load(a16)
        k_t = k_smem.permute([1, 0]).load(b16)
        _barrier()  # every warp has K(c) and the query rows: the buffers take i's
        if i_s == ilo:
            cp.async_copy_global_to_shared(q_smem, q_ptr + irow.to(gl.int64) * sq_t + ikvh * GROUP * sq_h + q_cols,
                                           mask=q_ok & (i_s < ihi))
        _issue_rows(k_smem, k_ptr + ikvh * sk_h, blk_i, i_s, ihi, sk_b, sk_s, PAGE, BLOCK_N,
                    BLOCK_D, tok_l, tile_l)
        cp.commit_group()
        s = mma_v2(q, k_t, gl.full([BLOCK_G, BLOCK_N], 0.0, gl.float32, mma)) * scale_log2
        tok_ok = (cs + gl.arange(0, BLOCK_N, layout=col_l)) < chi
        s = gl.where(gl.expand_dims(tok_ok, 0), s, float("-inf"))
        first = cs == clo  # a new item: its softmax state starts over (alpha = 0 below)
        m_i = gl.where(first, float("-inf"), m_i)
        l_i = gl.where(first, 0.0, l_i)
        pr, alpha, m_i, l_i = _softmax_step(s, m_i, l_i)
        cp.wait_group(1)  # V(c) is in; K(i) may still be on its way
        _barrier()
        v = v_smem.load(b16)
        _barrier()  # every warp has V(c): its buffer takes V(i)
        _issue_rows(v_smem, v_ptr + ikvh * sv_h, blk_i, i_s, ihi, sv_b, sv_s, PAGE, BLOCK_N,
                    BLOCK_D, tok_l, tile_l)
        cp.commit_group()
        acc = mma_v2(gl.convert_layout(pr.to(dtype), a16), v, acc * gl.expand_dims(alpha, 1))
        if cs + BLOCK_N >= chi:  # c's last tile: its output
            l_safe = gl.where(l_i == 0.0, 1.0, l_i)
            o = acc / gl.expand_dims(l_safe, 1)
            heads = ckvh * GROUP + g
            if SPLIT:
                po = po_ptr + cseq.to(gl.int64) * spo_s + csplit * spo_p
                gl.store(po + gl.expand_dims(heads * spo_h, 1) + gl.expand_dims(d, 0), o, mask=o_ok)
                gl.store(plse_ptr + cseq.to(gl.int64) * spl_s + heads * spl_h + csplit,
                         m_i + gl.log2(l_safe), mask=g < GROUP)
            else:
                dst = out_ptr + crow.to(gl.int64) * so_t + gl.expand_dims(heads * so_h, 1) + gl.expand_dims(d, 0)
                gl.store(dst, o.to(out_ptr.dtype.element_ty), mask=o_ok)
        cj, cs, clo, chi, cseq, crow, ckvh, csplit = ij, i_s, ilo, ihi, iseq, irow, ikvh, isplit
        ij, i_s, ilo, ihi, iseq, irow, ikvh, isplit = bj, bs, blo, bhi, bseq, brow, bkvh, bsplit
        blk_i = blk_b
        bj, bs, blo, bhi, bseq, brow, bkvh, bsplit = _advance(bj, bs, blo, bhi, bseq, brow, bkvh, bsplit,
                                                              lanes, n_v, lo_v, hi_v, seq_v, row_v,
                                                              kvh_v, split_v, BLOCK_N, MAX_R)
    cp.wait_group(0)
