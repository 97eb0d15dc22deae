"""Triton decode attention with the attention input prep folded in: one launch instead of two.

Owns: `decode_prep_attention_triton`, the GPU twin of `prep_attention_ref` for decode steps
(every sequence has at most one query row, the last position of its context; contract in
`kernels/decode_prep.py`). It reads the raw qkv projection output, not a prepared q.

`_decode_prep_kernel`: grid (num_seqs, num_kv_heads, num_splits), as `_decode_kernel`
(attention_decode_triton), whose tile loop (`_decode_span`), output store (`_decode_store`),
split plan and reduce it shares. Each program normalises and rotates the query heads of its KV
head itself (`_normed_rotated`, the prep kernel's own helper, so q rounds exactly as `qkv_prep`
stores it). The new token is never read back from the cache: the program whose partition holds
position ctx-1 folds it from registers (k normalised and rotated, v as projected, both rounded
to the cache dtype as a cache read would return them) after the cached positions [lo, ctx-1),
and it alone writes them into the cache at the token's slot (slot -1, a padding row: nothing
written). No other program reads that position, so there is no write-then-read hazard.

Float caches only: an int8 cache keeps `qkv_prep` + `decode_attention` (kernels/decode_prep.py
decides). Must never allocate data-dependent memory or sync with the host: it runs inside CUDA
graphs. Compiled without FMA contraction, like `qkv_prep_triton`, so q and k round as the
unfused ops do. To extend (int8 KV): quantize k/v with `_quantize_store` where they are written
and fold the dequantized values in, then widen `fusable` in kernels/decode_prep.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .attention_common_triton import _LOG2E, _dot_mode
from .attention_decode_triton import (_decode_span, _decode_store, _reg_cap, decode_config,
                                      launch_reduce, plan_decode_splits, split_buffers)
from .pdl import pdl_enabled, pdl_launch, pdl_release, pdl_wait
from .qkv_prep_triton import _normed_rotated


@triton.jit(do_not_specialize=["s_bt", "spo_s", "spo_h", "spl_s", "spl_h"])
def _decode_prep_kernel(qkv_ptr, pos_ptr, cos_ptr, sin_ptr, slot_ptr, qw_ptr, kw_ptr, eps,
                        k_ptr, v_ptr, bt_ptr, qsl_ptr, lens_ptr, out_ptr, po_ptr, plse_ptr,
                        scale_log2, s_tok, s_cos, s_sin, sk_b, sk_s, sk_h, sk_d,
                        sv_b, sv_s, sv_h, sv_d, s_bt, so_t, so_h, so_d, spo_s, spo_h, spo_p,
                        spl_s, spl_h,
                        NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr,
                        HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, BLOCK_G: tl.constexpr,
                        BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
                        LOWP: tl.constexpr, DOT_DTYPE: tl.constexpr, HAS_NORM: tl.constexpr,
                        PDL: tl.constexpr = False):
    """One program: the query heads of one KV head of one sequence, over one partition of its
    context; PDL: launched early, waits for the qkv projection (kernels/pdl.py)."""
    pdl_release(PDL)
    pdl_wait(PDL)
    EVEN_D: tl.constexpr = HEAD_DIM == BLOCK_D
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    row = tl.load(qsl_ptr + seq)
    has_query = (tl.load(qsl_ptr + seq + 1) - row) > 0
    ctx = tl.where(has_query, tl.load(lens_ptr + seq), 0)
    if SPLIT:
        part = tl.maximum(tl.cdiv(tl.cdiv(ctx, tl.num_programs(2)), BLOCK_N), 1) * BLOCK_N
        lo = split * part
        hi = tl.maximum(tl.minimum(lo + part, ctx), lo)
    else:
        lo = 0
        hi = ctx
    # The partition holding the new token (position ctx-1) folds it from registers.
    holds_new = has_query & (lo < hi) & (hi == ctx)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    first = offs_d < HEAD_DIM // 2
    partner = tl.where(first, offs_d + HEAD_DIM // 2, offs_d - HEAD_DIM // 2)
    tok = row.to(tl.int64)
    act = qkv_ptr.dtype.element_ty
    pos = tl.load(pos_ptr + tok, mask=has_query, other=0).to(tl.int64)
    cs_idx = tl.where(first, offs_d, offs_d - HEAD_DIM // 2)
    cs_mask = d_mask & has_query
    cos = tl.load(cos_ptr + pos * s_cos + cs_idx, mask=cs_mask, other=0.0).to(act).to(tl.float32)
    sin = tl.load(sin_ptr + pos * s_sin + cs_idx, mask=cs_mask, other=0.0).to(act).to(tl.float32)
    qkv_row = qkv_ptr + tok * s_tok
    heads = kvh * GROUP + offs_g
    q = _normed_rotated(qkv_row, heads, offs_d, partner, first, g_mask[:, None] & cs_mask[None, :],
                        cos, sin, qw_ptr, HEAD_DIM, eps, HAS_NORM).to(act)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    bt_row = bt_ptr + seq.to(tl.int64) * s_bt
    k_head = k_ptr + kvh * sk_h
    v_head = v_ptr + kvh * sv_h
    acc, m_i, l_i = _decode_span(acc, m_i, l_i, q, scale_log2, scale_log2, k_head, v_head, k_head,
                                 v_head, bt_row, lo, tl.where(holds_new, ctx - 1, hi), offs_d,
                                 d_mask, sk_b, sk_s, sk_d, sv_b, sv_s, sv_d, 0, 0, 0, 0, EVEN_D,
                                 PAGE, BLOCK_N, LOWP, DOT_DTYPE, False, 0, 0, False)
    if holds_new:
        kv_heads = kvh + tl.arange(0, 1)
        kv_mask = d_mask[None, :] & (kv_heads < NUM_KV_HEADS)[:, None]
        k_new = _normed_rotated(qkv_row + NUM_HEADS * HEAD_DIM, kv_heads, offs_d, partner, first,
                                kv_mask, cos, sin, kw_ptr, HEAD_DIM, eps, HAS_NORM)
        v_new = tl.load(qkv_row + (NUM_HEADS + NUM_KV_HEADS) * HEAD_DIM
                        + kv_heads[:, None] * HEAD_DIM + offs_d[None, :], mask=kv_mask, other=0.0)
        k_new = k_new.to(k_ptr.dtype.element_ty)
        v_new = v_new.to(v_ptr.dtype.element_ty)
        slot = tl.load(slot_ptr + tok).to(tl.int64)
        blk = slot // PAGE
        off = slot % PAGE
        tl.store(k_head + blk * sk_b + off * sk_s + offs_d[None, :] * sk_d, k_new,
                 mask=kv_mask & (slot >= 0))
        tl.store(v_head + blk * sv_b + off * sv_s + offs_d[None, :] * sv_d, v_new,
                 mask=kv_mask & (slot >= 0))
        # One more position of the online softmax, as `_decode_tile` folds a tile.
        s = tl.sum(q.to(tl.float32) * k_new.to(tl.float32), axis=1) * scale_log2
        m_new = tl.maximum(m_i, s)
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new)
        l_i = l_i * alpha + p
        if LOWP:  # P@V takes p in the dot dtype
            p = p.to(DOT_DTYPE).to(tl.float32)
        acc = acc * alpha[:, None] + p[:, None] * v_new.to(tl.float32)
        m_i = m_new
    _decode_store(acc, l_i, m_i, seq, row, split, heads, offs_d, g_mask, d_mask, has_query,
                  lo < hi, out_ptr, po_ptr, plse_ptr, so_t, so_h, so_d, spo_s, spo_h, spo_p,
                  spl_s, spl_h, SPLIT)


def decode_prep_attention_triton(qkv, positions, cos_cache, sin_cache, slot_mapping, k_cache,
                                 v_cache, q_norm_weight, k_norm_weight, eps, block_tables,
                                 query_start_loc, seq_lens, scale, *, num_heads: int,
                                 num_kv_heads: int, head_dim: int, num_splits=None, config=None):
    """Decode attention of the raw `qkv` rows (inputs checked by the caller,
    `kernels/decode_prep.py`); returns `[num_tokens, num_heads, head_dim]`. `num_splits` and
    `config` as in `decode_attention`."""
    n = qkv.shape[0]
    out = torch.empty(n, num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    num_seqs = seq_lens.shape[0]
    if n == 0 or num_seqs == 0:
        return out
    cfg = decode_config(out, k_cache.dtype)
    if config:
        cfg.update(config)
    page_size = k_cache.shape[1]
    group = num_heads // num_kv_heads
    splits = plan_decode_splits(num_seqs, num_kv_heads, block_tables.shape[1] * page_size,
                                qkv.device, num_splits, cfg["programs_per_sm"], cfg["min_partition"],
                                cfg.get("small_per_sm"), cfg.get("small_programs", 0))
    part_out, part_lse, po_strides, pl_strides = split_buffers(out, num_seqs, splits)
    lowp, dot_dtype = _dot_mode(out, k_cache.dtype)
    has_norm = q_norm_weight is not None
    weights = (q_norm_weight, k_norm_weight) if has_norm else (qkv, qkv)  # never read without norms
    pdl = pdl_enabled(qkv)
    _decode_prep_kernel[(num_seqs, num_kv_heads, splits)](
        qkv, positions, cos_cache, sin_cache, slot_mapping, *weights, eps, k_cache, v_cache,
        block_tables, query_start_loc, seq_lens, out, part_out, part_lse, scale * _LOG2E,
        qkv.stride(0), cos_cache.stride(0), sin_cache.stride(0), *k_cache.stride(),
        *v_cache.stride(), block_tables.stride(0), *out.stride(), *po_strides, *pl_strides,
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, GROUP=group, HEAD_DIM=head_dim,
        PAGE=page_size, BLOCK_G=max(16, triton.next_power_of_2(group)),
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)), BLOCK_N=cfg["block_n"],
        SPLIT=splits > 1, LOWP=lowp, DOT_DTYPE=dot_dtype, HAS_NORM=has_norm, PDL=pdl,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], enable_fp_fusion=False,
        **pdl_launch(pdl), **_reg_cap(cfg))
    if splits > 1:
        launch_reduce(part_out, part_lse, query_start_loc, seq_lens, out, splits, cfg["block_n"],
                      cfg, pdl)
    return out
