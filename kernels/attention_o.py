"""Batch-1 decode attention and its o projection as float32 sums: dispatch, rule and reference.

Owns: `attention_o_small(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
max_query_len, o_weight, acc, zero, k_scale, v_scale)` (adds `o_proj(paged_attention(...))`
into the zeroed float32 `acc`, zeroes `zero`; the split merge and the o GEMV are one launch on
the Triton decode path, kernels/attention_o_triton.py), `use_fused_attention_o` (the layers'
rule) and `fused_attention_o_enabled()`, which reads the `INFER_CLUSTER_FUSED_ATTN_O=0` A/B
switch once, when the layers are built. Keeps no state: the accumulator pair lives in
`DecoderModel.forward`, like the fused MLP's (kernels/mlp.py).

The rule: only where it was measured, decode rows of one sequence, o projections no wider than
the Qwen3-0.6B shape's (2,048 -> 1,024), one rank, sm_90 on CUDA. Any step the merge kernel
cannot take (prefill rows, an unsplit decode) still honours the contract through the plain
attention and the GEMV. To extend: measure `bench/gpu_suite.sh fusedmlp` there, then widen
`_MAX_ROWS` / `_MAX_WEIGHT_ELEMS`.
"""

from __future__ import annotations

from typing import Optional

import torch

from .dispatch import env_switch, use_triton

_MAX_ROWS = 1
_MAX_WEIGHT_ELEMS = 2048 * 1024  # o projection of the Qwen3-0.6B shape
_BLOCK_C, _WARPS = 16, 4


def fused_attention_o_enabled() -> bool:
    """False when `INFER_CLUSTER_FUSED_ATTN_O=0` (A/B against the reduce kernel and the o GEMV)."""
    return env_switch("INFER_CLUSTER_FUSED_ATTN_O")


def use_fused_attention_o(enabled: bool, x: torch.Tensor, q_size: int, hidden: int) -> bool:
    """Whether a step whose layer input is `x` (`[rows, hidden]`) runs attention + o fused."""
    from .gemv import use_small_path
    if not (use_small_path(enabled, x) and x.shape[0] <= _MAX_ROWS and q_size * hidden <= _MAX_WEIGHT_ELEMS):
        return False
    return not x.is_cuda or torch.cuda.get_device_capability(x.device)[0] == 9


def attention_o_small(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
                      max_query_len: Optional[int], o_weight, acc: torch.Tensor,
                      zero: Optional[torch.Tensor] = None, k_scale=None, v_scale=None):
    """`acc += o_proj(paged_attention(q, ...))` as float32 (`q` `[rows, heads, head_dim]`,
    `acc` `[rows, hidden]`); zeroes `zero`. Returns `acc`."""
    if use_triton(q) and max_query_len == 1 and q.shape[0] <= _MAX_ROWS:
        from .attention_o_triton import attention_o_small_triton
        return attention_o_small_triton(q, k_cache, v_cache, block_tables, query_start_loc,
                                        seq_lens, scale, o_weight, acc, zero, k_scale, v_scale,
                                        block_c=_BLOCK_C, num_warps=_WARPS)
    from .attention import paged_attention
    from .gemv import linear_small
    out = paged_attention(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
                          max_query_len, k_scale, v_scale)
    acc.add_(linear_small(out.reshape(q.shape[0], -1), o_weight).float())
    if zero is not None:
        zero.zero_()
    return acc
