"""The decode kernels' building blocks: how one K/V tile is found, loaded and folded into a
query group's running softmax state (kernels/attention_decode_triton.py's `_decode_kernel` and
`_reduce_kernel` are built from them).

Owns: `_decode_tile` (a tile of a float or int8 cache into the state: table lookup, operand
conversion, scale folding, masks, the rows of a run masked each to its own context), the
preload pair `_load_first_tile` / `_fold_tile` (the first float tile loaded before the PDL wait),
the online-softmax step (`_softmax_step`, and `_softmax_step_rows` where a row may see nothing of
a tile), `_split_part` (a partition's length from a sequence's own length) and `_run_chunk`
(a row's place in its run chunk, from `row_span`).

Must never read KV positions at or past a row's context, or read the block table for a masked
lane. To extend (sliding window, fp8 KV): change `_decode_tile`, and keep prefill's
`_attend_tile` and the reference in step.
"""

import triton
import triton.language as tl

from .attention_common_triton import _dot
from .attention_int8_triton import _kv_operand, _load_scales, _mma_scores


@triton.jit
def _split_part(ctx, num_splits, BLOCK_N: tl.constexpr):
    """Tokens per partition when a `ctx`-token context is cut `num_splits` ways: whole tiles, at
    least one. Computed in the kernels from the sequence's own length, so each sequence is split
    evenly whatever the block-table width, while the grid depends on shapes only."""
    return tl.maximum(tl.cdiv(tl.cdiv(ctx, num_splits), BLOCK_N), 1) * BLOCK_N


@triton.jit
def _softmax_step(s, m_i, l_i):
    """One tile's scores [G, BLOCK_N] (log2 domain) into the running max and sum: returns the
    tile's probabilities, the rescale of the state so far, and the new max and sum. Every tile
    holds at least one visible position, so the new max is finite."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    return p, alpha, m_new, l_i * alpha + tl.sum(p, axis=1)


@triton.jit
def _softmax_step_rows(s, m_i, l_i):
    """`_softmax_step` where a row may see no position of the tile (run rows: each row's own
    context ends at its own position): such a row keeps its state and adds nothing."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    return p, alpha, m_new, l_i * alpha + tl.sum(p, axis=1)


@triton.jit
def _run_chunk(span_ptr, seq, ROWS: tl.constexpr):
    """Row `seq`'s place in its run (`row_span`, see `decode_attention`): (its offset in its
    chunk, the chunk's first row, the chunk's row count). A run of n rows is cut into
    ceil(n / ROWS) chunks of even size, each one program's query rows."""
    span = tl.load(span_ptr + seq)
    c = tl.maximum(-span, 0)  # rows before `seq` in its run
    run_len = tl.maximum(tl.where(span > 0, span, tl.load(span_ptr + seq - c)), 1)
    size = tl.cdiv(run_len, tl.cdiv(run_len, ROWS))
    at = c % size
    return at, seq - at, tl.minimum(size, run_len - c + at)


