"""Triton twins of the penalty state's two per-step updates (`worker.sampling_state`): the
penalties on the seen columns of the logits, and the fold of the step's new tokens.

Owns two kernels, one program per request row, each walking the request's slot in chunks of
`CH` seen tokens:
  * `apply_penalties`: x[row, id] for every id the request has seen gets the repetition penalty
    (divide a positive logit, multiply a negative one), then minus frequency x count and presence
    x (count > 0), in that order and in float32 without fused multiply-adds, as the torch path.
  * `append_tokens`: the new token's count goes up by one where the slot holds it, else it is
    written at the slot's end with count 1 and the slot's distinct count grows.
Their references are the torch paths of `SamplingState.apply_penalties` / `append`, which the CPU
runs (tests/kernels/test_penalty_kernels.py compares them). The ids of one slot are distinct,
so no two lanes write the same column.

To extend: a new per-token statistic is one more load and store in both kernels and the torch
paths.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CH = 128  # seen tokens per chunk


@triton.jit(do_not_specialize=["sx", "s_ids", "s_cnt", "n"])
def _apply_kernel(x_ptr, sx, ids_ptr, counts_ptr, s_ids, s_cnt, num_ptr, packed_ptr, n, CH: tl.constexpr):
    j = tl.program_id(0)
    # packed: float64 [5, n] = slot, row, repetition, frequency, presence (as the torch path uploads)
    slot = tl.load(packed_ptr + j).to(tl.int64)
    row = tl.load(packed_ptr + n + j).to(tl.int64)
    rep = tl.load(packed_ptr + 2 * n + j).to(tl.float32)
    freq = tl.load(packed_ptr + 3 * n + j).to(tl.float32)
    pres = tl.load(packed_ptr + 4 * n + j).to(tl.float32)
    num = tl.load(num_ptr + slot)
    for c0 in range(0, num, CH):
        c = c0 + tl.arange(0, CH)
        valid = c < num
        t = tl.load(ids_ptr + slot * s_ids + c, mask=valid, other=0)
        cnt = tl.load(counts_ptr + slot * s_cnt + c, mask=valid, other=0.0)
        y = tl.load(x_ptr + row * sx + t, mask=valid, other=0.0)
        z = tl.where(y > 0, tl.div_rn(y, tl.zeros_like(y) + rep), y * rep)  # IEEE division, as torch
        z = z - freq * cnt - pres * tl.where(cnt > 0, 1.0, 0.0)
        tl.store(x_ptr + row * sx + t, z, mask=valid)


def apply_penalties(x: torch.Tensor, token_ids: torch.Tensor, counts: torch.Tensor,
                    num_distinct: torch.Tensor, packed: torch.Tensor) -> None:
    """In place on float32 logits x [rows, vocab] (unit column stride): the penalties of
    `packed` [5, n] float64 (slot, row, repetition, frequency, presence per request)."""
    n = packed.shape[1]
    if n:
        _apply_kernel[(n,)](x, x.stride(0), token_ids, counts, token_ids.stride(0), counts.stride(0),
                            num_distinct, packed, n, CH=CH, num_warps=4, enable_fp_fusion=False)


@triton.jit(do_not_specialize=["s_ids", "s_cnt"])
def _append_kernel(ids_ptr, counts_ptr, s_ids, s_cnt, num_ptr, slots_ptr, tokens_ptr, CH: tl.constexpr):
    j = tl.program_id(0)
    slot = tl.load(slots_ptr + j).to(tl.int64)  # float64 slots (exact), as the penalties' upload
    t = tl.load(tokens_ptr + j)
    num = tl.load(num_ptr + slot)
    pos = num
    for c0 in range(0, num, CH):
        c = c0 + tl.arange(0, CH)
        ids = tl.load(ids_ptr + slot * s_ids + c, mask=c < num, other=-1)
        pos = tl.minimum(pos, tl.min(tl.where((ids == t) & (c < num), c, num), axis=0))
    cnt = tl.load(counts_ptr + slot * s_cnt + pos)
    tl.store(counts_ptr + slot * s_cnt + pos, cnt + 1.0)
    tl.store(ids_ptr + slot * s_ids + pos, t)  # the same id where it was found
    tl.store(num_ptr + slot, tl.where(pos == num, num + 1, num))


def append_tokens(token_ids: torch.Tensor, counts: torch.Tensor, num_distinct: torch.Tensor,
                  slots: torch.Tensor, tokens: torch.Tensor) -> None:
    """Fold tokens[j] (int64, on the state's device) into slot slots[j] (float64, whole
    numbers: the slot row of `apply_penalties`' upload); the slots are distinct and have room
    for one more id (the caller grew the width)."""
    n = slots.shape[0]
    if n:
        _append_kernel[(n,)](token_ids, counts, token_ids.stride(0), counts.stride(0), num_distinct,
                             slots, tokens, CH=CH, num_warps=4)
