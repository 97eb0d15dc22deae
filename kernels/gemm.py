"""Mid-size linear layers (17-256 rows, the decode batches past the GEMVs): dispatch.

Owns: `gemm_config(m, n, k, silu)` (the table's entry for a shape: a `GemmConfig` for the Gluon
Hopper GEMM, or None for cuBLAS), `linear_mid(x, weight)` (= `F.linear(x, weight)` through
whichever the table names), `silu_linear_mid(x, weight)` (= `silu_and_mul(F.linear(x, weight))`
for a gate/up weight, in one launch where the table has a "silu" row for it),
`mid_path(enabled, x, weight, silu)`, the one rule the model layers use to ask for either,
`is_partials` / `sum_partials` (split-K partial sums, which `linear_mid(partials=True)` returns
where the table splits a shape's K; `kernels.norm.add_rms_norm` adds them as it reads), and
`gemm_enabled()` (`INFER_CLUSTER_GEMM=0` keeps every layer on cuBLAS; read once, when a layer is
built) and `gemm_split_enabled()` (`INFER_CLUSTER_GEMM_SPLIT=0` runs split entries unsplit). No state here.

To tune: `python bench/gemm.py --sweep --write` on an H200 rewrites `gemm_table.py`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .dispatch import env_switch
from .gemv import GEMV_MAX_M

MID_MAX_M = 256  # rows up to which the table is consulted (4 tiles of 64)


def gemm_enabled() -> bool:
    """False when `INFER_CLUSTER_GEMM=0` (A/B against cuBLAS on the GPU)."""
    return env_switch("INFER_CLUSTER_GEMM")


def gemm_split_enabled() -> bool:
    """False when `INFER_CLUSTER_GEMM_SPLIT=0`: split-K table entries run unsplit (A/B)."""
    return env_switch("INFER_CLUSTER_GEMM_SPLIT")


def gemm_config(m: int, n: int, k: int, silu: bool = False):
    """The table's GemmConfig for (N, K, 64-row tiles of M) (with "silu" last: the gate/up GEMM
    with SiLU-and-mul fused, N its weight's rows), None (cuBLAS) when unlisted."""
    from .gemm_gluon import BLOCK_M
    from .gemm_table import TABLE
    key = (n, k, -(-m // BLOCK_M))
    cfg = TABLE.get(key + ("silu",) if silu else key)
    n_out = n // 2 if silu else n
    return cfg if cfg is not None and not (silu and n % 2) and cfg.fits(m, n_out, k) else None


def mid_path(enabled: bool, x: torch.Tensor, weight: torch.Tensor, silu: bool = False) -> bool:
    """The layers' rule: switch on, GEMV_MAX_M < rows <= MID_MAX_M, a table entry, and inputs
    the kernel takes (CUDA sm_90, bf16/fp16, contiguous)."""
    if not (enabled and x.dim() == 2 and GEMV_MAX_M < x.shape[0] <= MID_MAX_M and x.is_cuda):
        return False
    from .gemm_gluon import gemm_supported
    return gemm_supported(x, weight) and gemm_config(x.shape[0], *weight.shape, silu=silu) is not None


def _gluon(x: torch.Tensor, weight: torch.Tensor, cfg, silu: bool, partials: bool = False) -> torch.Tensor:
    from .gemm_gluon import gemm_sm90
    from .pdl import pdl_enabled
    return gemm_sm90(x, weight, cfg, pdl=pdl_enabled(x), silu=silu, partials=partials)


def linear_mid(x: torch.Tensor, weight: torch.Tensor, partials: bool = False) -> torch.Tensor:
    """`F.linear(x, weight)` through the table's choice. With `partials`, where the table splits
    the shape's K: the float32 partial sums `[splits, rows_pad, N]` instead (`is_partials`),
    for a caller whose consumer adds them (`kernels.norm.add_rms_norm`)."""
    cfg = gemm_config(x.shape[0], weight.shape[0], weight.shape[1])
    return F.linear(x, weight) if cfg is None else _gluon(x, weight, cfg, silu=False, partials=partials)


def is_partials(x: torch.Tensor) -> bool:
    """Whether `x` is split-K partial sums (float32 `[splits, rows_pad, N]`) rather than the
    2-D activations they add up to."""
    return x.dim() == 3 and x.dtype == torch.float32


def sum_partials(x: torch.Tensor, rows: int) -> torch.Tensor:
    """The float32 `[rows, N]` sum of partials, split by split in order (deterministic)."""
    out = x[0, :rows].clone()
    for s in range(1, x.shape[0]):
        out += x[s, :rows]
    return out


def silu_linear_mid(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`silu_and_mul(x @ weight^T)` for a gate/up weight `[2I, K]`: one launch where the table
    has its "silu" row, else the GEMM (`linear_mid`) and then the SiLU kernel."""
    cfg = gemm_config(x.shape[0], weight.shape[0], weight.shape[1], silu=True)
    if cfg is None:
        from .activation import silu_and_mul
        return silu_and_mul(linear_mid(x, weight))
    return _gluon(x, weight, cfg, silu=True)
