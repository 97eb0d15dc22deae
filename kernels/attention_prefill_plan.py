"""The prefill kernel's launch plan: its tiles and its grid, from shapes only.

Owns: `_tiles` (BLOCK_M, BLOCK_N, warps, stages per dtype, head_dim, cache and mean query),
`WIDE_MIN_QUERY` / `PREFILL_WIDE` (the wide tiles' rule and its A/B switch) and `prefill_tiles`
(the grid's first axis: the step's query tiles, or (sequence, query block) where that is no
larger). Host Python only; `attention_prefill_triton` launches the kernel with them. Everything
here reads shapes, dtypes and the host's `max_query_len`, never tensor values, so a prefill or
mixed step stays capturable in a CUDA graph. A new tile rule goes into `_tiles`, checked for
register spills (`bench/ptxas_check.py --only prefill`, docs/kernels.md).
"""

from __future__ import annotations

import torch
import triton

from .dispatch import env_switch


def prefill_tiles(num_seqs: int, num_tokens: int, max_query_len: int, pack: int,
                  block_m: int) -> tuple[int, int]:
    """(programs along the grid's first axis, `dense_blocks`). The step's query tiles, numbered
    sequence by sequence (`_tile_owner`): sequence i has cdiv(q_len_i * pack, block_m) of them,
    so there are at most cdiv(num_tokens * pack, block_m) + num_seqs (one partial tile a
    sequence). Where a grid over (sequence, query block) is no larger (one prompt, a few
    chunks), that grid is used instead (`dense_blocks` = blocks a sequence; 0 otherwise), and a
    program finds its tile without the scan. From shapes and the host's max_query_len only, as
    CUDA graphs need. Why: the grid was always (sequence, query block), and a mixed-step graph
    bucket of 512 tokens over 256 mostly padded sequences launched 32,768 programs per head
    group for one 300-token prompt: 0.50 ms a layer on the H200, where the prompt's own work
    takes microseconds."""
    per_seq = triton.cdiv(max_query_len * pack, block_m)
    tiles = triton.cdiv(num_tokens * pack, block_m) + num_seqs
    if num_seqs * per_seq <= tiles:
        return num_seqs * per_seq, per_seq
    return tiles, 0


# Wide tiles for steps of long queries (`_tiles`): BLOCK_M 128, 8 warps (two warpgroups), 4
# stages, where a step averages at least WIDE_MIN_QUERY tokens a sequence. H200, 2026-11-30
# (bench/int8_prefill.py --tiles, bf16, Qwen3-0.6B heads), against 64 x 64 / 4 warps / 3 stages:
# two 1k-token chunks over 2k cached tokens 1.19x (174 -> 208 TFLOP/s), four 512-token chunks
# 1.16x, 16 fresh prompts of 100-1,024 tokens 1.09x; 128 x 128 / 3 stages gave 1.27x / 1.23x but
# 1.02x on fresh prompts. A mixed step of 192 decode rows beside 8 prompts ran 0.73x with them (a
# decode row fills a tile of 128 rows for 2), hence the average. `INFER_CLUSTER_PREFILL_WIDE=0`
# keeps 64 x 64 (read once at import, for A/B). Head dim 128 only: others were not measured.
WIDE_MIN_QUERY = 256
PREFILL_WIDE = env_switch("INFER_CLUSTER_PREFILL_WIDE")


def _tiles(q, block_d, kv_int8=False, mean_query=0):
    """Prefill (BLOCK_M, BLOCK_N, num_warps, num_stages), checked against sm_90 ptxas for no
    register spills at head_dim 64/128/256. float32 dots run without tensor cores and hold their
    operands in registers, hence the narrower tiles and 8 warps. An int8 cache converts its
    tiles in registers: at head_dim 256 the float tile spills (255 registers), 32x32 does not
    (128). 16-bit queries of a step averaging `WIDE_MIN_QUERY` tokens or more a sequence
    (`mean_query`, from shapes) at head_dim 128 take the wide tiles above. On the interpreter
    small tiles keep several tiles per test case, exercising the boundaries."""
    if not q.is_cuda:
        return 16, 16, 4, 1
    if q.dtype == torch.float32:
        return 32, 16, 8, 2
    if block_d <= 128:
        if PREFILL_WIDE and block_d == 128 and not kv_int8 and mean_query >= WIDE_MIN_QUERY:
            return 128, 64, 8, 4
        return 64, 64, 4, 3
    if kv_int8:
        return 32, 32, 8, 2
    return 64, 32, 8, 2
