"""Triton paged prefill attention: the varlen causal kernel for everything but pure decode.

Owns: `prefill_attention` (prefill, chunked prefill over a cached prefix, mixed prefill+decode
batches); its tiles and grid come from `attention_prefill_plan` (`_tiles`, `prefill_tiles`).
`kernels.attention_triton` calls it when max_query_len > 1 and re-exports it. On sm_90 it hands
the calls they fit to the Gluon kernels (`gluon_applies`: attention_prefill_gluon.py over 16-bit
caches, attention_prefill_int8_gluon.py over int8 ones; same grid and contract, 1.5-1.7x faster
over bf16); the Triton kernel below keeps float32, other head dims, split KV and other GPUs.

`_prefill_kernel`: grid (query tiles, num_kv_heads, NUM_SPLITS) with GQA packing
(`PREFILL_PACK_GQA`, the default): a tile's rows are the GROUP query heads that share one KV
head, position-major (row r = position r // GROUP, head r % GROUP of the group), so every K/V
tile is read once for the whole group instead of once per query head; a 10-token suffix fills
20 rows of a tile at GROUP 2, a decode row of a mixed step 2. Without packing the second axis is
num_heads. The query tiles are numbered sequence by sequence (`prefill_tiles` sizes the axis from
shapes; `_tile_owner` finds a program's sequence and query block from the query starts), so a
sequence with no queries (a CUDA-graph bucket's padding, a decode row's extra blocks) costs no
program; where that saves nothing (one prompt), the axis is (sequence, query block) as before,
its programs dealt out last query block first (`PREFILL_LONGEST_FIRST`). In a mixed step the
one-row sequences are the decode kernel's (`skip_single`, `kernels.attention_triton`).
Flash-attention online softmax over K/V tiles gathered through the block table (`_attend_tile`);
tiles entirely before the block's first query position skip the causal mask, the remaining
diagonal tiles apply it. Must never read KV positions >= seq_lens[i] (block tables may be padded
with junk ids).

Split KV (`NUM_SPLITS` > 1, chosen by `prefill_splits`): a short query over a long context (a
10-token suffix after a 4,000-token prefix hit) gives one sequence only num_heads programs, each
walking the whole context: 5 ms per step on the H100 for the Qwen3-0.6B shape. With splits each
program takes one of NUM_SPLITS BLOCK_N-aligned slices of the keys (the slice length follows
the context on the device, so the grid stays fixed, as CUDA graphs need) and writes its
normalised partial output and log-sum-exp; `_split_reduce_kernel` merges them per (token, head).
An empty slice writes lse = -inf (weight 0).

int8 caches (KV_INT8 constexpr; float caches compile without that code): `_attend_tile` loads
codes and per-token scales and folds the scales into score and probability columns, like the
decode kernel (see `attention_common_triton`).

To extend: a change to how a K/V tile is loaded or folded in (sliding window, fp8 KV) goes into
`_attend_tile`, loop bounds into `_prefill_kernel`; keep `_decode_tile` (decode) and the
reference in step. New tile sizes go into `attention_prefill_plan._tiles`, checked for register
spills (docs/kernels.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .attention_common_triton import _LOG2E, _dense_tile, _dot, _dot_mode
from .dispatch import env_switch
from .attention_int8_triton import _kv_operand, _load_scales, _mma_scores, _quant_rows, cvt_ops
from .attention_prefill_gluon import GLUON_TILES, _prefill_gluon_kernel, prefill_gluon_fits
from .attention_prefill_int8_gluon import _prefill_int8_gluon_kernel, prefill_int8_gluon_fits
from .attention_prefill_plan import _tiles, prefill_tiles

# How int8 codes become operands here (a `CVT_MODES` name). `bench/int8_prefill.py` on the H100
# (2026-11-25), int8 vs bf16 prefill for 16 fresh prompts / 4 chunks of 512 over 2,048-token
# contexts: "mma_k" (int8 q @ K^T, see attention_int8_triton.py) 0.77x / 0.93x, "prmt_load"
# 0.78x / 0.79x, "words_k" 0.72x / 0.73x. Fresh prompts stay slower than bf16: the tile products
# are compute-bound and the V codes must still be converted.
PREFILL_INT8_CVT = "mma_k"


def prefill_int8_cvt(q) -> str:
    """The default int8 operand method for `q`: `PREFILL_INT8_CVT` for 16-bit q on CUDA (where it
    was timed); float32 q and the interpreter keep q exact with "prmt_load", as decode does."""
    return PREFILL_INT8_CVT if q.is_cuda and q.dtype != torch.float32 else "prmt_load"

# Split KV for short queries (see the module docstring): queries of at most this many tokens
# (every sequence of the step) get PREFILL_SPLITS slices of their keys.
PREFILL_SPLIT_MAX_Q = 64
PREFILL_SPLITS = 8

# GQA packing (see the module docstring): one program per (sequence, KV head, query block) whose
# tile rows are every query head of the group at BLOCK_M / GROUP positions. False: one program per
# query head, the group's heads each reading the same K/V tiles (kept to compare with; the
# benches' A/B switch is INFER_CLUSTER_PREFILL_PACK=0, read once at import).
PREFILL_PACK_GQA = env_switch("INFER_CLUSTER_PREFILL_PACK")


# Dense grids (one prompt, a few chunks) start their longest programs first (`_prefill_kernel`'s
# LONGEST_FIRST). `INFER_CLUSTER_PREFILL_LONGEST_FIRST=0` keeps the grid's own order (read once
# at import, for A/B).
PREFILL_LONGEST_FIRST = env_switch("INFER_CLUSTER_PREFILL_LONGEST_FIRST")


# The Gluon kernels take the calls they fit: `prefill_gluon_fits` (attention_prefill_gluon.py:
# sm_90, 16-bit q over a cache of its dtype, head_dim 128, GQA packing, no split KV) and
# `prefill_int8_gluon_fits` (attention_prefill_int8_gluon.py: the same over an int8 cache, where
# no `cvt` is asked for). `INFER_CLUSTER_PREFILL_GLUON=0` keeps the Triton kernel (read once at
# import, for A/B).
PREFILL_GLUON = env_switch("INFER_CLUSTER_PREFILL_GLUON")


def prefill_splits(max_query_len: int) -> int:
    return PREFILL_SPLITS if max_query_len <= PREFILL_SPLIT_MAX_Q else 1


@triton.jit
def _attend_tile(acc, m_i, l_i, q, q_scl, k_ptr, v_ptr, ks_ptr, vs_ptr, bt_row, start, hi, q_pos,
                 page_size, sk_b, sk_s, sk_d, sv_b, sv_s, sv_d, sks_b, sks_s, svs_b, svs_s,
                 scale_log2, offs_d, d_mask,
                 MASKED: tl.constexpr, CAUSAL: tl.constexpr, LOWP: tl.constexpr,
                 DOT_DTYPE: tl.constexpr, BLOCK_N: tl.constexpr, KV_INT8: tl.constexpr,
                 EVEN_D: tl.constexpr, OP_K: tl.constexpr, OP_V: tl.constexpr,
                 ASM: tl.constexpr):
    """Fold KV positions [start, start+BLOCK_N) into the running softmax state of q's rows.
    k_ptr/v_ptr already point at the right KV head. MASKED: positions may reach `hi` (and, if
    CAUSAL, pass a row's own position `q_pos`); unmasked tiles are known to be fully visible.
    KV_INT8: ks_ptr/vs_ptr point at the KV head's scales; codes become fp16 operands as OP_K /
    OP_V say (`attention_int8_triton`; lanes past `hi` read code 0, scale 0; unmasked tiles
    lie below the first query position, hence inside the context, and load without masks)."""
    offs_n = start + tl.arange(0, BLOCK_N)
    if MASKED:
        n_mask = offs_n < hi
    else:
        n_mask = offs_n >= 0
    # Page lookup per token, so tiles need not align with pages. Masked lanes never touch
    # the table, which is how padded block-table entries stay unread.
    blk = tl.load(bt_row + offs_n // page_size, mask=n_mask, other=0).to(tl.int64)
    pos = (offs_n % page_size).to(tl.int64)
    rows_k = k_ptr + blk * sk_b + pos * sk_s
    if KV_INT8:
        k = _kv_operand(rows_k, offs_d, n_mask, n_mask[:, None] & d_mask[None, :], sk_d, MASKED,
                        EVEN_D, LOWP, KV_INT8, OP_K, ASM)
        k_scale = _load_scales(ks_ptr + blk * sks_b + pos * sks_s, n_mask, MASKED)
        if OP_K == 5:  # OP_MMA: int8 q codes @ int8 K codes, q_scl per row
            s = _mma_scores(q, k, q_scl, k_scale)
        else:
            s = _dot(q, tl.trans(k), LOWP, DOT_DTYPE) * (k_scale * scale_log2)[None, :]
    else:
        kt = tl.load(rows_k[None, :] + offs_d[:, None] * sk_d,
                     mask=d_mask[:, None] & n_mask[None, :], other=0.0)
        s = _dot(q, kt, LOWP, DOT_DTYPE) * scale_log2
    if MASKED:
        visible = n_mask[None, :]
        if CAUSAL:
            visible = visible & (offs_n[None, :] <= q_pos[:, None])
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    # A row with nothing visible yet keeps m = -inf; subtract 0 instead so it stays NaN-free.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    rows_v = v_ptr + blk * sv_b + pos * sv_s
    if KV_INT8:
        v = _kv_operand(rows_v, offs_d, n_mask, n_mask[:, None] & d_mask[None, :], sv_d, MASKED,
                        EVEN_D, LOWP, KV_INT8, OP_V, ASM)
        v_scale = _load_scales(vs_ptr + blk * svs_b + pos * svs_s, n_mask, MASKED)
        acc = acc * alpha[:, None] + _dot(p * v_scale[None, :], v, LOWP, DOT_DTYPE)
    else:
        v = tl.load(rows_v[:, None] + offs_d[None, :] * sv_d,
                    mask=n_mask[:, None] & d_mask[None, :], other=0.0)
        acc = acc * alpha[:, None] + _dot(p, v, LOWP, DOT_DTYPE)
    return acc, m_new, l_i


@triton.jit
def _tile_owner(qsl_ptr, num_seqs, tile, PACK: tl.constexpr, BLOCK_M: tl.constexpr,
                SEQ_CHUNK: tl.constexpr, SKIP_SINGLE: tl.constexpr = False):
    """(sequence, query block) of the step's `tile`-th query tile, tiles numbered sequence by
    sequence (sequence i has cdiv(q_len_i * PACK, BLOCK_M) of them). A tile past the last
    gives a sequence of num_seqs. Scans the query starts SEQ_CHUNK sequences at a time: a
    prefix sum of the tile counts, and the sequences whose tiles all come before `tile`.
    SKIP_SINGLE: one-row sequences have no tiles (the decode kernel takes them)."""
    before = 0   # sequences whose tiles end at or before `tile`
    start = 0    # the first tile of the sequence that holds `tile`
    carry = 0    # tiles of the chunks scanned so far
    for base in range(0, num_seqs, SEQ_CHUNK):
        offs = base + tl.arange(0, SEQ_CHUNK)
        valid = offs < num_seqs
        lo = tl.load(qsl_ptr + offs, mask=valid, other=0)
        hi = tl.load(qsl_ptr + offs + 1, mask=valid, other=0)
        rows = hi - lo
        if SKIP_SINGLE:
            rows = tl.where(rows == 1, 0, rows)
        count = tl.where(valid, rows * PACK + BLOCK_M - 1, 0) // BLOCK_M
        ends = tl.cumsum(count, 0) + carry  # one past each sequence's last tile
        done = valid & (ends <= tile)
        before += tl.sum(done.to(tl.int32), 0)
        start = tl.maximum(start, tl.max(tl.where(done, ends, 0), 0))
        carry += tl.sum(count, 0)
    return before, tile - start


@triton.jit(do_not_specialize=["s_bt", "num_seqs", "dense_blocks"])  # they vary per step
def _prefill_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, bt_ptr, qsl_ptr, lens_ptr, out_ptr,
                    po_ptr, plse_ptr, scale_log2, page_size, num_seqs, dense_blocks,
                    sq_t, sq_h, sq_d, sk_b, sk_s, sk_h, sk_d, sv_b, sv_s, sv_h, sv_d,
                    sks_b, sks_h, sks_s, svs_b, svs_h, svs_s, s_bt, so_t, so_h, so_d,
                    spo_s, spo_t, spo_h, spl_s, spl_t,
                    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, LOWP: tl.constexpr,
                    DOT_DTYPE: tl.constexpr, KV_INT8: tl.constexpr, OP_K: tl.constexpr = 0,
                    OP_V: tl.constexpr = 0, ASM: tl.constexpr = False, NUM_SPLITS: tl.constexpr = 1,
                    PACK: tl.constexpr = 1, SEQ_CHUNK: tl.constexpr = 128,
                    LONGEST_FIRST: tl.constexpr = False, SKIP_SINGLE: tl.constexpr = False):
    EVEN_D: tl.constexpr = HEAD_DIM == BLOCK_D
    hid = tl.program_id(1)  # a query head, or with PACK > 1 a group of PACK heads
    split = tl.program_id(2)
    if dense_blocks > 0:  # a grid over (sequence, query block): few sequences, none padded
        seq, mblk, hid = _dense_tile(tl.program_id(0), tl.program_id(1), tl.num_programs(0),
                                     tl.num_programs(1), dense_blocks, LONGEST_FIRST)
    else:
        seq, mblk = _tile_owner(qsl_ptr, num_seqs, tl.program_id(0), PACK, BLOCK_M, SEQ_CHUNK,
                                SKIP_SINGLE)
    kvh = (hid * PACK) // GROUP
    owned = seq < num_seqs  # tiles past the step's last are empty programs
    seq = tl.minimum(seq, num_seqs - 1)
    row0 = tl.load(qsl_ptr + seq)
    q_len = tl.where(owned, tl.load(qsl_ptr + seq + 1) - row0, 0)
    if SKIP_SINGLE:  # one-row sequences are the decode kernel's
        q_len = tl.where(q_len == 1, 0, q_len)
    ctx = tl.load(lens_ptr + seq)
    # Packed rows: row r of the tile is query position r // PACK of head hid * PACK + r % PACK,
    # so the PACK heads that share a KV head read each K/V tile once.
    offs_r = mblk * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_m = offs_r // PACK
    heads = hid * PACK + offs_r % PACK
    offs_d = tl.arange(0, BLOCK_D)
    m_mask = offs_m < q_len
    d_mask = offs_d < HEAD_DIM
    q_pos = ctx - q_len + offs_m
    first_pos = ctx - q_len + (mblk * BLOCK_M) // PACK
    active = (mblk * BLOCK_M) // PACK < q_len
    # Keys before the block's first query position are visible to every row: whole tiles of
    # them run unmasked; the rest (up to the last row's position) take the causal mask.
    full_hi = tl.where(active, (first_pos // BLOCK_N) * BLOCK_N, 0)
    last_pos = ctx - q_len + tl.minimum((mblk * BLOCK_M + BLOCK_M - 1) // PACK, q_len - 1)
    hi = tl.where(active, tl.minimum(ctx, last_pos + 1), 0)
    lo = 0
    hi_split = hi
    if NUM_SPLITS > 1:  # this program's BLOCK_N-aligned slice of the keys
        chunk = tl.cdiv(tl.cdiv(hi, BLOCK_N), NUM_SPLITS) * BLOCK_N
        lo = split * chunk
        hi_split = tl.minimum(hi, lo + chunk)
    rows = (row0 + offs_m).to(tl.int64)
    q = tl.load(q_ptr + rows[:, None] * sq_t + heads[:, None] * sq_h + offs_d[None, :] * sq_d,
                mask=m_mask[:, None] & d_mask[None, :], other=0.0)
    q_scl = scale_log2  # OP_MMA: per-row q scales times the softmax scale
    if KV_INT8:
        if OP_K == 5:
            q, q_amax = _quant_rows(q)  # int8 codes, once per program
            q_scl = q_amax * scale_log2
        else:
            q = q.to(DOT_DTYPE)  # once, not per tile (fp16 on CUDA even for a bf16 model)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    bt_row = bt_ptr + seq.to(tl.int64) * s_bt
    k_head = k_ptr + kvh * sk_h
    v_head = v_ptr + kvh * sv_h
    ks_head = ks_ptr + kvh * sks_h
    vs_head = vs_ptr + kvh * svs_h
    for start in range(lo, tl.minimum(full_hi, hi_split), BLOCK_N):
        acc, m_i, l_i = _attend_tile(acc, m_i, l_i, q, q_scl, k_head, v_head, ks_head, vs_head, bt_row,
                                     start, hi, q_pos, page_size, sk_b, sk_s, sk_d, sv_b, sv_s,
                                     sv_d, sks_b, sks_s, svs_b, svs_s, scale_log2, offs_d, d_mask,
                                     False, True, LOWP, DOT_DTYPE, BLOCK_N, KV_INT8, EVEN_D,
                                     OP_K, OP_V, ASM)
    for start in range(tl.maximum(full_hi, lo), hi_split, BLOCK_N):
        acc, m_i, l_i = _attend_tile(acc, m_i, l_i, q, q_scl, k_head, v_head, ks_head, vs_head, bt_row,
                                     start, hi, q_pos, page_size, sk_b, sk_s, sk_d, sv_b, sv_s,
                                     sv_d, sks_b, sks_s, svs_b, svs_s, scale_log2, offs_d, d_mask,
                                     True, True, LOWP, DOT_DTYPE, BLOCK_N, KV_INT8, EVEN_D,
                                     OP_K, OP_V, ASM)
    o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    if NUM_SPLITS == 1:
        tl.store(out_ptr + rows[:, None] * so_t + heads[:, None] * so_h + offs_d[None, :] * so_d,
                 o.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])
    else:  # a partial: the normalised output of this slice and its log-sum-exp (log2 units)
        lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.log2(tl.where(l_i == 0.0, 1.0, l_i)))
        part = split.to(tl.int64)
        tl.store(po_ptr + part * spo_s + rows[:, None] * spo_t + heads[:, None] * spo_h + offs_d[None, :], o,
                 mask=m_mask[:, None] & d_mask[None, :])
        tl.store(plse_ptr + part * spl_s + rows * spl_t + heads, lse, mask=m_mask)


@triton.jit
def _split_reduce_kernel(po_ptr, plse_ptr, out_ptr, spo_s, spo_t, spo_h, spl_s, spl_t,
                         so_t, so_h, so_d, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
                         BLOCK_D: tl.constexpr):
    """Merge a (token, head)'s NUM_SPLITS partials with log-sum-exp weights: grid (tokens, heads).
    Rows of no sequence (CUDA-graph padding) merge whatever the buffers hold; nothing reads them."""
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs_s = tl.arange(0, NUM_SPLITS)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    lse = tl.load(plse_ptr + offs_s * spl_s + row * spl_t + head)
    m = tl.max(lse, axis=0)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m)
    o = tl.load(po_ptr + offs_s[:, None] * spo_s + row * spo_t + head * spo_h + offs_d[None, :],
                mask=d_mask[None, :], other=0.0)
    denom = tl.sum(w, axis=0)
    out = tl.sum(w[:, None] * o, axis=0) / tl.where(denom == 0.0, 1.0, denom)
    tl.store(out_ptr + row * so_t + head * so_h + offs_d * so_d, out.to(out_ptr.dtype.element_ty),
             mask=d_mask)


def gluon_applies(q, k_cache, v_cache, out, splits, pack, k_scale=None, v_scale=None, cvt=None,
                  gluon=None) -> bool:
    """Whether `prefill_attention` hands this call to a Gluon kernel: `gluon` (default
    `PREFILL_GLUON`) and the kernel for the cache's dtype fits it; over an int8 cache only where
    no `cvt` method is asked for (those are the Triton kernel's)."""
    if not (PREFILL_GLUON if gluon is None else gluon):
        return False
    if k_cache.dtype == torch.int8:
        return cvt is None and prefill_int8_gluon_fits(q, k_cache, v_cache, k_scale, v_scale, out,
                                                       splits, pack)
    return prefill_gluon_fits(q, k_cache, v_cache, out, splits, pack)


def prefill_attention(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
                      max_query_len, out, k_scale=None, v_scale=None, cvt=None, num_splits=None,
                      pack_gqa=None, tiles=None, longest_first=None, skip_single=False,
                      gluon=None):
    """Varlen causal kernel over paged KV (prefill, chunked prefill, mixed batches);
    `k_scale`/`v_scale` go with an int8 cache, `cvt` (a `CVT_MODES` name, default
    `prefill_int8_cvt(q)`) says how its codes become operands. `num_splits` (a power of two;
    default `prefill_splits(max_query_len)`) slices each query's keys (split KV). `pack_gqa`
    (default `PREFILL_PACK_GQA`) puts the query heads that share a KV head into one program.
    `tiles` (BLOCK_M, BLOCK_N, num_warps, num_stages) replaces `_tiles`' choice (benches'
    sweeps: bench/int8_prefill.py --tiles). `longest_first` (default `PREFILL_LONGEST_FIRST`)
    orders a dense grid's programs longest first. `skip_single`: sequences of one query row are
    left alone (a mixed step's decode rows, which `paged_attention_triton` gives the decode
    kernel); with split KV the merge still writes their rows from scratch no program filled,
    so the decode kernel must run after it. `gluon` (default `PREFILL_GLUON`) lets the Gluon
    kernels take the call where they fit (`gluon_applies`); `tiles` then give their (BLOCK_M,
    BLOCK_N, num_warps, STAGES), default `GLUON_TILES`."""
    num_seqs = seq_lens.shape[0]
    num_heads, head_dim = q.shape[1], q.shape[2]
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    block_d = max(16, triton.next_power_of_2(head_dim))
    kv_int8 = k_cache.dtype == torch.int8
    block_m, block_n, num_warps, num_stages = tiles or _tiles(q, block_d, kv_int8,
                                                              q.shape[0] // max(1, num_seqs))
    lowp, dot_dtype = _dot_mode(q, k_cache.dtype)
    if kv_int8:
        scales, s_strides = (k_scale, v_scale), (*k_scale.stride(), *v_scale.stride())
    else:  # never read: KV_INT8 is off
        scales, s_strides = (k_cache, v_cache), (0,) * 6
    op_k, op_v = cvt_ops(cvt or prefill_int8_cvt(q), k_cache, v_cache)
    splits = prefill_splits(max_query_len) if num_splits is None else num_splits
    if splits < 1 or splits & (splits - 1):
        raise ValueError(f"num_splits must be a power of two, got {splits}")
    if splits > 1:
        part_out = torch.empty(splits, q.shape[0], num_heads, head_dim, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(splits, q.shape[0], num_heads, dtype=torch.float32, device=q.device)
        p_strides = (part_out.stride(0), part_out.stride(1), part_out.stride(2), part_lse.stride(0),
                     part_lse.stride(1))
    else:  # never written: NUM_SPLITS is 1
        part_out = part_lse = out
        p_strides = (0,) * 5
    group = num_heads // num_kv_heads
    pack = group if (PREFILL_PACK_GQA if pack_gqa is None else pack_gqa) else 1
    longest = bool(PREFILL_LONGEST_FIRST if longest_first is None else longest_first)
    if gluon_applies(q, k_cache, v_cache, out, splits, pack, k_scale, v_scale, cvt, gluon):
        bm, bn, warps, stages = tiles or GLUON_TILES
        n_tiles, dense_blocks = prefill_tiles(num_seqs, q.shape[0], max_query_len, pack, bm)
        kernel, extra = _prefill_gluon_kernel, ()
        if kv_int8:
            kernel = _prefill_int8_gluon_kernel
            extra = (k_scale, v_scale)
        args = (q, k_cache, v_cache, *extra, block_tables, query_start_loc, seq_lens, out,
                scale * _LOG2E, num_seqs, dense_blocks, q.stride(0), q.stride(1),
                k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0),
                v_cache.stride(1), v_cache.stride(2))
        if kv_int8:
            args += (k_scale.stride(0), k_scale.stride(1), v_scale.stride(0), v_scale.stride(1))
        kernel[(n_tiles, num_kv_heads)](
            *args, block_tables.stride(0), out.stride(0), out.stride(1), GROUP=group,
            PAGE=page_size, BLOCK_M=bm, BLOCK_N=bn, STAGES=stages, SEQ_CHUNK=128,
            LONGEST_FIRST=longest and dense_blocks > 0, SKIP_SINGLE=bool(skip_single),
            num_warps=warps)
        return out
    tiles, dense_blocks = prefill_tiles(num_seqs, q.shape[0], max_query_len, pack, block_m)
    grid = (tiles, num_heads // pack, splits)
    _prefill_kernel[grid](
        q, k_cache, v_cache, *scales, block_tables, query_start_loc, seq_lens, out, part_out, part_lse,
        scale * _LOG2E, page_size, num_seqs, dense_blocks, *q.stride(), *k_cache.stride(),
        *v_cache.stride(), *s_strides,
        block_tables.stride(0), *out.stride(), *p_strides, GROUP=group, PACK=pack,
        HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, LOWP=lowp,
        DOT_DTYPE=dot_dtype, KV_INT8=kv_int8, OP_K=op_k, OP_V=op_v, ASM=q.is_cuda,
        NUM_SPLITS=splits, num_warps=num_warps, num_stages=num_stages,
        LONGEST_FIRST=longest and dense_blocks > 0,
        SKIP_SINGLE=bool(skip_single))
    if splits > 1:
        _split_reduce_kernel[(q.shape[0], num_heads)](
            part_out, part_lse, out, *p_strides, *out.stride(), HEAD_DIM=head_dim, NUM_SPLITS=splits,
            BLOCK_D=block_d, num_warps=4)
    return out
