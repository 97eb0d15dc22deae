"""Triton paged attention: a split-K decode kernel and a varlen causal prefill kernel.

Owns: `paged_attention_triton`, the GPU twin of `paged_attention_ref` (same contract: query rows of
sequence i are the last q_len_i positions of its seq_lens[i]-token context, read through its
block table; GQA by head groups). Must never read KV positions >= seq_lens[i] (block tables may be
padded with junk ids) and never sync with the host when `max_query_len` is given, so the decode
path can be captured in a CUDA graph.

Kernels:
- `_decode_kernel`, used when max_query_len == 1. Grid (num_seqs, num_kv_heads, num_splits). One
  program owns all query heads of one KV head (padded to >= 16 rows for tl.dot), so each K/V tile
  is loaded once for the whole group. Each sequence's context is cut into `num_splits` equal
  partitions (lengths derived in the kernel from its own seq_len) computed in parallel
  (flash-decoding); with more than one, each writes a normalised partial output plus its
  log-sum-exp, and `_reduce_kernel` (grid (num_seqs, num_heads)) merges the non-empty ones. The
  split count is chosen from tensor shapes only (block-table width, batch, SM count), never from
  seq_lens values; launch parameters come from `decode_config` (tuned: `DECODE_TUNED`).
- `_prefill_kernel`, for everything else (prefill, chunked prefill over a cached prefix, mixed
  batches). Grid (num_seqs, num_heads, cdiv(max_query_len, BLOCK_M)). Flash-attention online
  softmax over K/V tiles gathered through the block table; tiles entirely before the block's first
  query position skip the causal mask, the remaining diagonal tiles apply it.

Numerics: scores, softmax statistics and accumulators are float32; exponentials are base 2 with
the scale folded into log2(e). On CUDA with fp16/bf16 inputs the tl.dot operands stay in that dtype
(probabilities are cast to it for P@V, as usual); in float32 or on the CPU interpreter the dots
run in float32 with input_precision="ieee" (the interpreter's bf16 math is wrong).

Head dims: any even size up to 256; tiles are padded to a power of two >= 16 and masked.
To extend (e.g. sliding window, fp8 KV), change `_attend_tile` (prefill) and `_decode_tile`
(decode), the places a K/V tile is loaded and folded in, and the loop bounds; keep the
reference in step.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_LOG2E = 1.4426950408889634
_MAX_HEAD_DIM = 256
_MIN_PARTITION = 256      # tokens; shorter partitions cost more in the reduce than they save
_MAX_SPLITS = 256
_sm_counts: dict[int, int] = {}


@triton.jit
def _dot(a, b, LOWP: tl.constexpr, DOT_DTYPE: tl.constexpr):
    if LOWP:
        res = tl.dot(a.to(DOT_DTYPE), b.to(DOT_DTYPE))
    else:
        res = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return res


@triton.jit
def _attend_tile(acc, m_i, l_i, q, k_ptr, v_ptr, bt_row, start, hi, q_pos, page_size,
                 sk_b, sk_s, sk_d, sv_b, sv_s, sv_d, scale_log2, offs_d, d_mask,
                 MASKED: tl.constexpr, CAUSAL: tl.constexpr, LOWP: tl.constexpr,
                 DOT_DTYPE: tl.constexpr, BLOCK_N: tl.constexpr):
    """Fold KV positions [start, start+BLOCK_N) into the running softmax state of q's rows.
    k_ptr/v_ptr already point at the right KV head. MASKED: positions may reach `hi` (and, if
    CAUSAL, pass a row's own position `q_pos`); unmasked tiles are known to be fully visible."""
    offs_n = start + tl.arange(0, BLOCK_N)
    if MASKED:
        n_mask = offs_n < hi
    else:
        n_mask = offs_n >= 0
    # Page lookup per token, so tiles need not align with pages. Masked lanes never touch
    # the table, which is how padded block-table entries stay unread.
    blk = tl.load(bt_row + offs_n // page_size, mask=n_mask, other=0).to(tl.int64)
    pos = (offs_n % page_size).to(tl.int64)
    kt = tl.load(k_ptr + (blk * sk_b + pos * sk_s)[None, :] + offs_d[:, None] * sk_d,
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
    v = tl.load(v_ptr + (blk * sv_b + pos * sv_s)[:, None] + offs_d[None, :] * sv_d,
                mask=n_mask[:, None] & d_mask[None, :], other=0.0)
    acc = acc * alpha[:, None] + _dot(p, v, LOWP, DOT_DTYPE)
    return acc, m_new, l_i


@triton.jit
def _split_part(ctx, num_splits, BLOCK_N: tl.constexpr):
    """Tokens per partition when a `ctx`-token context is cut `num_splits` ways: whole tiles, at
    least one. Computed in the kernels from the sequence's own length, so each sequence is split
    evenly whatever the block-table width, while the grid depends on shapes only."""
    return tl.maximum(tl.cdiv(tl.cdiv(ctx, num_splits), BLOCK_N), 1) * BLOCK_N


@triton.jit
def _load_masked(ptrs, mask, HAS_MASK: tl.constexpr):
    if HAS_MASK:
        x = tl.load(ptrs, mask=mask, other=0.0)
    else:
        x = tl.load(ptrs)
    return x


@triton.jit
def _decode_tile(acc, m_i, l_i, q, scale_log2, k_head, v_head, bt_row, start, hi, offs_d, d_mask,
                 sk_b, sk_s, sk_d, sv_b, sv_s, sv_d,
                 MASKED: tl.constexpr, EVEN_D: tl.constexpr, PAGE: tl.constexpr,
                 BLOCK_N: tl.constexpr, LOWP: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """Fold KV positions [start, start+BLOCK_N) (MASKED: clipped to `hi`) into the running softmax
    state of the group's query rows. K/V tiles are [BLOCK_N, BLOCK_D]."""
    offs_t = tl.arange(0, BLOCK_N)
    if PAGE % BLOCK_N == 0:
        # The tile lies inside one page: one block-table entry, contiguous token rows.
        blk = tl.load(bt_row + start // PAGE).to(tl.int64)
        pos = start % PAGE + offs_t
    else:
        # Several pages per tile: one table lookup per token (PAGE is a compile-time constant,
        # so shifts for power-of-two pages). Masked lanes never read the table.
        offs_n = start + offs_t
        if MASKED:
            blk = tl.load(bt_row + offs_n // PAGE, mask=offs_n < hi, other=0).to(tl.int64)
        else:
            blk = tl.load(bt_row + offs_n // PAGE).to(tl.int64)
        pos = offs_n % PAGE
    if MASKED:
        n_mask = (start + offs_t) < hi
        kv_mask = n_mask[:, None] & d_mask[None, :]
    else:
        kv_mask = d_mask[None, :]
    HAS_MASK: tl.constexpr = MASKED or not EVEN_D
    k = _load_masked(k_head + (blk * sk_b + pos * sk_s)[:, None] + offs_d[None, :] * sk_d,
                     kv_mask, HAS_MASK)
    s = _dot(q, tl.trans(k), LOWP, DOT_DTYPE) * scale_log2
    if MASKED:
        s = tl.where(n_mask[None, :], s, float("-inf"))
    # Every tile holds at least one visible position, so m_new is finite.
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v = _load_masked(v_head + (blk * sv_b + pos * sv_s)[:, None] + offs_d[None, :] * sv_d,
                     kv_mask, HAS_MASK)
    acc = acc * alpha[:, None] + _dot(p, v, LOWP, DOT_DTYPE)
    return acc, m_new, l_i


@triton.jit(do_not_specialize=["s_bt", "spo_s", "spo_h", "spl_s", "spl_h"])
def _decode_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, qsl_ptr, lens_ptr, out_ptr, po_ptr, plse_ptr,
                   scale_log2,
                   sq_t, sq_h, sq_d, sk_b, sk_s, sk_h, sk_d, sv_b, sv_s, sv_h, sv_d, s_bt,
                   so_t, so_h, so_d, spo_s, spo_h, spo_p, spl_s, spl_h,
                   GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
                   BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                   SPLIT: tl.constexpr, LOWP: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """One program: all query heads of one KV head (rows padded to BLOCK_G >= 16 for tl.dot) of
    one sequence, over one partition of its context."""
    EVEN_D: tl.constexpr = HEAD_DIM == BLOCK_D
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    row = tl.load(qsl_ptr + seq)
    has_query = (tl.load(qsl_ptr + seq + 1) - row) > 0
    ctx = tl.where(has_query, tl.load(lens_ptr + seq), 0)
    if SPLIT:
        part = _split_part(ctx, tl.num_programs(2), BLOCK_N)
        lo = split * part
        hi = tl.maximum(tl.minimum(lo + part, ctx), lo)
    else:
        lo = 0
        hi = ctx
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    heads = kvh * GROUP + offs_g
    q = tl.load(q_ptr + row.to(tl.int64) * sq_t + heads[:, None] * sq_h + offs_d[None, :] * sq_d,
                mask=g_mask[:, None] & d_mask[None, :] & has_query, other=0.0)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    bt_row = bt_ptr + seq.to(tl.int64) * s_bt
    k_head = k_ptr + kvh * sk_h
    v_head = v_ptr + kvh * sv_h
    # Whole tiles without masks, then at most one clipped tile (the context's end).
    full_hi = lo + (hi - lo) // BLOCK_N * BLOCK_N
    for start in range(lo, full_hi, BLOCK_N):
        acc, m_i, l_i = _decode_tile(acc, m_i, l_i, q, scale_log2, k_head, v_head, bt_row, start,
                                     hi, offs_d, d_mask, sk_b, sk_s, sk_d, sv_b, sv_s, sv_d,
                                     False, EVEN_D, PAGE, BLOCK_N, LOWP, DOT_DTYPE)
    for start in range(full_hi, hi, BLOCK_N):
        acc, m_i, l_i = _decode_tile(acc, m_i, l_i, q, scale_log2, k_head, v_head, bt_row, start,
                                     hi, offs_d, d_mask, sk_b, sk_s, sk_d, sv_b, sv_s, sv_d,
                                     True, EVEN_D, PAGE, BLOCK_N, LOWP, DOT_DTYPE)
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    o = acc / l_safe[:, None]
    if SPLIT:
        # Normalised partial output + its log2-sum-exp. Empty partitions (lo >= ctx) write
        # nothing: the reduce reads only the partitions that hold tokens.
        po = po_ptr + seq.to(tl.int64) * spo_s + split * spo_p
        tl.store(po + heads[:, None] * spo_h + offs_d[None, :], o,
                 mask=g_mask[:, None] & d_mask[None, :] & (lo < hi))
        tl.store(plse_ptr + seq.to(tl.int64) * spl_s + heads * spl_h + split,
                 m_i + tl.log2(l_safe), mask=g_mask & (lo < hi))
    else:
        dst = out_ptr + row.to(tl.int64) * so_t + heads[:, None] * so_h + offs_d[None, :] * so_d
        tl.store(dst, o.to(out_ptr.dtype.element_ty),
                 mask=g_mask[:, None] & d_mask[None, :] & has_query)


@triton.jit(do_not_specialize=["num_splits", "spo_s", "spo_h", "spl_s", "spl_h"])
def _reduce_kernel(po_ptr, plse_ptr, qsl_ptr, lens_ptr, out_ptr, num_splits,
                   spo_s, spo_h, spo_p, spl_s, spl_h, so_t, so_h, so_d,
                   HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, CHUNK: tl.constexpr,
                   BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):
    """Merge a head's partial outputs with log-sum-exp weights: grid (num_seqs, num_heads). Only
    the partitions that hold tokens (recomputed from seq_lens as the decode kernel did) are read."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    row = tl.load(qsl_ptr + seq)
    has_query = (tl.load(qsl_ptr + seq + 1) - row) > 0
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


@triton.jit
def _prefill_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, qsl_ptr, lens_ptr, out_ptr, scale_log2, page_size,
                    sq_t, sq_h, sq_d, sk_b, sk_s, sk_h, sk_d, sv_b, sv_s, sv_h, sv_d, s_bt,
                    so_t, so_h, so_d,
                    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, LOWP: tl.constexpr,
                    DOT_DTYPE: tl.constexpr):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    mblk = tl.program_id(2)
    kvh = head // GROUP
    row0 = tl.load(qsl_ptr + seq)
    q_len = tl.load(qsl_ptr + seq + 1) - row0
    ctx = tl.load(lens_ptr + seq)
    offs_m = mblk * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_mask = offs_m < q_len
    d_mask = offs_d < HEAD_DIM
    q_pos = ctx - q_len + offs_m
    first_pos = ctx - q_len + mblk * BLOCK_M
    active = mblk * BLOCK_M < q_len
    # Keys before the block's first query position are visible to every row: whole tiles of
    # them run unmasked; the rest (up to the last row's position) take the causal mask.
    full_hi = tl.where(active, (first_pos // BLOCK_N) * BLOCK_N, 0)
    hi = tl.where(active, tl.minimum(ctx, first_pos + BLOCK_M), 0)
    rows = (row0 + offs_m).to(tl.int64)
    q = tl.load(q_ptr + rows[:, None] * sq_t + head * sq_h + offs_d[None, :] * sq_d,
                mask=m_mask[:, None] & d_mask[None, :], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    bt_row = bt_ptr + seq.to(tl.int64) * s_bt
    k_head = k_ptr + kvh * sk_h
    v_head = v_ptr + kvh * sv_h
    for start in range(0, full_hi, BLOCK_N):
        acc, m_i, l_i = _attend_tile(acc, m_i, l_i, q, k_head, v_head, bt_row, start, hi, q_pos,
                                     page_size, sk_b, sk_s, sk_d, sv_b, sv_s, sv_d, scale_log2,
                                     offs_d, d_mask, False, True, LOWP, DOT_DTYPE, BLOCK_N)
    for start in range(full_hi, hi, BLOCK_N):
        acc, m_i, l_i = _attend_tile(acc, m_i, l_i, q, k_head, v_head, bt_row, start, hi, q_pos,
                                     page_size, sk_b, sk_s, sk_d, sv_b, sv_s, sv_d, scale_log2,
                                     offs_d, d_mask, True, True, LOWP, DOT_DTYPE, BLOCK_N)
    o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(out_ptr + rows[:, None] * so_t + head * so_h + offs_d[None, :] * so_d,
             o.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])


_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def _dot_mode(q):
    """(LOWP, DOT_DTYPE): native half-precision dots on CUDA, float32 everywhere else."""
    lowp = q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)
    return lowp, (_TL_DTYPES[q.dtype] if lowp else tl.float32)


def _tiles(q, block_d):
    """Prefill (BLOCK_M, BLOCK_N, num_warps, num_stages), checked against sm_90 ptxas for no
    register spills at head_dim 64/128/256. float32 dots run without tensor cores and hold their
    operands in registers, hence the narrower tiles and 8 warps. On the interpreter small tiles
    keep several tiles per test case, exercising the boundaries."""
    if not q.is_cuda:
        return 16, 16, 4, 1
    if q.dtype == torch.float32:
        return 32, 16, 8, 2
    if block_d <= 128:
        return 64, 64, 4, 3
    return 64, 32, 8, 2


def _sm_count(device) -> int:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _sm_counts:
        _sm_counts[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _sm_counts[idx]


# Decode launch config for CUDA fp16/bf16 with head_dim <= 128, tuned on an H100 with
# bench/tune_decode.py (results and the rejected variants in docs/kernels.md): tile tokens,
# warps, pipeline depth, and the split rule (programs_per_sm, min_partition).
DECODE_TUNED = dict(block_n=64, num_warps=4, num_stages=2, programs_per_sm=2,
                    min_partition=256, reduce_warps=4)


def decode_config(q):
    """Default decode launch config, from dtype, device and head_dim only: block_n (tokens per
    K/V tile), num_warps, num_stages, programs_per_sm and min_partition (the split rule, see
    `plan_decode_splits`), reduce_warps. `decode_attention(config=...)` overrides any of them
    (benchmarks, tests)."""
    if not q.is_cuda:  # interpreter: small tiles so tests cross tile and page boundaries
        return dict(block_n=16, num_warps=4, num_stages=1, programs_per_sm=None,
                    min_partition=_MIN_PARTITION, reduce_warps=4)
    if q.dtype == torch.float32 or q.shape[2] > 128:
        # float32 dots hold their operands in registers; 256-wide heads double the tiles.
        return dict(block_n=32, num_warps=8, num_stages=2, programs_per_sm=4,
                    min_partition=_MIN_PARTITION, reduce_warps=4)
    return dict(DECODE_TUNED)


def plan_decode_splits(num_seqs, programs_per_seq, max_ctx, device, num_splits=None,
                       programs_per_sm=4, min_partition=_MIN_PARTITION):
    """Context partitions per sequence, from shapes only (CUDA-graph safe): enough programs for
    `programs_per_sm` per SM (8 programs on the interpreter), at most one per `min_partition`
    tokens of `max_ctx` (the most a block-table row can address) and `_MAX_SPLITS`.
    `num_splits` forces a count. Each sequence's partition length is then derived in the kernel
    from its own length (`_split_part`), so the work is even whatever the table width."""
    if num_splits is None:
        target = 8 if device.type != "cuda" else programs_per_sm * _sm_count(device)
        num_splits = min(triton.cdiv(target, max(num_seqs * programs_per_seq, 1)),
                         triton.cdiv(max(max_ctx, 1), min_partition), _MAX_SPLITS)
    return max(1, int(num_splits))


def _check(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens):
    if q.dim() != 3 or k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        raise ValueError(f"q must be [tokens, heads, head_dim] and caches [blocks, block_size, "
                         f"kv_heads, head_dim]; got {tuple(q.shape)}, {tuple(k_cache.shape)}, "
                         f"{tuple(v_cache.shape)}")
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    if k_cache.shape[3] != head_dim or num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads of dim {head_dim} do not fit "
                         f"{num_kv_heads} KV heads of dim {k_cache.shape[3]}")
    if head_dim > _MAX_HEAD_DIM:
        raise ValueError(f"head_dim {head_dim} > {_MAX_HEAD_DIM} is not supported")
    if q.dtype not in _TL_DTYPES:
        raise ValueError(f"unsupported dtype {q.dtype}; expected float32, float16 or bfloat16")
    num_seqs = seq_lens.shape[0]
    if query_start_loc.shape != (num_seqs + 1,) or block_tables.dim() != 2 \
            or block_tables.shape[0] < num_seqs:
        raise ValueError(f"need query_start_loc [{num_seqs + 1}] and block_tables [>= {num_seqs},"
                         f" max_blocks]; got {tuple(query_start_loc.shape)}, "
                         f"{tuple(block_tables.shape)}")


def paged_attention_triton(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
                           max_query_len=None):
    _check(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if seq_lens.shape[0] == 0 or q.shape[0] == 0:
        return out
    if max_query_len is None:
        # Host sync, acceptable only in this fallback: callers on the hot path pass it.
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max().item())
    if max_query_len <= 0:
        return out
    if max_query_len == 1:
        decode_attention(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale, out)
    else:
        prefill_attention(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
                          max_query_len, out)
    return out


def decode_attention(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale, out,
                     num_splits=None, config=None):
    """Decode kernel (every sequence has at most one query row) writing into `out`.
    `num_splits` forces the split count; `config` overrides keys of `decode_config`."""
    num_seqs = seq_lens.shape[0]
    num_heads, head_dim = q.shape[1], q.shape[2]
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    cfg = decode_config(q)
    if config:
        cfg.update(config)
    block_n = cfg["block_n"]
    block_d = max(16, triton.next_power_of_2(head_dim))
    block_g = max(16, triton.next_power_of_2(group))  # tl.dot needs >= 16 rows
    splits = plan_decode_splits(num_seqs, num_kv_heads, block_tables.shape[1] * page_size,
                                q.device, num_splits, cfg["programs_per_sm"], cfg["min_partition"])
    if splits > 1:
        n_out = num_seqs * num_heads * splits * head_dim
        scratch = torch.empty(n_out + num_seqs * num_heads * splits, dtype=torch.float32,
                              device=q.device)
        part_out = scratch[:n_out].view(num_seqs, num_heads, splits, head_dim)
        part_lse = scratch[n_out:].view(num_seqs, num_heads, splits)
        po_strides, pl_strides = part_out.stride()[:3], part_lse.stride()[:2]
    else:
        part_out = part_lse = out  # never touched when SPLIT is off
        po_strides, pl_strides = (0, 0, 0), (0, 0)
    lowp, dot_dtype = _dot_mode(q)
    _decode_kernel[(num_seqs, num_kv_heads, splits)](
        q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, out, part_out, part_lse,
        scale * _LOG2E, *q.stride(), *k_cache.stride(), *v_cache.stride(),
        block_tables.stride(0), *out.stride(), *po_strides, *pl_strides,
        GROUP=group, HEAD_DIM=head_dim, PAGE=page_size, BLOCK_G=block_g, BLOCK_D=block_d,
        BLOCK_N=block_n, SPLIT=splits > 1, LOWP=lowp, DOT_DTYPE=dot_dtype,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    if splits > 1:
        block_s = triton.next_power_of_2(splits)
        _reduce_kernel[(num_seqs, num_heads)](
            part_out, part_lse, query_start_loc, seq_lens, out, splits, *po_strides, *pl_strides,
            *out.stride(), HEAD_DIM=head_dim, BLOCK_S=block_s, CHUNK=min(block_s, 16),
            BLOCK_D=block_d, BLOCK_N=block_n, num_warps=cfg["reduce_warps"])
    return out


def prefill_attention(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
                      max_query_len, out):
    """Varlen causal kernel over paged KV (prefill, chunked prefill, mixed batches)."""
    num_seqs = seq_lens.shape[0]
    num_heads, head_dim = q.shape[1], q.shape[2]
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    block_d = max(16, triton.next_power_of_2(head_dim))
    block_m, block_n, num_warps, num_stages = _tiles(q, block_d)
    lowp, dot_dtype = _dot_mode(q)
    grid = (num_seqs, num_heads, triton.cdiv(max_query_len, block_m))
    _prefill_kernel[grid](
        q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, out, scale * _LOG2E,
        page_size, *q.stride(), *k_cache.stride(), *v_cache.stride(), block_tables.stride(0),
        *out.stride(), GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim, BLOCK_M=block_m,
        BLOCK_N=block_n, BLOCK_D=block_d, LOWP=lowp, DOT_DTYPE=dot_dtype, num_warps=num_warps,
        num_stages=num_stages)
    return out
