"""Projections with their next op in the epilogue, for mid-size decode batches: dispatch and tiles.

Owns: `qkv_proj_prep(x, w, ...)` (= `qkv_prep(F.linear(x, w), ...)`: returns q, writes k and v
into the caches) and `gate_up_silu(x, w)` (= `silu_and_mul(F.linear(x, w))`), their references
(exactly those compositions), `proj_epilogue_config` (the Triton tiles a row count gets) and
`use_proj_epilogue`, the one rule the model layers use to take them: CUDA, 16-bit activations,
`MIN_M`..`MAX_M` rows (below, the small-batch GEMV path; above, prompts, where cuBLAS is at its
FLOP floor), no bias, K a multiple of the tile's K step, and a head_dim of 32..256 (a power of
two). `INFER_CLUSTER_PROJ_EPILOGUE=0`, read by `proj_epilogue_enabled()` when a layer is built,
keeps cuBLAS and the separate kernels.

Tiles (block_m, block_k, num_warps, num_stages) per row-count bucket come from
`bench/proj_epilogue.py` on an H200 (Qwen3-0.6B shapes); the MLP's column block is `SILU_BLOCK_N`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .activation import silu_and_mul, silu_and_mul_ref
from .dispatch import env_switch, use_triton
from .qkv_prep import qkv_prep, qkv_prep_ref

MIN_M, MAX_M = 17, 256
SILU_BLOCK_N = 64
# (kind, rows bucket) -> (block_m, block_k, num_warps, num_stages); buckets are powers of two.
TILES = {
    ("qkv", 32): (32, 64, 4, 4), ("qkv", 64): (32, 64, 4, 4),
    ("qkv", 128): (64, 64, 4, 4), ("qkv", 256): (64, 64, 4, 4),
    ("silu", 32): (32, 64, 4, 4), ("silu", 64): (32, 64, 4, 4),
    ("silu", 128): (64, 64, 4, 4), ("silu", 256): (64, 64, 4, 4),
}


def proj_epilogue_enabled() -> bool:
    """False when `INFER_CLUSTER_PROJ_EPILOGUE=0` (A/B against cuBLAS + separate kernels)."""
    return env_switch("INFER_CLUSTER_PROJ_EPILOGUE")


def proj_epilogue_config(kind: str, m: int) -> tuple:
    bucket = max(32, 1 << max(0, m - 1).bit_length())
    return TILES[(kind, min(bucket, MAX_M))]


def use_proj_epilogue(enabled: bool, x: torch.Tensor, w: torch.Tensor, bias,
                      head_dim: int = 128) -> bool:
    if not (enabled and x.dim() == 2 and MIN_M <= x.shape[0] <= MAX_M and bias is None):
        return False
    if not (x.is_cuda and use_triton(x) and x.dtype in (torch.float16, torch.bfloat16)
            and w.dtype == x.dtype):
        return False
    return x.shape[1] % 64 == 0 and 32 <= head_dim <= 256 and not head_dim & (head_dim - 1)


def qkv_proj_prep_ref(x, w, *args, **kw):
    return qkv_prep_ref(F.linear(x, w), *args, **kw)


def gate_up_silu_ref(x, w):
    return silu_and_mul_ref(F.linear(x, w))


def qkv_proj_prep(x, w, *args, **kw):
    """One launch on the path `use_proj_epilogue` picks; else cuBLAS, then `qkv_prep`."""
    if use_proj_epilogue(True, x, w, None, kw["head_dim"]):
        from .proj_epilogue_triton import qkv_proj_prep_triton
        return qkv_proj_prep_triton(x, w, *args, **kw, cfg=proj_epilogue_config("qkv", x.shape[0]))
    return qkv_prep(F.linear(x, w), *args, **kw)


def gate_up_silu(x, w):
    if use_proj_epilogue(True, x, w, None) and (w.shape[0] // 2) % SILU_BLOCK_N == 0:
        from .proj_epilogue_triton import gate_up_silu_triton
        return gate_up_silu_triton(x, w, proj_epilogue_config("silu", x.shape[0]), SILU_BLOCK_N)
    return silu_and_mul(F.linear(x, w))
