"""Prefill attention over int8 caches in Gluon for Hopper: the float kernel's pipeline
(attention_prefill_gluon.py) with the codes converted to fp16 in shared memory.

Owns: `_prefill_int8_gluon_kernel` (16-bit q over int8 K/V codes with float32 per-token scales,
head_dim 128, sm_90, no split KV; grid, contract and tiles as `_prefill_gluon_kernel`'s) and
`prefill_int8_gluon_fits`.

Why: the Triton prefill kernel over int8 caches ran at 0.72-0.91x of the same kernel over bf16
(bench/int8_prefill.py), so an int8 cache made prompts slower than a bf16 one. Here a tile's
codes are copied (`cp.async`, 8 KB per K or V tile instead of 16) into STAGES buffers, its K
and V scales (256 bytes each) in the same copy group, read back in the score columns' layout
once the tile has landed (loading them per column from global memory had each thread compute
the block id and address of its 16 columns a tile: 15% of the SASS instructions); q @ K^T
runs on the int8 codes of q and K (`wgmma` s8, int32 accumulation), V(j-1) is converted to
fp16 into a staging buffer (exact: |code| <= 127), and each iteration issues the scores of tile
j and P(j-1) @ V(j-1) as asynchronous warpgroup MMAs and runs tile j's softmax while the second
is on the tensor cores, as the float kernel does.

Numerics: the Triton kernel's "mma_k" method (its default on CUDA): q rounded to int8 codes per
row by the KV append's rule (`_quant_rows`, shared with the int8 decode kernel), exact int8
products, then the q row scales, the softmax scale and the K column scales in float32; the V
scales multiply the probability columns before their rounding to fp16 (the row sums take them
unscaled), float32 accumulation. So `int8_quantizes_q` holds for it, and the reference is
`paged_attention_ref` on the int8 cache with q's codes dequantized. Must never read KV
positions at or past a row's context, nor the block table there.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .attention_decode_gluon import _codes_f16, _quant_rows
from .attention_prefill_gluon import (_barrier, _issue_tile, _load_q, _masked, _program_rows,
                                      _softmax_step, _store_o, gluon_shapes_fit)


@gluon.jit
def _issue_scales(ks_smem, vs_smem, ks_head, vs_head, bt_row, start, hi, sks_b, svs_b,
                  PAGE: gl.constexpr, BLOCK_N: gl.constexpr, sc_l: gl.constexpr):
    """Copies of the K and V scales of tokens [start, start+BLOCK_N) into one buffer of each,
    in the commit group `_issue_tile` then closes (so the tile's wait covers them); tokens at or
    past `hi` read nothing and land as zeros (cp.async's zero fill)."""
    tok = start + gl.arange(0, BLOCK_N, layout=sc_l)
    ok = tok < hi
    blk = gl.load(bt_row + tok // PAGE, mask=ok, other=0).to(gl.int64)
    pos = tok % PAGE
    cp.async_copy_global_to_shared(ks_smem, ks_head + blk * sks_b + pos, mask=ok)
    cp.async_copy_global_to_shared(vs_smem, vs_head + blk * svs_b + pos, mask=ok)


@gluon.jit
def _to_f16(codes_smem, f16_smem, cp_l: gl.constexpr):
    """A tile of V codes into its fp16 staging buffer (each thread converts the 16 codes it
    copied)."""
    f16_smem.store(_codes_f16(codes_smem.load(cp_l)))


@gluon.jit(do_not_specialize=["s_bt", "num_seqs", "dense_blocks"])  # they vary per step
def _prefill_int8_gluon_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, bt_ptr, qsl_ptr, lens_ptr,
                               out_ptr, scale_log2, num_seqs, dense_blocks, sq_t, sq_h,
                               sk_b, sk_s, sk_h, sv_b, sv_s, sv_h, sks_b, sks_h, svs_b, svs_h,
                               s_bt, so_t, so_h,
                               GROUP: gl.constexpr, PAGE: gl.constexpr, BLOCK_M: gl.constexpr,
                               BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                               SEQ_CHUNK: gl.constexpr, LONGEST_FIRST: gl.constexpr,
                               SKIP_SINGLE: gl.constexpr, num_warps: gl.constexpr):
    BLOCK_D: gl.constexpr = 128
    gl.static_assert(STAGES >= 3, "the copies of tile j + STAGES - 2 need a free buffer")
    s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BLOCK_N, 32])  # int8 MMA
    o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BLOCK_D, 16])
    p_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=2)
    ld_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    cp_l: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [num_warps, 1], [1, 0])
    sw_l: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    sw8_l: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    code_sl: gl.constexpr = gl.SwizzledSharedLayout(16, 1, 8, [1, 0])
    sc_l: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])  # a tile's scales
    sc_sl: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    row_s: gl.constexpr = gl.SliceLayout(1, s_l)
    col_s: gl.constexpr = gl.SliceLayout(0, s_l)

    seq, mblk, hid, row0, q_len, ctx, full_hi, hi = _program_rows(
        qsl_ptr, lens_ptr, num_seqs, dense_blocks, GROUP, BLOCK_M, BLOCK_N, SEQ_CHUNK,
        LONGEST_FIRST, SKIP_SINGLE, num_warps)
    # q as int8 codes per row (the KV append's rule) for the int8 score MMA; its row scales
    # times the softmax's fold into the scores
    codes, q_scale = _quant_rows(_load_q(q_ptr, row0, q_len, mblk, hid, sq_t, sq_h, GROUP,
                                         BLOCK_M, BLOCK_D, ld_l).to(gl.float32))
    q_smem = gl.allocate_shared_memory(gl.int8, [BLOCK_M, BLOCK_D], sw8_l, codes)
    q_scl = gl.convert_layout(q_scale, row_s) * scale_log2
    kc_smem = gl.allocate_shared_memory(gl.int8, [STAGES, BLOCK_N, BLOCK_D], sw8_l)
    vc_smem = gl.allocate_shared_memory(gl.int8, [STAGES, BLOCK_N, BLOCK_D], code_sl)
    ks_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_N], sc_sl)
    vs_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_N], sc_sl)
    # The first iteration's P @ V reads the staging buffer with P = 0: zeros, never junk.
    v16_smem = gl.allocate_shared_memory(gl.float16, [BLOCK_N, BLOCK_D], sw_l,
                                         gl.zeros([BLOCK_N, BLOCK_D], gl.float16, ld_l))

    bt_row = bt_ptr + seq.to(gl.int64) * s_bt
    k_head = k_ptr + hid * sk_h
    v_head = v_ptr + hid * sv_h
    ks_head = ks_ptr + hid * sks_h
    vs_head = vs_ptr + hid * svs_h
    for t in gl.static_range(STAGES - 2):
        _issue_scales(ks_smem.index(t), vs_smem.index(t), ks_head, vs_head, bt_row, t * BLOCK_N,
                      hi, sks_b, svs_b, PAGE, BLOCK_N, sc_l)
        _issue_tile(kc_smem.index(t), vc_smem.index(t), k_head, v_head, bt_row, t * BLOCK_N, hi,
                     sk_b, sk_s, sv_b, sv_s, PAGE, BLOCK_N, BLOCK_D, cp_l)

    q_pos = ctx - q_len + (mblk * BLOCK_M + gl.arange(0, BLOCK_M, layout=row_s)) // GROUP
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_s)
    l_i = gl.full([BLOCK_M], 0.0, gl.float32, row_s)
    acc = gl.zeros([BLOCK_M, BLOCK_D], gl.float32, o_l)
    p = gl.zeros([BLOCK_M, BLOCK_N], gl.float16, p_l)
    s0 = gl.zeros([BLOCK_M, BLOCK_N], gl.int32, s_l)
    n_tiles = gl.cdiv(hi, BLOCK_N)
    for j in range(n_tiles):
        cp.wait_group(STAGES - 3)  # tile j's codes from this thread have landed
        _barrier()  # ... from every thread; every warp is past tile j-1's MMAs
        if j > 0:
            _to_f16(vc_smem.index((j + STAGES - 1) % STAGES), v16_smem, cp_l)
        nxt = j + STAGES - 2  # into tile j-2's buffers: both of its tiles are converted
        _issue_scales(ks_smem.index(nxt % STAGES), vs_smem.index(nxt % STAGES), ks_head, vs_head,
                      bt_row, nxt * BLOCK_N, hi, sks_b, svs_b, PAGE, BLOCK_N, sc_l)
        _issue_tile(kc_smem.index(nxt % STAGES), vc_smem.index(nxt % STAGES), k_head, v_head,
                     bt_row, nxt * BLOCK_N, hi, sk_b, sk_s, sv_b, sv_s, PAGE, BLOCK_N, BLOCK_D,
                     cp_l)
        fence_async_shared()  # the codes and the fp16 V tile are visible to the tensor cores
        _barrier()
        s = warpgroup_mma(q_smem, kc_smem.index(j % STAGES).permute((1, 0)), s0, use_acc=False,
                          is_async=True)
        acc = warpgroup_mma(p, v16_smem, acc, is_async=True)
        ks = ks_smem.index(j % STAGES).load(col_s)  # landed with the tile's codes
        vs = vs_smem.index(j % STAGES).load(col_s)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s, ))
        s = s.to(gl.float32) * gl.expand_dims(q_scl, 1) * gl.expand_dims(ks, 0)
        s = _masked(s, j * BLOCK_N, full_hi, hi, q_pos, BLOCK_N, col_s)
        p32, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, 1.0)
        p32 = p32 * gl.expand_dims(vs, 0)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_l)), 1)
        # P's fp16 registers are written only now: they are the operand of the P @ V just
        # waited for, and writing them earlier makes ptxas serialize every wgmma (C7513)
        p = gl.convert_layout(p32.to(gl.float16), p_l)
    _barrier()  # every warp is past the last P @ V but one: its staging buffer is free
    if n_tiles > 0:
        _to_f16(vc_smem.index((n_tiles + STAGES - 1) % STAGES), v16_smem, cp_l)
    fence_async_shared()
    _barrier()
    acc = warpgroup_mma(p, v16_smem, acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    cp.wait_group(0)

    _store_o(out_ptr, acc, l_i, row0, q_len, mblk, hid, so_t, so_h, GROUP, BLOCK_M, BLOCK_D, o_l)


def prefill_int8_gluon_fits(q, k_cache, v_cache, k_scale, v_scale, out, splits: int,
                            pack: int) -> bool:
    """Whether `_prefill_int8_gluon_kernel` takes a prefill call: `gluon_shapes_fit` over int8
    caches, with unit stride along the scales' tokens (scales given as None are not checked:
    the engine's are contiguous)."""
    return (k_cache.dtype == torch.int8 and v_cache.dtype == torch.int8
            and gluon_shapes_fit(q, k_cache, v_cache, out, splits, pack)
            and all(sc is None or sc.stride(2) == 1 for sc in (k_scale, v_scale)))
