"""Persistent decode attention over int8 caches, in Gluon.

Owns: `_decode_persistent_int8_kernel` (plain decode rows, head_dim 128, 128-token tiles, CUDA
sm_80+).

The grid, the items, the snake over rounds and the three cursors are those of
`_decode_persistent_kernel` (kernels/attention_decode_persistent_gluon.py, whose helpers this
uses); a tile's work is that of `_decode_int8_gluon_kernel` (kernels/attention_decode_gluon.py):
K codes and their scales in one copy group, V codes and theirs in the next, each issued as soon
as the tile before has left its buffer. An item's query rows ride in its first tile's K group
and are quantized once, at that tile, by the KV append's rule.

Numerics: the `mma_k` method exactly (int8 q @ K^T on int8 tensor cores, V codes to fp16 by the
0x6480 trick, V scales on the probability columns, float32 softmax and accumulator), so the
outputs equal `_decode_int8_gluon_kernel`'s where both run a context whole. Must never read KV
positions at or past a row's context nor the block table for a masked lane.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from .attention_decode_gluon import _codes_f16
from .attention_decode_persistent_gluon import (MAX_ROUNDS, _advance, _issue_rows, _item,
                                                _program_items, _tile_blocks)
from .pdl_gluon import pdl_gluon

_barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier  # Triton 3.7 / 3.6 name


@gluon.jit
def _issue_scales(sc_smem, sc_head, blk, start, hi, sc_b, PAGE: gl.constexpr,
                  BLOCK_N: gl.constexpr, tok_l: gl.constexpr):
    """Copies of the per-token scales of tokens [start, start+BLOCK_N) below `hi`."""
    tok = start + gl.arange(0, BLOCK_N, layout=tok_l)
    cp.async_copy_global_to_shared(sc_smem, sc_head + blk.to(gl.int64) * sc_b + tok % PAGE,
                                   mask=tok < hi)


@gluon.jit
def _quantize_q(q_smem, q_l: gl.constexpr, a8: gl.constexpr, row_l: gl.constexpr):
    """The query rows in shared memory as int8 codes per row (the KV append's rule: scale
    max|x| / 127, round half up) and the rows' scales."""
    q = q_smem.load(q_l).to(gl.float32)
    amax = gl.max(gl.abs(q), axis=1)
    inv = gl.div_rn(gl.full(amax.shape, 127.0, gl.float32, amax.type.layout), gl.where(amax > 0.0, amax, 1.0))
    inv = gl.where(amax > 0.0, inv, 0.0)
    r = gl.floor(q * gl.expand_dims(inv, 1) + 0.5)
    q8 = gl.convert_layout(gl.minimum(gl.maximum(r, -127.0), 127.0).to(gl.int8), a8)
    scl = gl.div_rn(amax, gl.full(amax.shape, 127.0, gl.float32, amax.type.layout))
    return q8, gl.convert_layout(scl, row_l)