@triton.jit
def _tile_rows(bt_row, start, n_mask, PAGE: tl.constexpr, BLOCK_N: tl.constexpr):
    """Each token of tile [start, start+BLOCK_N): its cache block and row within the block; masked
    tokens never read the table and get block 0."""
    offs_n = start + tl.arange(0, BLOCK_N)
    blk = tl.load(bt_row + offs_n // PAGE, mask=n_mask, other=0).to(tl.int64)
    return blk, offs_n % PAGE


@triton.jit
def _load_first_tile(k_head, v_head, bt_row, lo, hi, offs_d, d_mask, sk_b, sk_s, sk_d, sv_b, sv_s,
                     sv_d, PAGE: tl.constexpr, BLOCK_N: tl.constexpr):
    """PRELOAD: K and V of tokens [lo, min(lo+BLOCK_N, hi)) of a float cache (zeros past hi),
    with each token's (block, row) for the reload of the appended row and its mask."""
    n_mask = (lo + tl.arange(0, BLOCK_N)) < hi
    blk, pos = _tile_rows(bt_row, lo, n_mask, PAGE, BLOCK_N)
    mask = n_mask[:, None] & d_mask[None, :]
    k = tl.load(k_head + (blk * sk_b + pos * sk_s)[:, None] + offs_d[None, :] * sk_d, mask=mask, other=0.0)
    v = tl.load(v_head + (blk * sv_b + pos * sv_s)[:, None] + offs_d[None, :] * sv_d, mask=mask, other=0.0)
    return k, v, blk, pos, n_mask


@triton.jit
def _fold_tile(acc, m_i, l_i, q, k, v, n_mask, scale_log2, LOWP: tl.constexpr,
               DOT_DTYPE: tl.constexpr):
    """A loaded float K/V tile (tokens past `n_mask` hidden) into the running softmax state."""
    s = _dot(q, tl.trans(k), LOWP, DOT_DTYPE) * scale_log2
    s = tl.where(n_mask[None, :], s, float("-inf"))
    p, alpha, m_new, l_i = _softmax_step(s, m_i, l_i)
    return acc * alpha[:, None] + _dot(p, v, LOWP, DOT_DTYPE), m_new, l_i


@triton.jit
def _decode_tile(acc, m_i, l_i, q, scale_log2, q_scl, k_head, v_head, ks_head, vs_head, bt_row, start,
                 hi, offs_d, d_mask, sk_b, sk_s, sk_d, sv_b, sv_s, sv_d, sks_b, sks_s, svs_b, svs_s,
                 MASKED: tl.constexpr, EVEN_D: tl.constexpr, PAGE: tl.constexpr,
                 BLOCK_N: tl.constexpr, LOWP: tl.constexpr, DOT_DTYPE: tl.constexpr,
                 KV_INT8: tl.constexpr, OP_K: tl.constexpr, OP_V: tl.constexpr,
                 ASM: tl.constexpr, row_hi=0, ROW_MASK: tl.constexpr = False):
    """Fold KV positions [start, start+BLOCK_N) (MASKED: clipped to `hi`) into the running softmax
    state of the group's query rows. K/V tiles are [BLOCK_N, BLOCK_D]; int8 codes become fp16
    operands as OP_K / OP_V say (`_kv_operand`). ROW_MASK (with MASKED): query row r sees the
    positions below `row_hi[r]` only (the rows of a run)."""
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
    n_mask = (start + offs_t) < hi
    if MASKED:
        kv_mask = n_mask[:, None] & d_mask[None, :]
    else:
        kv_mask = d_mask[None, :]
    k = _kv_operand(k_head + blk * sk_b + pos * sk_s, offs_d, n_mask, kv_mask, sk_d, MASKED,
                    EVEN_D, LOWP, KV_INT8, OP_K, ASM)
    if KV_INT8 and OP_K == 5:  # OP_MMA: int8 q codes @ int8 K codes, q_scl per row
        k_scale = _load_scales(ks_head + blk * sks_b + pos * sks_s, n_mask, MASKED)
        s = _mma_scores(q, k, q_scl, k_scale)
    else:
        s = _dot(q, tl.trans(k), LOWP, DOT_DTYPE)
        if KV_INT8:
            k_scale = _load_scales(ks_head + blk * sks_b + pos * sks_s, n_mask, MASKED)
            s = s * (k_scale * scale_log2)[None, :]
        else:
            s = s * scale_log2
    if MASKED and ROW_MASK:
        s = tl.where((start + offs_t)[None, :] < row_hi[:, None], s, float("-inf"))
        p, alpha, m_new, l_i = _softmax_step_rows(s, m_i, l_i)
    else:
        if MASKED:
            s = tl.where(n_mask[None, :], s, float("-inf"))
        p, alpha, m_new, l_i = _softmax_step(s, m_i, l_i)
    v = _kv_operand(v_head + blk * sv_b + pos * sv_s, offs_d, n_mask, kv_mask, sv_d, MASKED,
                    EVEN_D, LOWP, KV_INT8, OP_V, ASM)
    if KV_INT8:
        p = p * _load_scales(vs_head + blk * svs_b + pos * svs_s, n_mask, MASKED)[None, :]
    acc = acc * alpha[:, None] + _dot(p, v, LOWP, DOT_DTYPE)
    return acc, m_new, l_i
