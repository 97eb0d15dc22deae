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
`row_span` (optional int32 `[num_seqs]`) marks runs of consecutive single-query sequences that
share a block table (one request's positions in a verify step): a hint that changes no result,
so the decode kernel may read each K/V tile once per run chunk (kernels/attention_decode_triton.py
`decode_attention` gives the encoding). The reference ignores it.
The reference computes in float32; the Triton kernels live beside it.

int8 caches come with `k_scale`/`v_scale` float32 `[num_blocks, num_kv_heads, block_size]`
(see `kernels/kv_append.py`): a cached row is `code * scale`. The reference dequantizes the
gathered blocks; the kernels dequantize inside, on read.
"""

from __future__ import annotations

import torch

from .dispatch import use_triton
from .kv_append import check_int8_scales

# The most K values (rows x padded context x kv heads x head dim) the reference gathers at once
# for a batch of single-query rows.
BATCHED_DECODE_MAX = 1 << 20


def _gather(cache, scales, blocks):
    """float32 `[..., n * page, num_kv_heads, head_dim]` of the cached rows of `blocks`
    (`[..., n]` block ids), dequantized where `scales` are given."""
    rows = cache[blocks].float()                                    # [..., n, page, H, D]
    if scales is not None:
        rows = rows * scales[blocks].transpose(-1, -2)[..., None]   # [..., n, page, H, 1]
    return rows.flatten(-4, -3)


def _attend(q, k, v, visible, scale):
    """Softmax attention of `q` `[..., kv_heads, group, q_len, D]` over `k`/`v` `[..., ctx,
    kv_heads, D]`, where `visible` `[..., q_len, ctx]` says which keys a query sees. Each KV
    head serves its `group` query heads as one matrix of rows, with no copy of K/V (GQA)."""
    *lead, heads, group, q_len, dim = q.shape
    scores = torch.matmul(q.reshape(*lead, heads, group * q_len, dim), k.movedim(-3, -1))
    scores.mul_(scale)
    scores.view(*lead, heads, group, q_len, -1).masked_fill_(
        ~visible.unsqueeze(-3).unsqueeze(-3), float("-inf"))
    probs = torch.softmax(scores, dim=-1)                           # [..., H, group * q_len, ctx]
    return torch.matmul(probs, v.movedim(-2, -3)).view(*lead, heads, group, q_len, dim)


def paged_attention_ref(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
                        max_query_len=None, k_scale=None, v_scale=None):
    check_int8_scales(k_cache, k_scale, v_scale)
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    qsl = query_start_loc.tolist()
    lens = seq_lens.tolist()
    single = [i for i in range(len(lens)) if qsl[i + 1] - qsl[i] == 1]
    # One query row each (decode): all such sequences at once, padded to the longest, where that
    # padded K is small (many short rows: one set of launches instead of one per row); else
    # one by one below (a long padded gather costs more than it saves).
    longest = max((lens[i] for i in single), default=0)
    if len(single) * longest * k_cache[0, 0].numel() > BATCHED_DECODE_MAX:
        single = []
    if single:
        rows = torch.tensor([qsl[i] for i in single], device=q.device)
        ctx = torch.tensor([lens[i] for i in single], device=q.device)
        num_blocks = (longest + block_size - 1) // block_size
        blocks = block_tables[torch.tensor(single, device=q.device), :num_blocks].long()
        blocks = blocks.clamp(0, k_cache.shape[0] - 1)  # padding may hold any value
        k = _gather(k_cache, k_scale, blocks)                       # [S, L, H, D]
        v = _gather(v_cache, v_scale, blocks)
        visible = torch.arange(k.shape[1], device=q.device)[None, :] < ctx[:, None]  # [S, L]
        v = v.masked_fill(~visible[..., None, None], 0.0)  # rows past a context add nothing
        qs = q[rows].float().view(len(single), num_kv_heads, group, 1, head_dim)
        o = _attend(qs, k, v, visible[:, None, :], scale)           # [S, H, group, 1, D]
        out[rows] = o.reshape(len(single), num_heads, head_dim).to(q.dtype)
    for i, ctx_len in enumerate(lens):
        start, end = qsl[i], qsl[i + 1]
        q_len = end - start
        if q_len == 0 or (q_len == 1 and single):
            continue
        num_blocks = (ctx_len + block_size - 1) // block_size
        blocks = block_tables[i, :num_blocks].long()
        k = _gather(k_cache, k_scale, blocks)[:ctx_len]             # [ctx, H, D]
        v = _gather(v_cache, v_scale, blocks)[:ctx_len]
        qi = q[start:end].float().view(q_len, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
        q_pos = torch.arange(ctx_len - q_len, ctx_len, device=q.device)
        visible = torch.arange(ctx_len, device=q.device)[None, :] <= q_pos[:, None]  # causal
        o = _attend(qi, k, v, visible, scale)                       # [H, group, q_len, D]
        out[start:end] = o.permute(2, 0, 1, 3).reshape(q_len, num_heads, head_dim).to(q.dtype)
    return out


def decode_order(seq_lens: torch.Tensor) -> torch.Tensor:
    """The sequences longest context first (int32 `[num_seqs]`), for the decode kernel's launch
    order (`paged_attention(order=...)`): the long contexts start in the first wave and the short
    ones fill in behind, instead of a long one starting last. One sort a step, shared by every
    layer; it changes which program runs when, never what a program computes. Ties keep their
    index order. On a GPU one Triton launch (kernels/order_triton.py) instead of torch's sort."""
    if use_triton(seq_lens):
        from .order_triton import order_desc_triton
        return order_desc_triton(seq_lens)
    return torch.sort(seq_lens, descending=True, stable=True).indices.to(torch.int32)


def paged_attention(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
                    max_query_len=None, k_scale=None, v_scale=None, row_span=None, order=None):
    """Dispatch: Triton on CUDA, the reference elsewhere. `max_query_len` (host int) lets the
    Triton path pick the decode kernel when every sequence has one query token. `k_scale`/
    `v_scale` only with int8 caches. `order` (`decode_order`, optional): the decode kernel's
    launch order of the sequences."""
    if use_triton(q):
        from .attention_triton import paged_attention_triton
        return paged_attention_triton(q, k_cache, v_cache, block_tables, query_start_loc,
                                      seq_lens, scale, max_query_len, k_scale, v_scale, row_span,
                                      order)
    return paged_attention_ref(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
                               k_scale=k_scale, v_scale=v_scale)
