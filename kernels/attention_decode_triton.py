"""Triton paged decode attention: the split-K (flash-decoding) kernel, its reduce and its launch.

Owns: `decode_attention` (every sequence has at most one query row) and the two kernels. The
launch config (`decode_config`, `DECODE_TUNED`, `DECODE_INT8`, `RUNS_PROGRAMS_PER_SM`) and the
split count (`plan_decode_splits`) live in `attention_decode_plan` and are imported here;
`CVT_MODES`, the int8 operand conversions, lives in `attention_int8_triton`.
`kernels.attention_triton` re-exports these names; callers import them from there.

`_decode_kernel`: grid (num_seqs, num_kv_heads, num_splits). One program owns all query heads of
one KV head (padded to >= 16 rows for tl.dot), so each K/V tile is loaded once for the whole
group. Each sequence's context is cut into `num_splits` equal partitions (lengths derived in the
kernel from its own seq_len, `_split_part`) computed in parallel; with more than one, each writes
a normalised partial output plus its log-sum-exp, and `_reduce_kernel` (grid (num_seqs,
num_heads)) merges the non-empty ones. The split count is chosen from tensor shapes only
(block-table width, batch, SM count), never from seq_lens values, so a decode step can be
captured in a CUDA graph; this module must never sync with the host or read KV positions
>= seq_lens[i].

Runs (`row_span`, GROUPED constexpr; plain decode compiles without that code): consecutive
sequences that are one request's positions in a verify step share a block table, each one
token longer than the one before. The program of a run chunk's first sequence owns up to
BLOCK_G // GROUP of them (`_run_chunk`) as its query rows, so each K/V tile is loaded once for
the chunk; each row is masked to its own context (`_softmax_step_rows`), partitions follow the
chunk's longest context, and splits are planned for the chunks (`RUNS_PROGRAMS_PER_SM`).

int8 caches (KV_INT8 constexpr; float caches compile without that code): `_decode_tile` loads
the codes and the tile's per-token scales, folds the K scales into the score columns and the V
scales into the probability columns before P@V (see `attention_common_triton`). How codes
become fp16 operands is chosen per operand (OP_K, OP_V from the config's "cvt"): V is the
transposed operand of P@V, and where it is converted decides whether the MMA gets it from
shared memory byte by byte or as fp16 through ldmatrix.trans (docs/kernels.md). Where the
config's "gluon" is on (the int8 default) and `_gluon_fits` (CUDA sm_80+, head_dim 128, 128-token
tiles, method `mma_k`, no runs), `decode_attention` launches the Gluon build of that kernel
instead (kernels/attention_decode_gluon.py: same arguments, grid and numerics, its copies
issued as soon as their buffer is free); the reduce is shared.

Float caches at head_dim 128 take the persistent kernel instead where its grid is evenly fed
(`persistent_applies`: every program of a grid that fills the GPU gets at least a round and a
half of whole contexts, or three quarters to all of its programs get one;
kernels/attention_decode_persistent_gluon.py, one stream of tiles a program across its items,
no split and no reduce); other batches keep `_decode_kernel` and its splits.

To extend: a change to how a K/V tile is loaded or folded in (sliding window, fp8 KV) goes into
`_decode_tile` (kernels/attention_decode_tile_triton.py, with the other per-tile pieces), loop
bounds into `_decode_kernel`; keep `_attend_tile` (prefill) and the
reference in step. A new launch knob becomes a `decode_config` key, so `bench/tune_decode.py`
can sweep it through `decode_attention(config=...)`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .attention_common_triton import _LOG2E, _dot_mode
from .attention_decode_gluon import _decode_int8_gluon_kernel
from .attention_decode_persistent_gluon import _decode_persistent_kernel, persistent_grid
from .attention_decode_tile_triton import _decode_tile, _fold_tile, _load_first_tile, _run_chunk, _split_part
from .attention_int8_triton import OP_MMA, _quant_rows, cvt_ops
from .attention_decode_plan import (DECODE_INT8, DECODE_TUNED, RUNS_PROGRAMS_PER_SM,  # noqa: F401
                                    _one_wave, _reg_cap, _sm_count, decode_config, gluon_q_smem,
                                    persistent_applies, plan_decode_splits, preload_enabled,
                                    early_tile_enabled)
from .pdl import pdl_enabled, pdl_launch, pdl_release, pdl_wait


@triton.jit(do_not_specialize=["s_bt", "spo_s", "spo_h", "spl_s", "spl_h"])
def _decode_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, bt_ptr, qsl_ptr, lens_ptr, span_ptr, order_ptr,
                   out_ptr, po_ptr, plse_ptr, scale_log2,
                   sq_t, sq_h, sq_d, sk_b, sk_s, sk_h, sk_d, sv_b, sv_s, sv_h, sv_d,
                   sks_b, sks_h, sks_s, svs_b, svs_h, svs_s, s_bt,
                   so_t, so_h, so_d, spo_s, spo_h, spo_p, spl_s, spl_h,
                   GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
                   BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                   SPLIT: tl.constexpr, LOWP: tl.constexpr, DOT_DTYPE: tl.constexpr,
                   KV_INT8: tl.constexpr, OP_K: tl.constexpr = 0, OP_V: tl.constexpr = 0,
                   ASM: tl.constexpr = False, PDL: tl.constexpr = False,
                   PRELOAD: tl.constexpr = False, GROUPED: tl.constexpr = False,
                   ROWS: tl.constexpr = 1, ORDERED: tl.constexpr = False):
    """One program: all query heads of one KV head (rows padded to BLOCK_G >= 16 for tl.dot) of
    one sequence, over one partition of its context. PDL: launched early, waits for the KV
    append before it (kernels/pdl.py). PRELOAD (float caches): the partition's first K/V tile is
    loaded before that wait, and its one row this step appends is loaded again after it.
    GROUPED (`row_span`): the program of a chunk's first row owns the chunk, up to ROWS rows of
    one sequence's run, as ROWS x GROUP query rows over the run's one block table: each K/V tile
    is loaded once for them all; the others own nothing. Row r sees its own context only."""
    pdl_release(PDL)
    if not PRELOAD:
        pdl_wait(PDL)
    EVEN_D: tl.constexpr = HEAD_DIM == BLOCK_D
    if ORDERED:
        # Programs in launch order take sequences in `order` (longest first), all KV heads of
        # one before the next, so the long contexts start in the first wave.
        lin = tl.program_id(0) + tl.program_id(1) * tl.num_programs(0)
        seq = tl.load(order_ptr + lin // tl.num_programs(1))
        kvh = lin % tl.num_programs(1)
    else:
        seq = tl.program_id(0)
        kvh = tl.program_id(1)
    split = tl.program_id(2)
    offs_g = tl.arange(0, BLOCK_G)
    if GROUPED:
        at, _, count = _run_chunk(span_ptr, seq, ROWS)
        count = tl.where(at == 0, count, 0)  # the chunk's first row's program owns it
        seqs = seq + offs_g // GROUP         # each query row's sequence (row of the run)
        g_mask = offs_g // GROUP < count
        heads = kvh * GROUP + offs_g % GROUP
        row = tl.load(qsl_ptr + seqs, mask=g_mask, other=0)
        has_query = g_mask & ((tl.load(qsl_ptr + seqs + 1, mask=g_mask, other=0) - row) > 0)
        ctx_rows = tl.load(lens_ptr + seqs, mask=g_mask, other=0)
        ctx = tl.max(ctx_rows, axis=0)  # the chunk's partitions follow its longest context
        ctx_low = tl.min(tl.where(g_mask, ctx_rows, ctx), axis=0)
    else:
        row = tl.load(qsl_ptr + seq)
        # exactly one row: in a mixed step the prefill kernel takes the longer queries
        has_query = (tl.load(qsl_ptr + seq + 1) - row) == 1
        ctx = tl.where(has_query, tl.load(lens_ptr + seq), 0)
        g_mask = offs_g < GROUP
        heads = kvh * GROUP + offs_g
    if SPLIT:
        part = _split_part(ctx, tl.num_programs(2), BLOCK_N)
        lo = split * part
        hi = tl.maximum(tl.minimum(lo + part, ctx), lo)
    else:
        lo = 0
        hi = ctx
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    bt_row = bt_ptr + seq.to(tl.int64) * s_bt
    k_head = k_ptr + kvh * sk_h
    v_head = v_ptr + kvh * sv_h
    if PRELOAD:
        # Before the wait: only step inputs (qsl, seq_lens, block tables, written before the
        # step's first kernel) and K/V rows earlier steps appended. The row at ctx - 1 is this
        # step's: whatever was read for it is replaced after the wait.
        k_pre, v_pre, pre_blk, pre_pos, pre_mask = _load_first_tile(k_head, v_head, bt_row, lo, hi, offs_d,
                                                                     d_mask, sk_b, sk_s, sk_d, sv_b,
                                                                     sv_s, sv_d, PAGE, BLOCK_N)
        pdl_wait(PDL)
    if GROUPED:
        q_at = row.to(tl.int64)[:, None] * sq_t
        q_ok = has_query[:, None]
    else:
        q_at = row.to(tl.int64) * sq_t
        q_ok = has_query
    q = tl.load(q_ptr + q_at + heads[:, None] * sq_h + offs_d[None, :] * sq_d,
                mask=g_mask[:, None] & d_mask[None, :] & q_ok, other=0.0)
    q_scl = scale_log2  # OP_MMA: per-row q scales times the softmax scale
    if KV_INT8:
        if OP_K == 5:
            q, q_amax = _quant_rows(q)  # int8 codes, once per program
            q_scl = q_amax * scale_log2
        else:
            q = q.to(DOT_DTYPE)  # once, not per tile (fp16 on CUDA even for a bf16 model)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    ks_head = ks_ptr + kvh * sks_h
    vs_head = vs_ptr + kvh * svs_h
    # Whole tiles without masks, then at most one clipped tile (the context's end). A run's
    # rows: whole tiles below its shortest context, then tiles each row clips to its own.
    if GROUPED:
        full_hi = lo + tl.maximum(tl.minimum(hi, ctx_low) - lo, 0) // BLOCK_N * BLOCK_N
        row_hi = tl.minimum(ctx_rows, hi)
    else:
        full_hi = lo + (hi - lo) // BLOCK_N * BLOCK_N
        row_hi = hi
    first = lo
    if PRELOAD:
        if lo < hi:  # an empty partition folds nothing (its tile is all masked)
            new_row = (lo + tl.arange(0, BLOCK_N)) == ctx - 1
            new_mask = new_row[:, None] & d_mask[None, :]
            k_new = tl.load(k_head + (pre_blk * sk_b + pre_pos * sk_s)[:, None] + offs_d[None, :] * sk_d,
                            mask=new_mask, other=0.0)
            v_new = tl.load(v_head + (pre_blk * sv_b + pre_pos * sv_s)[:, None] + offs_d[None, :] * sv_d,
                            mask=new_mask, other=0.0)
            acc, m_i, l_i = _fold_tile(acc, m_i, l_i, q, tl.where(new_mask, k_new, k_pre),
                                       tl.where(new_mask, v_new, v_pre), pre_mask, scale_log2,
                                       LOWP, DOT_DTYPE)
        first = lo + BLOCK_N
        full_hi = tl.maximum(full_hi, first)
    for start in range(first, full_hi, BLOCK_N):
        acc, m_i, l_i = _decode_tile(acc, m_i, l_i, q, scale_log2, q_scl, k_head, v_head, ks_head,
                                     vs_head, bt_row, start, hi, offs_d, d_mask, sk_b, sk_s, sk_d,
                                     sv_b, sv_s, sv_d, sks_b, sks_s, svs_b, svs_s,
                                     False, EVEN_D, PAGE, BLOCK_N, LOWP, DOT_DTYPE, KV_INT8, OP_K,
                                     OP_V, ASM)
    for start in range(full_hi, hi, BLOCK_N):
        acc, m_i, l_i = _decode_tile(acc, m_i, l_i, q, scale_log2, q_scl, k_head, v_head, ks_head,
                                     vs_head, bt_row, start, hi, offs_d, d_mask, sk_b, sk_s, sk_d,
                                     sv_b, sv_s, sv_d, sks_b, sks_s, svs_b, svs_s,
                                     True, EVEN_D, PAGE, BLOCK_N, LOWP, DOT_DTYPE, KV_INT8, OP_K,
                                     OP_V, ASM, row_hi, GROUPED)
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    o = acc / l_safe[:, None]
    if SPLIT and GROUPED:
        # Each run row's partial (a row that sees nothing of the partition: 0 and -inf).
        po = po_ptr + seqs.to(tl.int64)[:, None] * spo_s + split * spo_p
        tl.store(po + heads[:, None] * spo_h + offs_d[None, :], o,
                 mask=has_query[:, None] & d_mask[None, :] & (lo < hi))
        tl.store(plse_ptr + seqs.to(tl.int64) * spl_s + heads * spl_h + split,
                 m_i + tl.log2(l_safe), mask=has_query & (lo < hi))
    elif SPLIT:
        # Normalised partial output + its log2-sum-exp. Empty partitions (lo >= ctx) write
        # nothing: the reduce reads only the partitions that hold tokens.
        po = po_ptr + seq.to(tl.int64) * spo_s + split * spo_p
        tl.store(po + heads[:, None] * spo_h + offs_d[None, :], o,
                 mask=g_mask[:, None] & d_mask[None, :] & (lo < hi))
        tl.store(plse_ptr + seq.to(tl.int64) * spl_s + heads * spl_h + split,
                 m_i + tl.log2(l_safe), mask=g_mask & (lo < hi))
    elif GROUPED:
        dst = out_ptr + row.to(tl.int64)[:, None] * so_t + heads[:, None] * so_h + offs_d[None, :] * so_d
        tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=has_query[:, None] & d_mask[None, :])
    else:
        dst = out_ptr + row.to(tl.int64) * so_t + heads[:, None] * so_h + offs_d[None, :] * so_d
        tl.store(dst, o.to(out_ptr.dtype.element_ty),
                 mask=g_mask[:, None] & d_mask[None, :] & has_query)


@triton.jit(do_not_specialize=["num_splits", "spo_s", "spo_h", "spl_s", "spl_h"])
def _reduce_kernel(po_ptr, plse_ptr, qsl_ptr, lens_ptr, span_ptr, out_ptr, num_splits,
                   spo_s, spo_h, spo_p, spl_s, spl_h, so_t, so_h, so_d,
                   HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, CHUNK: tl.constexpr,
                   BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr = False,
                   GROUPED: tl.constexpr = False, ROWS: tl.constexpr = 1, BLOCK_R: tl.constexpr = 1):
    """Merge a head's partial outputs with log-sum-exp weights: grid (num_seqs, num_heads). Only
    the partitions that hold tokens (recomputed from seq_lens as the decode kernel did) are read.
    With PDL the o projection after it may start loading its weights at once, and it waits for
    the partials (kernels/pdl.py)."""
    pdl_release(PDL)
    pdl_wait(PDL)
    seq = tl.program_id(0)
    head = tl.program_id(1)
    row = tl.load(qsl_ptr + seq)
    has_query = (tl.load(qsl_ptr + seq + 1) - row) == 1
    if GROUPED:  # the partitions of the row's chunk: by the chunk's longest context
        _, first, count = _run_chunk(span_ptr, seq, ROWS)
        offs_r = tl.arange(0, BLOCK_R)
        ctx = tl.max(tl.load(lens_ptr + first + offs_r, mask=offs_r < count, other=0), axis=0)
        ctx = tl.where(has_query, ctx, 0)
    else:
        ctx = tl.where(has_query, tl.load(lens_ptr + seq), 0)
    used = tl.cdiv(ctx, _split_part(ctx, num_splits, BLOCK_N))
    plse = plse_ptr + seq.to(tl.int64) * spl_s + head * spl_h
    po = po_ptr + seq.to(tl.int64) * spo_s + head * spo_h
    offs_s = tl.arange(0, BLOCK_S)
    m = tl.max(tl.load(plse + offs_s, mask=offs_s < used, other=float("-inf")), axis=0)
    m = tl.where(m == float("-inf"), 0.0, m)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    acc = tl.zeros([BLOCK_D], tl.float32)
    denom = 0.0
    for s0 in range(0, used, CHUNK):
        offs = s0 + tl.arange(0, CHUNK)
        s_mask = offs < used
        w = tl.exp2(tl.load(plse + offs, mask=s_mask, other=float("-inf")) - m)
        o = tl.load(po + offs[:, None] * spo_p + offs_d[None, :],
                    mask=s_mask[:, None] & d_mask[None, :], other=0.0)
        acc += tl.sum(w[:, None] * o, axis=0)
        denom += tl.sum(w, axis=0)
    out = acc / tl.where(denom == 0.0, 1.0, denom)
    tl.store(out_ptr + row.to(tl.int64) * so_t + head * so_h + offs_d * so_d,
             out.to(out_ptr.dtype.element_ty), mask=d_mask & has_query)


def _partials(q, out, num_seqs, splits):
    """Float32 scratch for `splits` partial outputs and log-sum-exps a (sequence, head), with
    their strides; with one partition none (the kernels write `out`, the arguments unused)."""
    if splits == 1:
        return out, out, (0, 0, 0), (0, 0)
    num_heads, head_dim = q.shape[1], q.shape[2]
    n_out = num_seqs * num_heads * splits * head_dim
    scratch = torch.empty(n_out + num_seqs * num_heads * splits, dtype=torch.float32, device=q.device)
    part_out = scratch[:n_out].view(num_seqs, num_heads, splits, head_dim)
    part_lse = scratch[n_out:].view(num_seqs, num_heads, splits)
    return part_out, part_lse, part_out.stride()[:3], part_lse.stride()[:2]


def _gluon_layouts_fit(q, k_cache, v_cache, out) -> bool:
    """What both Gluon decode kernels' layouts are written for: CUDA sm_80+, head_dim 128, at
    most 16 query heads a KV head, unit strides along the head dim."""
    return (q.is_cuda and q.shape[2] == 128 and q.shape[1] // k_cache.shape[2] <= 16
            and torch.cuda.get_device_capability(q.device)[0] >= 8
            and q.stride(2) == k_cache.stride(3) == v_cache.stride(3) == out.stride(2) == 1)


def _persistent_fits(cfg, row_span, q, k_cache, v_cache, out) -> bool:
    """Whether `_decode_persistent_kernel` takes this call: the config asks for it
    ("persistent"), a float cache of q's dtype (fp16 / bf16), no runs, and
    `_gluon_layouts_fit`."""
    return (bool(cfg.get("persistent")) and row_span is None
            and q.dtype in (torch.float16, torch.bfloat16) and k_cache.dtype == q.dtype
            and v_cache.dtype == q.dtype and _gluon_layouts_fit(q, k_cache, v_cache, out))


def _launch_reduce(part_out, part_lse, query_start_loc, seq_lens, span, out, splits, po_strides,
                   pl_strides, block_d, block_n, pdl, cfg, grouped=False, rows=1):
    """`_reduce_kernel` over `splits` partitions of each (sequence, head), planned with tiles of
    `block_n` tokens as the decode kernel's were."""
    block_s = triton.next_power_of_2(splits)
    _reduce_kernel[(seq_lens.shape[0], out.shape[1])](
        part_out, part_lse, query_start_loc, seq_lens, span, out, splits, *po_strides, *pl_strides,
        *out.stride(), HEAD_DIM=out.shape[2], BLOCK_S=block_s, CHUNK=min(block_s, 16),
        BLOCK_D=block_d, BLOCK_N=block_n, PDL=pdl, GROUPED=grouped, ROWS=rows,
        BLOCK_R=triton.next_power_of_2(rows), num_warps=cfg["reduce_warps"], **pdl_launch(pdl))


