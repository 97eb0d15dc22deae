"""Mid-size linear layers (17-256 rows, the decode batches past the GEMVs): dispatch.

Owns: `gemm_config(m, n, k)` (the table's entry for a shape: a `GemmConfig` for the Gluon Hopper
GEMM, or None for cuBLAS), `linear_mid(x, weight, tiles)` (= `F.linear(x, weight)` through
whichever the table names), `mid_path(enabled, x, weight)`, the one rule the model layers use
to ask for it, and `gemm_enabled()` (`INFER_CLUSTER_GEMM=0` keeps every layer on cuBLAS; read
once, when a layer is built).
`tiles` is the layer's own int32 count buffer for split-K (`TILES` zeros, a non-persistent
buffer of the layer); the kernel leaves it at zero. No state here.

To tune: `python bench/gemm.py --sweep` on the GPU, then paste its entries into `gemm_table.py`.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .dispatch import env_switch
from .gemv import GEMV_MAX_M

MID_MAX_M = 256  # rows up to which the table is consulted (4 tiles of 64)
TILES = 512      # split-K counts a layer holds: one per output tile (N / block_n x 4)


def gemm_enabled() -> bool:
    """False when `INFER_CLUSTER_GEMM=0` (A/B against cuBLAS on the GPU)."""
    return env_switch("INFER_CLUSTER_GEMM")


def gemm_config(m: int, n: int, k: int):
    """The table's GemmConfig for (N, K, 64-row tiles of M), None (cuBLAS) when unlisted."""
    from .gemm_gluon import BLOCK_M
    from .gemm_table import TABLE
    cfg = TABLE.get((n, k, -(-m // BLOCK_M)))
    if cfg is None or not cfg.fits(m, n, k):
        return None
    from .gemm_gluon import tiles_needed
    return cfg if tiles_needed(m, n, cfg) <= TILES else None


def mid_path(enabled: bool, x: torch.Tensor, weight: torch.Tensor) -> bool:
    """The layers' rule: switch on, GEMV_MAX_M < rows <= MID_MAX_M, and inputs the kernel takes."""
    if not (enabled and x.dim() == 2 and GEMV_MAX_M < x.shape[0] <= MID_MAX_M and x.is_cuda):
        return False
    from .gemm_gluon import gemm_supported
    return gemm_supported(x, weight)


def linear_mid(x: torch.Tensor, weight: torch.Tensor, tiles: Optional[torch.Tensor]) -> torch.Tensor:
    cfg = gemm_config(x.shape[0], weight.shape[0], weight.shape[1]) if tiles is not None else None
    if cfg is None:
        return F.linear(x, weight)
    from .gemm_gluon import gemm_sm90
    from .pdl import pdl_enabled
    return gemm_sm90(x, weight, cfg, tiles, pdl=pdl_enabled(x))