@gluon.jit(do_not_specialize=["num_seqs", "num_splits", "s_bt", "spo_s", "spo_h", "spl_s", "spl_h"])
def _decode_persistent_int8_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, bt_ptr, qsl_ptr, lens_ptr,
                                   order_ptr, out_ptr, po_ptr, plse_ptr, scale_log2, num_seqs,
                                   num_splits, sq_t, sq_h, sk_b, sk_s, sk_h, sv_b, sv_s, sv_h,
                                   sks_b, sks_h, svs_b, svs_h, s_bt, so_t, so_h, spo_s, spo_h,
                                   spo_p, spl_s, spl_h,
                                   KV_HEADS: gl.constexpr, SPLIT: gl.constexpr,
                                   GROUP: gl.constexpr, PAGE: gl.constexpr, BLOCK_N: gl.constexpr,
                                   ORDERED: gl.constexpr, PDL: gl.constexpr = False):
    """A program walks its rounds' items (`_decode_persistent_kernel`); 4 warps, 16 padded query
    rows, head_dim 128. SPLIT (`num_splits` > 1) writes partial outputs for `_reduce_kernel`."""
    BLOCK_G: gl.constexpr = 16
    BLOCK_D: gl.constexpr = 128
    MAX_R: gl.constexpr = MAX_ROUNDS
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 4],
                                                  instr_shape=[16, 8])
    a8: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
    b8: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=4)
    a16: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b16: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    row_l: gl.constexpr = gl.SliceLayout(1, mma)
    col_l: gl.constexpr = gl.SliceLayout(0, mma)
    lane_l: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    tok_l: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    code_l: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])  # 16-byte copies
    q_l: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
    # V's conversion layout (as `_decode_int8_gluon_kernel`'s): no bank conflicts
    v_l: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
    code_sl: gl.constexpr = gl.SwizzledSharedLayout(16, 1, 8, [1, 0])
    half_sl: gl.constexpr = gl.SwizzledSharedLayout(8, 1, 8, [1, 0])
    sc_sl: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])

    pdl_gluon(PDL, False)
    pdl_gluon(PDL, True)  # q, this step's K/V rows and the order come from kernels before
    lanes, n_v, lo_v, hi_v, seq_v, row_v, kvh_v, split_v, tiles = _program_items(
        order_ptr, qsl_ptr, lens_ptr, num_seqs, num_splits, KV_HEADS, SPLIT, ORDERED, BLOCK_N,
        MAX_R, lane_l)

    q_smem = gl.allocate_shared_memory(q_ptr.dtype.element_ty, [BLOCK_G, BLOCK_D], half_sl)
    k_smem = gl.allocate_shared_memory(gl.int8, [BLOCK_N, BLOCK_D], code_sl)
    v_smem = gl.allocate_shared_memory(gl.int8, [BLOCK_N, BLOCK_D], code_sl)
    ks_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_N], sc_sl)
    vs_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_N], sc_sl)
    vh_smem = gl.allocate_shared_memory(gl.float16, [BLOCK_N, BLOCK_D], half_sl)
    g_q = gl.arange(0, BLOCK_G, layout=gl.SliceLayout(1, q_l))
    d_q = gl.arange(0, BLOCK_D, layout=gl.SliceLayout(0, q_l))
    q_cols = gl.expand_dims(g_q * sq_h, 1) + gl.expand_dims(d_q, 0)
    q_ok = gl.expand_dims(g_q < GROUP, 1) & gl.expand_dims(d_q < BLOCK_D, 0)

    # Cursors: c computes, i has its copies issued, b has its block ids loaded
    cj, clo, chi, cseq, crow, ckvh, csplit = _item(0, lanes, n_v, lo_v, hi_v, seq_v, row_v, kvh_v,
                                                   split_v, MAX_R)
    cs = clo
    blk = _tile_blocks(bt_ptr, s_bt, cseq, cs, chi, PAGE, BLOCK_N, tok_l)
    cp.async_copy_global_to_shared(q_smem, q_ptr + crow.to(gl.int64) * sq_t + ckvh * GROUP * sq_h + q_cols,
                                   mask=q_ok & (cs < chi))
    _issue_rows(k_smem, k_ptr + ckvh * sk_h, blk, cs, chi, sk_b, sk_s, PAGE, BLOCK_N, BLOCK_D,
                tok_l, code_l)
    _issue_scales(ks_smem, ks_ptr + ckvh * sks_h, blk, cs, chi, sks_b, PAGE, BLOCK_N, tok_l)
    cp.commit_group()
    _issue_rows(v_smem, v_ptr + ckvh * sv_h, blk, cs, chi, sv_b, sv_s, PAGE, BLOCK_N, BLOCK_D,
                tok_l, code_l)
    _issue_scales(vs_smem, vs_ptr + ckvh * svs_h, blk, cs, chi, svs_b, PAGE, BLOCK_N, tok_l)
    cp.commit_group()
    ij, i_s, ilo, ihi, iseq, irow, ikvh, isplit = _advance(cj, cs, clo, chi, cseq, crow, ckvh, csplit,
                                                           lanes, n_v, lo_v, hi_v, seq_v, row_v,
                                                           kvh_v, split_v, BLOCK_N, MAX_R)
    blk_i = _tile_blocks(bt_ptr, s_bt, iseq, i_s, ihi, PAGE, BLOCK_N, tok_l)
    bj, bs, blo, bhi, bseq, brow, bkvh, bsplit = _advance(ij, i_s, ilo, ihi, iseq, irow, ikvh, isplit,
                                                          lanes, n_v, lo_v, hi_v, seq_v, row_v,
                                                          kvh_v, split_v, BLOCK_N, MAX_R)

    g = gl.arange(0, BLOCK_G, layout=row_l)
    d = gl.arange(0, BLOCK_D, layout=col_l)
    o_ok = gl.expand_dims(g < GROUP, 1) & gl.expand_dims(d < BLOCK_D, 0)
    m_i = gl.full([BLOCK_G], float("-inf"), gl.float32, row_l)
    l_i = gl.full([BLOCK_G], 0.0, gl.float32, row_l)
    acc = gl.full([BLOCK_G, BLOCK_D], 0.0, gl.float32, mma)
    q8 = gl.full([BLOCK_G, BLOCK_D], 0, gl.int8, a8)
    q_scl = gl.full([BLOCK_G], 0.0, gl.float32, row_l)
    for _ in range(tiles):
        blk_b = _tile_blocks(bt_ptr, s_bt, bseq, bs, bhi, PAGE, BLOCK_N, tok_l)
        cp.wait_group(1)  # K(c), its scales (and c's query rows) are in; V(c) may be on its way
        _barrier()
        first = cs == clo  # a new item: its query codes, and its softmax state starts over
        if first:
            q8, q_scl = _quantize_q(q_smem, q_l, a8, row_l)
        k_t = k_smem.permute([1, 0]).load(b8)
        ks = ks_smem.load(col_l)
        _barrier()  # every warp has K(c) and the query rows: the buffers take i's
        if i_s == ilo:
            cp.async_copy_global_to_shared(q_smem, q_ptr + irow.to(gl.int64) * sq_t + ikvh * GROUP * sq_h + q_cols,
                                           mask=q_ok & (i_s < ihi))
        _issue_rows(k_smem, k_ptr + ikvh * sk_h, blk_i, i_s, ihi, sk_b, sk_s, PAGE, BLOCK_N,
                    BLOCK_D, tok_l, code_l)
        _issue_scales(ks_smem, ks_ptr + ikvh * sks_h, blk_i, i_s, ihi, sks_b, PAGE, BLOCK_N, tok_l)
        cp.commit_group()
        s = mma_v2(q8, k_t, gl.full([BLOCK_G, BLOCK_N], 0, gl.int32, mma))
        tok_ok = (cs + gl.arange(0, BLOCK_N, layout=col_l)) < chi
        s = s.to(gl.float32) * gl.expand_dims(q_scl * scale_log2, 1) * gl.expand_dims(ks, 0)
        s = gl.where(gl.expand_dims(tok_ok, 0), s, float("-inf"))
        m_i = gl.where(first, float("-inf"), m_i)
        l_i = gl.where(first, 0.0, l_i)
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        alpha = gl.exp2(m_i - m_new)
        pr = gl.exp2(s - gl.expand_dims(m_new, 1))
        l_i = l_i * alpha + gl.sum(pr, axis=1)
        m_i = m_new
        cp.wait_group(1)  # V(c) and its scales are in; K(i) may still be on its way
        _barrier()
        v8 = v_smem.load(v_l)
        vs = vs_smem.load(col_l)
        _barrier()  # every warp has V(c): its buffers take V(i)
        _issue_rows(v_smem, v_ptr + ikvh * sv_h, blk_i, i_s, ihi, sv_b, sv_s, PAGE, BLOCK_N,
                    BLOCK_D, tok_l, code_l)
        _issue_scales(vs_smem, vs_ptr + ikvh * svs_h, blk_i, i_s, ihi, svs_b, PAGE, BLOCK_N, tok_l)
        cp.commit_group()
        vh_smem.store(_codes_f16(v8))
        p16 = gl.convert_layout((pr * gl.expand_dims(gl.where(tok_ok, vs, 0.0), 0)).to(gl.float16), a16)
        _barrier()
        acc = mma_v2(p16, vh_smem.load(b16), acc * gl.expand_dims(alpha, 1))
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
