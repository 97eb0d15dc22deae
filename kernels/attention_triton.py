"""Triton paged attention: the public entry `paged_attention_triton`, input checks, kernel choice.

Owns: `paged_attention_triton`, the GPU twin of `paged_attention_ref` (same contract: query rows of
sequence i are the last q_len_i positions of its seq_lens[i]-token context, read through its
block table; GQA by head groups). Must never read KV positions >= seq_lens[i] (block tables may be
padded with junk ids) and never sync with the host when `max_query_len` is given, so the decode
path can be captured in a CUDA graph.

Modules:
- here: `_check` (shapes, dtypes, head_dim <= 256) and the choice of kernel: decode for steps
  of one query row a sequence; prefill for the rest, where a mixed step's one-row sequences go
  to the decode kernel (`MIXED_DECODE`).
- `attention_decode_triton`: max_query_len == 1. Split-K decode kernel, its reduce, the split
  planning and launch config (`decode_attention`, `plan_decode_splits`, `decode_config`,
  `DECODE_TUNED`, `DECODE_INT8`; `CVT_MODES` from `attention_int8_triton`).
- `attention_decode_plan`: the decode kernel's launch config and split count, from shapes only.
- `attention_prefill_plan`: the prefill kernel's tiles and grid, from shapes only.
- `attention_prefill_triton`: everything else (prefill, chunked prefill, mixed batches).
  Varlen causal kernel (`prefill_attention`).
- `attention_common_triton`: what both use (`_dot`, the dtype policy, numerics notes).
- `attention_int8_triton`: int8 codes to fp16 operands for both (`CVT_MODES`, word loads).
The public names of the decode and prefill modules are re-exported here: tests, benchmarks and
`kernels.attention` import them from `kernels.attention_triton`.

Head dims: any even size up to 256; tiles are padded to a power of two >= 16 and masked.
KV caches in q's dtype, or int8 with float32 scales (`k_scale`/`v_scale` `[num_blocks,
num_kv_heads, block_size]`): both kernels then take the `KV_INT8` constexpr branch, which loads
codes, converts them to float32 and applies the per-token scales to the score columns (K) and
the probability columns (V), so no dequantized copy of the cache exists and the float paths
compile without it.
To extend (e.g. sliding window, fp8 KV), change `_attend_tile` (prefill) and `_decode_tile`
(decode), the places a K/V tile is loaded and folded in, and the loop bounds; keep the
reference in step. A new kernel path gets its own module and a branch in
`paged_attention_triton`.
"""

from __future__ import annotations

import torch

from .attention_common_triton import _TL_DTYPES
from .attention_decode_triton import (DECODE_INT8, DECODE_TUNED, decode_attention,
                                      decode_config, plan_decode_splits)
from .attention_int8_triton import CVT_MODES, OP_MMA, cvt_ops
from .attention_prefill_triton import prefill_attention, prefill_int8_cvt
from .dispatch import env_switch
from .kv_append import check_int8_scales

__all__ = ["paged_attention_triton", "decode_attention", "prefill_attention", "decode_config",
           "plan_decode_splits", "DECODE_TUNED", "DECODE_INT8", "CVT_MODES", "int8_quantizes_q"]

_MAX_HEAD_DIM = 256

# Steps of several sequences with more than one query row somewhere (mixed prefill + decode)
# run their one-row sequences through the decode kernel, the rest through the prefill kernel
# (`paged_attention_triton`). `INFER_CLUSTER_MIXED_DECODE=0` keeps every row in the prefill
# kernel (read once at import, for A/B).
MIXED_DECODE = env_switch("INFER_CLUSTER_MIXED_DECODE")


def _check(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, k_scale=None,
           v_scale=None):
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
    if (k_cache.dtype not in _TL_DTYPES and k_cache.dtype != torch.int8) \
            or v_cache.dtype != k_cache.dtype:
        raise ValueError(f"KV caches must both be float32, float16, bfloat16 or int8, got "
                         f"{k_cache.dtype} and {v_cache.dtype}")
    check_int8_scales(k_cache, k_scale, v_scale)
    num_seqs = seq_lens.shape[0]
    if query_start_loc.shape != (num_seqs + 1,) or block_tables.dim() != 2 \
            or block_tables.shape[0] < num_seqs:
        raise ValueError(f"need query_start_loc [{num_seqs + 1}] and block_tables [>= {num_seqs},"
                         f" max_blocks]; got {tuple(query_start_loc.shape)}, "
                         f"{tuple(block_tables.shape)}")


def paged_attention_triton(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
                           max_query_len=None, k_scale=None, v_scale=None, row_span=None,
                           order=None):
    _check(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, k_scale, v_scale)
    for name, t in (("row_span", row_span), ("order", order)):
        if t is not None and (t.shape != seq_lens.shape or t.dtype != torch.int32):
            raise ValueError(f"{name} must be int32 [{seq_lens.shape[0]}], got {t.dtype} "
                             f"{tuple(t.shape)}")
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if seq_lens.shape[0] == 0 or q.shape[0] == 0:
        return out
    if max_query_len is None:
        # Host sync, acceptable only in this fallback: callers on the hot path pass it.
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max().item())
    if max_query_len <= 0:
        return out
    if max_query_len == 1:
        decode_attention(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale, out,
                         k_scale=k_scale, v_scale=v_scale, row_span=row_span, order=order)
        return out
    # A mixed step (decode rows beside prompts): the prefill kernel leaves one-row sequences to
    # the decode kernel, launched after it (its merge of split KV writes every row).
    mixed = MIXED_DECODE and seq_lens.shape[0] > 1
    prefill_attention(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
                      max_query_len, out, k_scale=k_scale, v_scale=v_scale, skip_single=mixed)
    if mixed:
        decode_attention(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale, out,
                         k_scale=k_scale, v_scale=v_scale, order=order)
    return out


def int8_quantizes_q(q, k_cache, max_query_len: int) -> bool:
    """Whether `paged_attention_triton` on an int8 cache runs q @ K^T on int8 q codes (the
    "mma_k" method: q rounded to int8 per row) for this q and query length, or keeps q exact."""
    cvt = decode_config(q, torch.int8)["cvt"] if max_query_len == 1 else prefill_int8_cvt(q)
    return cvt_ops(cvt, k_cache, k_cache)[0] == OP_MMA