def _decode_persistent(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale, out,
                       num_splits, cfg, order):
    """`decode_attention` through the persistent kernel: a grid of `persistent_resident`
    programs a SM, whole contexts unless `num_splits` forces partitions (then the shared
    reduce)."""
    num_seqs, num_heads, head_dim = seq_lens.shape[0], q.shape[1], q.shape[2]
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    block_n, resident = cfg["persistent_block_n"], cfg["persistent_resident"]
    splits = max(1, int(num_splits or 1))
    part_out, part_lse, po_strides, pl_strides = _partials(q, out, num_seqs, splits)
    pdl = pdl_enabled(q)
    ordered = order is not None
    items = num_seqs * num_kv_heads * splits
    grid = persistent_grid(items, resident, _sm_count(q.device), cfg.get("persistent_programs"))
    _decode_persistent_kernel[(grid,)](
        q, k_cache, v_cache, block_tables, query_start_loc, seq_lens,
        order if ordered else seq_lens, out, part_out, part_lse, scale * _LOG2E, num_seqs, splits,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_tables.stride(0),
        out.stride(0), out.stride(1), *po_strides, *pl_strides,
        KV_HEADS=num_kv_heads, SPLIT=splits > 1, GROUP=num_heads // num_kv_heads, PAGE=page_size,
        BLOCK_N=block_n, ORDERED=ordered, PDL=pdl, num_warps=4, **pdl_launch(pdl),
        **_reg_cap(cfg, "persistent_maxnreg"))
    if splits > 1:
        _launch_reduce(part_out, part_lse, query_start_loc, seq_lens, seq_lens, out, splits,
                       po_strides, pl_strides, head_dim, block_n, pdl, cfg)
    return out


