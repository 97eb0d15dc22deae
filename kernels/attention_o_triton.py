"""Triton batch-1 decode attention whose split merge and o projection run as one launch.

Owns: `attention_o_small_triton(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens,
scale, o_weight, acc, zero, ...)`: the split decode kernel (kernels/attention_decode_triton.py,
`reduce=False`), then `_merge_o_kernel` in place of its reduce launch and the o projection's
GEMV. Each program owns `block_c` dims of one head (`block_c` divides head_dim): it loads the
matching `block_c` columns of W_o before its PDL wait (so they stream in while the decode
kernel runs), then merges those dims of the head's partial outputs exactly as the reduce kernel
does, rounds them to the activation dtype (the reduce's stored output), multiplies by its
columns and adds the float32 `[hidden]` row into the zeroed `acc` with atomics. `zero`
(optional) is the other accumulator of a pair, zeroed by program 0 after its wait, as in
kernels/mlp_triton.py. An unsplit decode (one partition) keeps its own output and the GEMV.

Why: at batch 1 the reduce and the o projection are two launches on the step's critical path
for ~4 MB of weights (~2.1 + 2.2 µs a layer on the H100, bench/RESULTS.md).

Numerics: the merge is the reduce kernel's (`merge_partials`, shared); the o sums are float32,
added across programs in atomic order (the bf16 the consumer rounds to may vary in its last
bit from run to run).

To extend (more rows): the row loop below already takes BLOCK_M sequences of one query row.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .attention_decode_triton import DecodePartials, decode_attention, merge_partials, used_partitions
from .pdl import pdl_enabled, pdl_launch, pdl_release, pdl_wait

MAX_M = 4


@triton.jit(do_not_specialize=["M", "num_splits", "spo_s", "spo_h", "spl_s", "spl_h"])
def _merge_o_kernel(po_ptr, plse_ptr, qsl_ptr, lens_ptr, w_ptr, acc_ptr, zero_ptr, M, N,
                    num_splits, spo_s, spo_h, spo_p, spl_s, spl_h, sw, sam,
                    HEAD_DIM: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_NO: tl.constexpr,
                    BLOCK_S: tl.constexpr, CHUNK: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_M: tl.constexpr, HAS_ZERO: tl.constexpr, EVEN_N: tl.constexpr,
                    PDL: tl.constexpr = False):
    pdl_release(PDL)
    pid = tl.program_id(0)
    c0 = pid * BLOCK_C  # first of this program's attention-output dims (head-major)
    head = c0 // HEAD_DIM
    offs_c = c0 + tl.arange(0, BLOCK_C)
    offs_n = tl.arange(0, BLOCK_NO)
    n_mask = offs_n < N
    w_cols = w_ptr + offs_n.to(tl.int64)[:, None] * sw + offs_c[None, :]  # [BLOCK_NO, BLOCK_C]
    if EVEN_N:
        w = tl.load(w_cols)
    else:
        w = tl.load(w_cols, mask=n_mask[:, None], other=0.0)
    pdl_wait(PDL)
    act_dtype = w_ptr.dtype.element_ty
    offs_d = (c0 - head * HEAD_DIM) + tl.arange(0, BLOCK_C)
    for m in tl.static_range(BLOCK_M):
        seq = tl.minimum(m, M - 1)  # rows past M repeat the last one, and write nothing
        valid = m < M
        row = tl.load(qsl_ptr + seq)
        has_query = ((tl.load(qsl_ptr + seq + 1) - row) > 0) & valid
        used = used_partitions(lens_ptr, seq, has_query, num_splits, BLOCK_N)
        out = merge_partials(po_ptr + seq.to(tl.int64) * spo_s + head * spo_h,
                             plse_ptr + seq.to(tl.int64) * spl_s + head * spl_h, used, offs_d,
                             offs_d < HEAD_DIM, spo_p, BLOCK_S, CHUNK, BLOCK_C)
        a = out.to(act_dtype).to(tl.float32)
        part = tl.sum(w.to(tl.float32) * a[None, :], axis=1)
        tl.atomic_add(acc_ptr + row.to(tl.int64) * sam + offs_n, part, mask=n_mask & has_query,
                      sem="relaxed")
        if HAS_ZERO:
            tl.store(zero_ptr + m * sam + offs_n, tl.zeros([BLOCK_NO], dtype=tl.float32),
                     mask=n_mask & valid & (pid == 0))


def _check(q, o_weight, acc, zero):
    n, heads, head_dim = q.shape
    if not 0 < n <= MAX_M:
        raise ValueError(f"fused attention + o takes 1..{MAX_M} query rows, got {n}")
    if o_weight.dim() != 2 or o_weight.shape[1] != heads * head_dim or o_weight.dtype != q.dtype:
        raise ValueError(f"o weight must be [hidden, {heads * head_dim}] of {q.dtype}, got "
                         f"{tuple(o_weight.shape)} {o_weight.dtype}")
    for name, t in (("acc", acc), ("zero", zero)):
        if t is not None and (t.shape != (n, o_weight.shape[0]) or t.dtype != torch.float32
                              or t.stride(-1) != 1):
            raise ValueError(f"{name} must be a float32 [{n}, {o_weight.shape[0]}] buffer with unit "
                             f"column stride, got {tuple(t.shape)} {t.dtype}")
    if zero is not None and zero.stride() != acc.stride():
        raise ValueError("acc and zero must have the same strides")


def attention_o_small_triton(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
                             o_weight, acc, zero: Optional[torch.Tensor] = None, k_scale=None,
                             v_scale=None, block_c: int = 16, num_warps: int = 4,
                             num_splits: Optional[int] = None):
    """Adds `o_proj(decode_attention(q, ...))` (`[rows, hidden]`) into the zeroed float32 `acc`
    for decode rows (one query row per sequence); zeroes `zero`. Returns `acc`. `num_splits`
    forces the decode's split count (tests; by default its plan from shapes)."""
    _check(q, o_weight, acc, zero)
    n, heads, head_dim = q.shape
    block_c = min(block_c, head_dim)
    if head_dim % block_c or block_c & (block_c - 1):
        raise ValueError(f"block_c {block_c} must be a power of two dividing head_dim {head_dim}")
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    parts = decode_attention(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
                             out, num_splits=num_splits, k_scale=k_scale, v_scale=v_scale,
                             reduce=False)
    if not isinstance(parts, DecodePartials):  # one partition: the kernel wrote `out` itself
        from .gemv import linear_small
        acc.add_(linear_small(out.reshape(n, heads * head_dim), o_weight).float())
        if zero is not None:
            zero.zero_()
        return acc
    o_weight = o_weight if o_weight.stride(-1) == 1 else o_weight.contiguous()
    hidden = o_weight.shape[0]
    block_no = triton.next_power_of_2(hidden)
    block_s = triton.next_power_of_2(parts.splits)
    pdl = pdl_enabled(q)
    _merge_o_kernel[(heads * head_dim // block_c,)](
        parts.out, parts.lse, query_start_loc, seq_lens, o_weight, acc,
        zero if zero is not None else acc, seq_lens.shape[0], hidden, parts.splits,
        *parts.out.stride()[:3], *parts.lse.stride()[:2], o_weight.stride(0), acc.stride(0),
        HEAD_DIM=head_dim, BLOCK_C=block_c, BLOCK_NO=block_no, BLOCK_S=block_s,
        CHUNK=min(block_s, 16), BLOCK_N=parts.block_n,
        BLOCK_M=triton.next_power_of_2(seq_lens.shape[0]), HAS_ZERO=zero is not None,
        EVEN_N=block_no == hidden, PDL=pdl, num_warps=num_warps, **pdl_launch(pdl))
    return acc
