"""int8 decode attention in Gluon, with the tile copies issued as soon as their buffer is free.

Owns: `_decode_int8_gluon_kernel` (plain decode rows over int8 caches, head_dim 128, CUDA sm_80+;
grid and arguments as `_decode_kernel`'s, and the Q_SMEM build).

Why: in the Triton kernel (`_decode_kernel`, KV_INT8) the compiler keeps one K/V buffer and
issues the next tile's copies after the tile's last use, then waits for them in full at the top
of the loop, so a program never has a load in flight while it computes (bench/RESULTS.md, "int8
KV cache", under the hardware counters). Here there is one K and one V tile buffer too, but each
tile's copies are issued as soon as the previous tile has left its buffer: K(i+1) after
q @ K(i)^T has read K(i), V(i+1) after V(i) has been read into registers. So each load has
about one tile's compute to land in. Gluon (`triton.experimental.gluon`) states the layouts,
copies and barriers that Triton chooses itself.

V without a staging tile: P @ V reduces over tokens, so V is the transposed operand, and sm_90
has no 8-bit `ldmatrix.trans`. The V tile is read as 16-bit pairs instead (two adjacent dims of
one token, `_reinterpret` of the same bytes): `ldmatrix.trans` then hands each thread the k pair
of a 16-bit operand, two tokens' pairs in one register, and two byte permutes turn it into the
fp16 operands of the even and of the odd dims (`_pairs_f16`), which accumulate apart and are
stored interleaved. Converting into an fp16 staging tile (a store, a barrier and a 32 KB
reload a tile) took 68.6 KB of shared memory and 168 registers; this takes 35.8 KB and 146
(H200, 2026-12-01: decode 1.03-1.12x at batches 32-256, workload A with int8 KV +3.3%).

Row offsets: the block ids arrive one token a thread, the codes' copies want them in the
tile's row layout. A `convert_layout` there costs a shared store and two barriers each time;
instead each tile's K and V offsets (int32, 16-element units) are stored into two small shared
buffers between the loop's own barriers and read back in the copies' layout (17 barriers in
the PTX instead of 28; H200, 2026-12-01: workload A with int8 KV +4%, docs/kernels.md).

Q_SMEM (the build grids of 1.5 rounds and more take, `gluon_q_smem`): q's codes stay in shared
memory and are read back each tile, so the build fits 128 registers and four programs a SM; more
programs in flight hide each one's first tile on large grids (batch 256 at ~512 tokens 1.07x),
while on small ones four a SM leave a ragged last round (batch 64: 0.81x).

Numerics: the Triton kernel's `mma_k` method exactly (q quantized per row by the KV append's
rule, int8 q @ K^T on int8 tensor cores, V codes to fp16 exactly by the 0x6480 trick, V scales
on the probability columns, float32 softmax and accumulator). Must never read KV positions at or past
a row's context (masked copies read nothing) or the block table past its row's width.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

# the Triton kernels' softmax step and partition length: scalar, elementwise and reduce ops,
# which Gluon runs on its layouts as they are (same PTX as a Gluon copy)
from .attention_decode_tile_triton import _softmax_step, _split_part
from .attention_int8_triton import CODES_F16_ASM, codes_f16_asm
from .pdl_gluon import pdl_gluon

_barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier  # Triton 3.7 / 3.6 name


@gluon.jit
def _codes_f16(codes):
    """fp16 values of int8 codes, 4 per asm instance (`CODES_F16_ASM`), in the layout the
    codes arrive in."""
    return gl.inline_asm_elementwise(asm=CODES_F16_ASM, constraints="=r,=r,r", args=[codes],
                                     dtype=gl.float16, is_pure=False, pack=4)


# V codes read as 16-bit pairs (two dims of one token), two tokens a 32-bit register (the k
# pair of a 16-bit MMA operand): bytes [a0 a1 b0 b1] -> fp16 pairs (a0, b0) and (a1, b1), the
# even and the odd dim.
PAIRS_F16_ASM: gl.constexpr = gl.constexpr(codes_f16_asm(0x5240, 0x5341))


@gluon.jit
def _pairs_f16(pairs):
    """fp16 values of int8 codes read as int16 pairs `[tokens, dims / 2]` in a 16-bit MMA
    operand layout (k pairs in one register): (even dims, odd dims), each in that layout."""
    return gl.inline_asm_elementwise(asm=PAIRS_F16_ASM, constraints="=r,=r,r", args=[pairs],
                                     dtype=(gl.float16, gl.float16), is_pure=True, pack=2)


@gluon.jit
def _quant_rows(x):
    """float32 rows `x [M, D]` as (int8 codes in x's layout, scales [M] in its row slice): the
    KV append's rule, as the Triton kernels' `_quant_rows` (attention_int8_triton.py): scale =
    absmax / 127, codes = floor(x * 127 / absmax + 0.5) clamped to [-127, 127], IEEE divisions;
    an all-zero row gives codes 0, scale 0."""
    amax = gl.max(gl.abs(x), axis=1)
    inv = gl.div_rn(gl.full(amax.shape, 127.0, gl.float32, amax.type.layout), gl.where(amax > 0.0, amax, 1.0))
    inv = gl.where(amax > 0.0, inv, 0.0)
    r = gl.floor(x * gl.expand_dims(inv, 1) + 0.5)
    codes = gl.minimum(gl.maximum(r, -127.0), 127.0).to(gl.int8)
    return codes, gl.div_rn(amax, gl.full(amax.shape, 127.0, gl.float32, amax.type.layout))


@gluon.jit
def _tile_blocks(bt_row, start, hi, PAGE: gl.constexpr, BLOCK_N: gl.constexpr,
                 tok_l: gl.constexpr):
    """The cache block of each token of tile [start, start+BLOCK_N) (0 at or past `hi`: the
    table is not read there; the copies mask those tokens by their own bound). Loaded a tile
    ahead of the copies that use it."""
    tok = start + gl.arange(0, BLOCK_N, layout=tok_l)
    return gl.load(bt_row + tok // PAGE, mask=tok < hi, other=0)


@gluon.jit
def _row_units(blk, start, s_b, s_s, PAGE: gl.constexpr, BLOCK_N: gl.constexpr,
               tok_l: gl.constexpr):
    """The cache offsets of tokens [start, start+BLOCK_N) (`blk` their blocks, one token a
    thread) in 16-element units (16 bytes of an int8 cache), int32 (the launchers check that the
    strides are multiples of 16 and that a cache's units fit)."""
    tok = start + gl.arange(0, BLOCK_N, layout=tok_l)
    return blk * (s_b // 16) + tok % PAGE * (s_s // 16)


@gluon.jit
def _issue_tile(smem, sc_smem, head, sc_head, blk, rows, start, hi, sc_b,
                PAGE: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr,
                tok_l: gl.constexpr, tile_l: gl.constexpr):
    """Copies of tokens [start, start+BLOCK_N) below `hi` (codes and scales) into the tile's
    buffers, as one commit group; tokens at or past `hi` copy nothing. `blk`: their blocks, one
    token a thread (the scales' copies); `rows`: their rows' offsets from `head` in 16-element
    units (`_row_units`), in the layout of the tile's rows (`SliceLayout(1, tile_l)`: the
    codes' copies), so no layout is converted here."""
    tok = start + gl.arange(0, BLOCK_N, layout=tok_l)
    blk = blk.to(gl.int64)  # widened here, not at the load: no wait on the load a tile early
    cp.async_copy_global_to_shared(sc_smem, sc_head + blk * sc_b + tok % PAGE, mask=tok < hi)
    tok_r = start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, tile_l))
    d = gl.arange(0, BLOCK_D, layout=gl.SliceLayout(0, tile_l))
    rows = rows.to(gl.int64) * 16
    cp.async_copy_global_to_shared(smem, gl.expand_dims(head + rows, 1) + gl.expand_dims(d, 0),
                                   mask=gl.expand_dims(tok_r < hi, 1) & gl.expand_dims(d < BLOCK_D, 0))
    cp.commit_group()


@gluon.jit(do_not_specialize=["bt_tokens", "s_bt", "spo_s", "spo_h", "spl_s", "spl_h"])
def _decode_int8_gluon_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, bt_ptr, qsl_ptr, lens_ptr,
                              order_ptr, out_ptr, po_ptr, plse_ptr, scale_log2, bt_tokens,
                              sq_t, sq_h, sk_b, sk_s, sk_h, sv_b, sv_s, sv_h,
                              sks_b, sks_h, svs_b, svs_h, s_bt,
                              so_t, so_h, spo_s, spo_h, spo_p, spl_s, spl_h,
                              GROUP: gl.constexpr, PAGE: gl.constexpr, BLOCK_N: gl.constexpr,
                              SPLIT: gl.constexpr, ORDERED: gl.constexpr, PDL: gl.constexpr = False,
                              Q_SMEM: gl.constexpr = False, EARLY_TILE: gl.constexpr = True):
    """One program: the query heads of one KV head of one sequence over one partition of its
    context (as `_decode_kernel`), 4 warps, 16 padded query rows, head_dim 128."""
    BLOCK_G: gl.constexpr = 16
    BLOCK_D: gl.constexpr = 128
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 4],
                                                  instr_shape=[16, 8])
    a8: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
    b8: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=4)
    a16: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b16: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    row_l: gl.constexpr = gl.SliceLayout(1, mma)
    col_l: gl.constexpr = gl.SliceLayout(0, mma)
    tok_l: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    tile_l: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
    q_l: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
    code_sl: gl.constexpr = gl.SwizzledSharedLayout(16, 1, 8, [1, 0])
    # V's codes as 16-bit pairs: the same bytes and swizzle as code_sl
    pair_sl: gl.constexpr = gl.SwizzledSharedLayout(8, 1, 8, [1, 0])
    sc_sl: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])

    pdl_gluon(PDL, False)
    # Before the PDL wait: only step inputs (order, qsl, seq_lens, block tables: written before
    # the step's first kernel) and K/V rows of earlier steps (below).
    if ORDERED:
        lin = gl.program_id(0) + gl.program_id(1) * gl.num_programs(0)
        seq = gl.load(order_ptr + lin // gl.num_programs(1))
        kvh = lin % gl.num_programs(1)
    else:
        seq = gl.program_id(0)
        kvh = gl.program_id(1)
    split = gl.program_id(2)
    row = gl.load(qsl_ptr + seq)
    has_query = (gl.load(qsl_ptr + seq + 1) - row) == 1
    ctx = gl.where(has_query, gl.load(lens_ptr + seq), 0)
    if SPLIT:
        part = _split_part(ctx, gl.num_programs(2), BLOCK_N)
        lo = split * part
        hi = gl.maximum(gl.minimum(lo + part, ctx), lo)
    else:
        lo = 0
        hi = ctx

    bt_row = bt_ptr + seq.to(gl.int64) * s_bt
    k_head = k_ptr + kvh * sk_h
    v_head = v_ptr + kvh * sv_h
    ks_head = ks_ptr + kvh * sks_h
    vs_head = vs_ptr + kvh * svs_h
    # the next tile's K and V row offsets on their way from one token a thread to the tiles'
    # rows, through the loop's own barriers (a convert_layout would add two of its own each)
    koff_smem = gl.allocate_shared_memory(gl.int32, [BLOCK_N], sc_sl)
    voff_smem = gl.allocate_shared_memory(gl.int32, [BLOCK_N], sc_sl)
    k_smem = gl.allocate_shared_memory(gl.int8, [BLOCK_N, BLOCK_D], code_sl)
    v_smem = gl.allocate_shared_memory(gl.int8, [BLOCK_N, BLOCK_D], code_sl)
    ks_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_N], sc_sl)
    vs_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_N], sc_sl)
    # The first tile's copies go out before q is loaded and quantized, and before the PDL wait
    # where the tile holds no row this step appends (that row, ctx - 1, is the kernel before's):
    # each program's first load is in flight while its prologue runs, and in the first round
    # while the kernel before ends (EARLY_TILE; H200 figures in docs/kernels.md).
    # The first two tiles' block ids: unsplit, bounded by the row's width (`bt_tokens`, the
    # tokens a block-table row addresses) rather than the context, so their loads do not wait
    # on seq_lens' (a program's start is a chain of dependent loads: order, then its row's
    # step inputs, then these, then the copies).
    if SPLIT:
        bt_hi = hi
    else:
        bt_hi = bt_tokens
    blk = _tile_blocks(bt_row, lo, bt_hi, PAGE, BLOCK_N, tok_l)
    blk2 = _tile_blocks(bt_row, lo + BLOCK_N, bt_hi, PAGE, BLOCK_N, tok_l)
    if EARLY_TILE:
        early = lo + BLOCK_N < ctx
    else:  # A/B: INFER_CLUSTER_DECODE_EARLY_TILE=0
        early = ctx < 0  # never
    rows_l: gl.constexpr = gl.SliceLayout(1, tile_l)  # the tiles' rows
    koff_smem.store(_row_units(blk, lo, sk_b, sk_s, PAGE, BLOCK_N, tok_l))
    voff_smem.store(_row_units(blk, lo, sv_b, sv_s, PAGE, BLOCK_N, tok_l))
    _barrier()
    if not early:
        pdl_gluon(PDL, True)  # the tile holds this step's row: wait for the kernel before
    _issue_tile(k_smem, ks_smem, k_head, ks_head, blk, koff_smem.load(rows_l), lo, hi, sks_b,
                PAGE, BLOCK_N, BLOCK_D, tok_l, tile_l)
    _issue_tile(v_smem, vs_smem, v_head, vs_head, blk, voff_smem.load(rows_l), lo, hi, svs_b,
                PAGE, BLOCK_N, BLOCK_D, tok_l, tile_l)
    if early:
        pdl_gluon(PDL, True)  # q comes from the kernel before

    # q: int8 codes per row (the KV append's rule) and the rows' scales times the softmax's
    g_q = gl.arange(0, BLOCK_G, layout=gl.SliceLayout(1, q_l))
    d_q = gl.arange(0, BLOCK_D, layout=gl.SliceLayout(0, q_l))
    q_at = row.to(gl.int64) * sq_t + gl.expand_dims((kvh * GROUP + g_q) * sq_h, 1) + gl.expand_dims(d_q, 0)
    q_ok = gl.expand_dims((g_q < GROUP) & has_query, 1) & gl.expand_dims(d_q < BLOCK_D, 0)
    codes, q_scale = _quant_rows(gl.load(q_ptr + q_at, mask=q_ok, other=0.0).to(gl.float32))
    if Q_SMEM:  # q's codes read back each tile: fewer registers (four programs a SM at 128)
        q_smem = gl.allocate_shared_memory(gl.int8, [BLOCK_G, BLOCK_D], code_sl, codes)
    else:
        q8 = gl.convert_layout(codes, a8)
    q_scl = gl.convert_layout(q_scale, row_l) * scale_log2

    # V read as int16 pairs (two dims of a token) by ldmatrix.trans straight into the P @ V
    # operand; the even and the odd dims accumulate apart
    v_pairs = v_smem._reinterpret(gl.int16, [BLOCK_N, BLOCK_D // 2], pair_sl)
    acc_e = gl.full([BLOCK_G, BLOCK_D // 2], 0.0, gl.float32, mma)
    acc_o = gl.full([BLOCK_G, BLOCK_D // 2], 0.0, gl.float32, mma)
    blk = blk2

    m_i = gl.full([BLOCK_G], float("-inf"), gl.float32, row_l)
    l_i = gl.full([BLOCK_G], 0.0, gl.float32, row_l)
    for start in range(lo, hi, BLOCK_N):
        nxt = start + BLOCK_N
        blk_nxt = blk
        blk = _tile_blocks(bt_row, nxt + BLOCK_N, hi, PAGE, BLOCK_N, tok_l)
        cp.wait_group(1)  # K(start) is in; V(start) may still be on its way
        _barrier()  # (and every warp has read the ids of the tile before, below)
        k_t = k_smem.permute([1, 0]).load(b8)
        ks = ks_smem.load(col_l)
        koff_smem.store(_row_units(blk_nxt, nxt, sk_b, sk_s, PAGE, BLOCK_N, tok_l))
        voff_smem.store(_row_units(blk_nxt, nxt, sv_b, sv_s, PAGE, BLOCK_N, tok_l))
        _barrier()  # every warp has K(start): its buffer takes K(nxt); the offsets are in
        _issue_tile(k_smem, ks_smem, k_head, ks_head, blk_nxt, koff_smem.load(rows_l), nxt, hi,
                    sks_b, PAGE, BLOCK_N, BLOCK_D, tok_l, tile_l)
        if Q_SMEM:
            q8 = q_smem.load(a8)
        s = mma_v2(q8, k_t, gl.full([BLOCK_G, BLOCK_N], 0, gl.int32, mma))
        tok_ok = (start + gl.arange(0, BLOCK_N, layout=col_l)) < hi
        s = s.to(gl.float32) * gl.expand_dims(q_scl, 1) * gl.expand_dims(ks, 0)
        s = gl.where(gl.expand_dims(tok_ok, 0), s, float("-inf"))
        p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i)
        cp.wait_group(1)  # V(start) is in; K(nxt) may still be on its way
        _barrier()
        v16 = v_pairs.load(b16)
        vs = vs_smem.load(col_l)
        _barrier()  # every warp has V(start): its buffer takes V(nxt)
        _issue_tile(v_smem, vs_smem, v_head, vs_head, blk_nxt, voff_smem.load(rows_l), nxt, hi,
                    svs_b, PAGE, BLOCK_N, BLOCK_D, tok_l, tile_l)
        p16 = gl.convert_layout((p * gl.expand_dims(gl.where(tok_ok, vs, 0.0), 0)).to(gl.float16), a16)
        v_even, v_odd = _pairs_f16(v16)
        acc_e = mma_v2(p16, v_even, acc_e * gl.expand_dims(alpha, 1))
        acc_o = mma_v2(p16, v_odd, acc_o * gl.expand_dims(alpha, 1))
    cp.wait_group(0)

    l_safe = gl.where(l_i == 0.0, 1.0, l_i)
    g = gl.arange(0, BLOCK_G, layout=row_l)
    heads = kvh * GROUP + g
    g_ok = g < GROUP
    d = gl.arange(0, BLOCK_D // 2, layout=col_l)  # even dims from acc_e, odd from acc_o
    _store_out(acc_e / gl.expand_dims(l_safe, 1), 2 * d, heads, g_ok, seq, split, row, lo, hi,
               has_query, out_ptr, po_ptr, so_t, so_h, spo_s, spo_h, spo_p, SPLIT)
    _store_out(acc_o / gl.expand_dims(l_safe, 1), 2 * d + 1, heads, g_ok, seq, split, row, lo, hi,
               has_query, out_ptr, po_ptr, so_t, so_h, spo_s, spo_h, spo_p, SPLIT)
    if SPLIT:
        gl.store(plse_ptr + seq.to(gl.int64) * spl_s + heads * spl_h + split,
                 m_i + gl.log2(l_safe), mask=g_ok & (lo < hi))


@gluon.jit
def _store_out(o, d, heads, g_ok, seq, split, row, lo, hi, has_query, out_ptr, po_ptr, so_t, so_h,
               spo_s, spo_h, spo_p, SPLIT: gl.constexpr):
    """A program's output rows at head dims `d` (its columns): the partition's partial output
    when SPLIT, else `out`."""
    o_ok = gl.expand_dims(g_ok, 1) & gl.expand_dims(d >= 0, 0)
    if SPLIT:
        po = po_ptr + seq.to(gl.int64) * spo_s + split * spo_p
        gl.store(po + gl.expand_dims(heads * spo_h, 1) + gl.expand_dims(d, 0), o, mask=o_ok & (lo < hi))
    else:
        dst = out_ptr + row.to(gl.int64) * so_t + gl.expand_dims(heads * so_h, 1) + gl.expand_dims(d, 0)
        gl.store(dst, o.to(out_ptr.dtype.element_ty), mask=o_ok & has_query)