def _gluon_fits(cfg, op_k, grouped, q, k_cache, v_cache, k_scale, v_scale, out) -> bool:
    """Whether `_decode_int8_gluon_kernel` takes this call: the config asks for it ("gluon"),
    int8 caches read by `mma_k` (OP_MMA), no runs, CUDA sm_80+, head_dim 128, 128-token tiles,
    unit strides along the head dim (its layouts are written for that), block and token strides
    of 16-byte multiples whose offsets fit int32 in 16-byte units (`_row_units`)."""
    return (bool(cfg.get("gluon")) and k_cache.dtype == torch.int8 and op_k == OP_MMA
            and not grouped and cfg["block_n"] == 128 and _gluon_layouts_fit(q, k_cache, v_cache, out)
            and k_scale.stride(2) == v_scale.stride(2) == 1
            and all(c.stride(0) % 16 == 0 and c.stride(1) % 16 == 0 and c.shape[0] * c.stride(0) < 2**35
                    for c in (k_cache, v_cache)))


def decode_attention(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale, out,
                     num_splits=None, config=None, k_scale=None, v_scale=None, row_span=None,
                     order=None):
    """Decode kernel writing into `out` the rows of the sequences that have exactly one query
    row (every sequence of a decode step; a mixed step's decode rows, its longer queries left
    to the prefill kernel).
    `num_splits` forces the split count; `config` overrides keys of `decode_config`;
    `k_scale`/`v_scale` go with an int8 cache.

    `row_span` (int32 `[num_seqs]`, optional): runs of consecutive sequences that are one
    request's positions (a verify step laid out as decode rows, worker/spec_decode/verify.py):
    `row_span[i]` = n > 0 starts a run of n sequences, and -j marks the j-th sequence after its
    run's start; single sequences are runs of 1. A run's sequences must share one block table
    (the first one's is read) and have one query row each. Their outputs are the same; each
    program then serves several of a run's sequences (config "run_block_g" query rows, 16 by
    default: 16 // GROUP sequences), so each K/V tile is read once for them, not once each.

    `order` (int32 `[num_seqs]`, a permutation, optional; ignored with `row_span`): the order in
    which programs take sequences (`kernels.attention.decode_order`: longest context first), all
    KV heads of one before the next."""
    num_seqs = seq_lens.shape[0]
    num_heads, head_dim = q.shape[1], q.shape[2]
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    cfg = decode_config(q, k_cache.dtype)
    if config:
        cfg.update(config)
    if _persistent_fits(cfg, row_span, q, k_cache, v_cache, out) and (
            num_splits or cfg.get("persistent_programs")
            or persistent_applies(num_seqs, num_kv_heads, q.device, cfg)):
        return _decode_persistent(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens,
                                  scale, out, num_splits, cfg, order)
    block_n = cfg["block_n"]
    block_d = max(16, triton.next_power_of_2(head_dim))
    block_g = max(16, triton.next_power_of_2(group))  # tl.dot needs >= 16 rows
    grouped = row_span is not None
    if grouped:
        block_g = max(block_g, triton.next_power_of_2(cfg.get("run_block_g", 16)))
    rows = block_g // group  # a run's sequences per program
    # With runs, the programs that own work are about one per `rows` sequences (a verify
    # step's chunks), and the split count is planned for them (config "runs_split": "chunks";
    # "rows" plans for every sequence, as without runs), at "runs_programs_per_sm" a SM.
    chunks = grouped and cfg.get("runs_split", "chunks") == "chunks"
    per_sm = cfg["programs_per_sm"]
    if grouped and per_sm is not None:
        per_sm = cfg.get("runs_programs_per_sm", RUNS_PROGRAMS_PER_SM)
    splits = plan_decode_splits(triton.cdiv(num_seqs, rows) if chunks else num_seqs, num_kv_heads,
                                block_tables.shape[1] * page_size,
                                q.device, num_splits, per_sm, cfg["min_partition"],
                                cfg.get("small_per_sm"), cfg.get("small_programs", 0),
                                None if grouped else cfg.get("resident_per_sm"), cfg.get("wave_fill", 0.0))
    part_out, part_lse, po_strides, pl_strides = _partials(q, out, num_seqs, splits)
    lowp, dot_dtype = _dot_mode(q, k_cache.dtype)
    kv_int8 = k_cache.dtype == torch.int8
    op_k, op_v = cvt_ops(cfg["cvt"], k_cache, v_cache)
    if kv_int8:
        scales, s_strides = (k_scale, v_scale), (*k_scale.stride(), *v_scale.stride())
    else:  # never read: KV_INT8 is off
        scales, s_strides = (k_cache, v_cache), (0,) * 6
    pdl = pdl_enabled(q)
    preload = cfg.get("preload")
    if preload is None:
        preload = pdl and preload_enabled() and num_seqs * num_kv_heads * splits <= _one_wave(cfg, q.device)
    preload = bool(preload) and not kv_int8 and not grouped
    span = row_span if grouped else seq_lens  # never read when not grouped
    ordered = order is not None and not grouped
    order_arg = order if ordered else seq_lens  # never read when not ordered
    if _gluon_fits(cfg, op_k, grouped, q, k_cache, v_cache, k_scale, v_scale, out):
        q_smem = gluon_q_smem(cfg, num_seqs * num_kv_heads * splits, q.device)
        _decode_int8_gluon_kernel[(num_seqs, num_kv_heads, splits)](
            q, k_cache, v_cache, *scales, block_tables, query_start_loc, seq_lens, order_arg, out,
            part_out, part_lse, scale * _LOG2E, block_tables.shape[1] * page_size, q.stride(0),
            q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
            v_cache.stride(2), k_scale.stride(0), k_scale.stride(1), v_scale.stride(0),
            v_scale.stride(1), block_tables.stride(0), out.stride(0), out.stride(1), *po_strides,
            *pl_strides, GROUP=group, PAGE=page_size, BLOCK_N=block_n, SPLIT=splits > 1,
            ORDERED=ordered, PDL=pdl, Q_SMEM=q_smem, EARLY_TILE=early_tile_enabled(), num_warps=4,
            **(_reg_cap(cfg, "q_smem_maxnreg") if q_smem else {}), **pdl_launch(pdl))
    else:
        _decode_kernel[(num_seqs, num_kv_heads, splits)](
            q, k_cache, v_cache, *scales, block_tables, query_start_loc, seq_lens, span, order_arg, out, part_out,
            part_lse, scale * _LOG2E, *q.stride(), *k_cache.stride(), *v_cache.stride(), *s_strides,
            block_tables.stride(0), *out.stride(), *po_strides, *pl_strides,
            GROUP=group, HEAD_DIM=head_dim, PAGE=page_size, BLOCK_G=block_g, BLOCK_D=block_d,
            BLOCK_N=block_n, SPLIT=splits > 1, LOWP=lowp, DOT_DTYPE=dot_dtype, KV_INT8=kv_int8,
            OP_K=op_k, OP_V=op_v, ASM=q.is_cuda, PDL=pdl, PRELOAD=preload, GROUPED=grouped, ROWS=rows,
            ORDERED=ordered,
            num_warps=cfg["num_warps"],
            num_stages=cfg["num_stages"], **pdl_launch(pdl), **_reg_cap(cfg))
    if splits > 1:
        _launch_reduce(part_out, part_lse, query_start_loc, seq_lens, span, out, splits,
                       po_strides, pl_strides, block_d, block_n, pdl, cfg, grouped, rows)
    return out
