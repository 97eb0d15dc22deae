"""Attention of a step from its qkv projection: the input prep and the paged attention in one call.

Owns: `prep_attention(qkv, positions, cos_cache, sin_cache, slot_mapping, k_cache, v_cache,
block_tables, query_start_loc, seq_lens, scale, max_query_len, ...)`, which returns the
attention output `[num_tokens, num_heads, head_dim]` and fills the KV cache exactly as
`paged_attention(qkv_prep(...), ...)` does (contracts in `kernels/qkv_prep.py` and
`kernels/attention.py`), its reference `prep_attention_ref` (that composition on the references)
and `decode_prep_enabled` (the `INFER_CLUSTER_DECODE_PREP` A/B switch, on unless 0).

Dispatch: a decode step (`max_query_len == 1`) on the Triton path with a float KV cache runs one
launch, `decode_prep_triton` (q/k norm, rotary and the KV append inside the decode attention
kernel: batch-1 decode pays one kernel less per layer). Every other step, and any call with
`fuse=False`, runs `qkv_prep` then `paged_attention`. `qkv` may be modified either way; callers
must not reuse it. To extend (int8 KV in the fused kernel): see `decode_prep_triton.py`, then
widen `fusable`.
"""

from __future__ import annotations

import torch

from .attention import paged_attention, paged_attention_ref
from .dispatch import env_switch, use_triton
from .qkv_prep import qkv_prep, qkv_prep_ref, split_qkv


def decode_prep_enabled() -> bool:
    """`INFER_CLUSTER_DECODE_PREP`: 0 / off keeps the two launches (A/B runs); read once per layer."""
    return env_switch("INFER_CLUSTER_DECODE_PREP")


def fusable(qkv: torch.Tensor, k_cache: torch.Tensor, max_query_len) -> bool:
    """Whether `prep_attention` runs the one-launch kernel for these inputs."""
    return max_query_len == 1 and k_cache.dtype != torch.int8 and use_triton(qkv)


def prep_attention_ref(qkv, positions, cos_cache, sin_cache, slot_mapping, k_cache, v_cache,
                       block_tables, query_start_loc, seq_lens, scale, max_query_len=None,
                       q_norm_weight=None, k_norm_weight=None, eps=1e-6, k_scale=None,
                       v_scale=None, *, num_heads: int, num_kv_heads: int, head_dim: int):
    q = qkv_prep_ref(qkv, positions, cos_cache, sin_cache, slot_mapping, k_cache, v_cache,
                     q_norm_weight, k_norm_weight, eps, k_scale, v_scale, num_heads=num_heads,
                     num_kv_heads=num_kv_heads, head_dim=head_dim)
    return paged_attention_ref(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
                               max_query_len, k_scale, v_scale)


def prep_attention(qkv, positions, cos_cache, sin_cache, slot_mapping, k_cache, v_cache,
                   block_tables, query_start_loc, seq_lens, scale, max_query_len=None,
                   q_norm_weight=None, k_norm_weight=None, eps=1e-6, k_scale=None, v_scale=None,
                   *, num_heads: int, num_kv_heads: int, head_dim: int, fuse: bool = True):
    """See the module docstring. `max_query_len` (host int) lets decode steps take one launch."""
    shape = dict(num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim)
    if fuse and fusable(qkv, k_cache, max_query_len):
        from .attention_triton import _check as check_attention
        from .decode_prep_triton import decode_prep_attention_triton
        from .qkv_prep_triton import _check as check_prep
        q = split_qkv(qkv, num_heads, num_kv_heads, head_dim)[0]
        check_prep(qkv, positions, cos_cache, sin_cache, slot_mapping, k_cache, v_cache,
                   q_norm_weight, k_norm_weight, num_kv_heads, head_dim)
        check_attention(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, None, None)
        unit = lambda t: t if t is None or t.stride(-1) == 1 else t.contiguous()  # noqa: E731
        return decode_prep_attention_triton(
            qkv if qkv.stride(1) == 1 else qkv.contiguous(), positions, unit(cos_cache),
            unit(sin_cache), slot_mapping, k_cache, v_cache, unit(q_norm_weight),
            unit(k_norm_weight), eps, block_tables, query_start_loc, seq_lens, scale, **shape)
    q = qkv_prep(qkv, positions, cos_cache, sin_cache, slot_mapping, k_cache, v_cache,
                 q_norm_weight, k_norm_weight, eps, k_scale, v_scale, **shape)
    return paged_attention(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
                           max_query_len, k_scale, v_scale)
