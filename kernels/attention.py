"""Paged attention over the KV cache, for prefill, chunked prefill and decode (varlen, causal).

Contract: sequence i owns query rows `q[query_start_loc[i]:query_start_loc[i+1]]`; they are the
*last* `q_len_i` positions of a context of `seq_lens[i]` tokens whose K/V are already in the
cache (append before attending), reachable through `block_tables[i]` (block ids, padded with
any value past the used length). Query row j of sequence i sits at position
`seq_lens[i] - q_len_i + j` and attends causally to positions `<= ` its own. GQA: query head h
reads KV head `h // (num_heads // num_kv_heads)`.

Shapes: q `[num_tokens, num_heads, head_dim]`; caches `[num_blocks, block_size, num_kv_heads,
head_dim]`; block_tables `[num_seqs, max_blocks]` int32; query_start_loc `[num_seqs + 1]` int32;
seq_lens `[num_seqs]` int32. Returns `[num_tokens, num_heads, head_dim]` in q's dtype.
The reference computes in float32; the Triton kernels live beside it.

int8 caches come with `k_scale`/`v_scale` float32 `[num_blocks, num_kv_heads, block_size]`
(see `kernels/kv_append.py`): a cached row is `code * scale`. The reference dequantizes the
gathered blocks; the kernels dequantize inside, on read.
"""

from __future__ import annotations

import torch

from .dispatch import use_triton
from .kv_append import check_int8_scales


def _gather(cache, scales, blocks, ctx_len):
    """float32 `[ctx_len, num_kv_heads, head_dim]` of one sequence's cached rows."""
    rows = cache[blocks].float()                                   # [n, page, H, D]
    if scales is not None:
        rows = rows * scales[blocks].transpose(1, 2)[..., None]    # [n, page, H, 1]
    return rows.reshape(-1, *cache.shape[2:])[:ctx_len]


def paged_attention_ref(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
                        max_query_len=None, k_scale=None, v_scale=None):
    check_int8_scales(k_cache, k_scale, v_scale)
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    block_size = k_cache.shape[1]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    qsl = query_start_loc.tolist()
    lens = seq_lens.tolist()
    for i, ctx_len in enumerate(lens):
        start, end = qsl[i], qsl[i + 1]
        q_len = end - start
        if q_len == 0:
            continue
        num_blocks = (ctx_len + block_size - 1) // block_size
        blocks = block_tables[i, :num_blocks].long()
        k = _gather(k_cache, k_scale, blocks, ctx_len)
        v = _gather(v_cache, v_scale, blocks, ctx_len)
        if group > 1:
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
        qi = q[start:end].float().transpose(0, 1)            # [H, q_len, D]
        scores = torch.matmul(qi, k.permute(1, 2, 0)) * scale  # [H, q_len, ctx]
        q_pos = torch.arange(ctx_len - q_len, ctx_len, device=q.device)
        k_pos = torch.arange(ctx_len, device=q.device)
        mask = k_pos[None, :] > q_pos[:, None]
        scores.masked_fill_(mask[None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[start:end] = torch.matmul(probs, v.transpose(0, 1)).transpose(0, 1).to(q.dtype)
    return out


def paged_attention(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
                    max_query_len=None, k_scale=None, v_scale=None):
    """Dispatch: Triton on CUDA, the reference elsewhere. `max_query_len` (host int) lets the
    Triton path pick the decode kernel when every sequence has one query token. `k_scale`/
    `v_scale` only with int8 caches."""
    if use_triton(q):
        from .attention_triton import paged_attention_triton
        return paged_attention_triton(q, k_cache, v_cache, block_tables, query_start_loc,
                                      seq_lens, scale, max_query_len, k_scale, v_scale)
    return paged_attention_ref(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
                               k_scale=k_scale, v_scale=v_scale)
