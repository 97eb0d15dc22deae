"""Small-batch linear layers (decode GEMVs): dispatch, references and launch-config choice.

Owns: `linear_small(x, weight, bias)` (= `F.linear` for x `[M <= 16, K]`),
`silu_mul_linear_small(gate_up, weight)` (= `F.linear(silu_and_mul_ref(gate_up), weight)`) and
`rms_norm_linear_small(x, residual, norm_weight, eps, weight, bias)` (= the fused add + RMSNorm
of `kernels/norm.py`, then `F.linear`; returns `(y, x + residual)`), `pick_config` (which
`GemvConfig` a shape gets: the H100-tuned table in `gemv_tuned.py`, else a heuristic), and
`use_small_path`, the one rule the model layers use to take this path.
Never autotunes at call time and keeps no state: the `INFER_CLUSTER_GEMV=0` switch is read by
`gemv_enabled()`, `INFER_CLUSTER_NORM_FUSE=0` (keep the norm a kernel of its own) by
`norm_fuse_enabled()`, both called once by the layers when they are built.

To tune: run `bench/gemv.py --sweep` on the GPU and paste its table into `gemv_tuned.py`. An entry
of None means cuBLAS won for that shape, and `linear_small` then calls `F.linear`.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .activation import silu_and_mul_ref
from .dispatch import env_switch, use_triton
from .gemv_config import MAX_M, GemvConfig
from .gemv_tuned import TUNED
from .norm import add_rms_norm, rms_norm_ref

GEMV_MAX_M = MAX_M  # batch rows up to which the model layers take the small path
_TARGET_PROGRAMS = 256  # about two programs per SM on an H100 (132 SMs)
_MAX_DEFAULT_N = 65536  # untuned outputs wider than this (LM heads) stay on cuBLAS
# Untuned shapes take the heuristic only up to this many rows (bucket); from 4 rows cuBLAS. Every
# sweep so far (Qwen3-0.6B, Llama-3-8B and its T=2 shard, H100) had cuBLAS win or tie from 4 rows
# wherever the heuristic's tiles were not the winners, and untuned 16-row GEMVs made a T=2 decode
# step of the 8B shape 1.6x slower than cuBLAS with the norm apart, 3.7x with the fused norm
# (2026-11-26, bench/gpu_suite.sh t2gemv).
_DEFAULT_MAX_M = 2
# The add + RMSNorm prologue re-reads all rows of h in every program before its first weight tile:
# fused only while rows x K stays this small, which keeps it where it was measured to win (batch-1
# decode: Qwen3-0.6B TPOT) and drops it where it was measured to lose (2x H100, 2026-11-26):
# at rows x K = 65,536 (16 rows of the 8B shape) a decode step was 1.5x slower than norm apart,
# at 16,384 9-10% slower (16 rows of Qwen3-0.6B at T=1; 4 rows of the 8B shape at T=2).
# It also takes only the table's GEMV: the heuristic in the table's None cells (the earlier
# fallback) made 4-row T=1 decode of the 8B shape 1.3x slower than norm + cuBLAS.
FUSED_NORM_MAX_ELEMS = 4096


def gemv_enabled() -> bool:
    """False when `INFER_CLUSTER_GEMV=0` (A/B against cuBLAS on the GPU)."""
    return env_switch("INFER_CLUSTER_GEMV")


def norm_fuse_enabled() -> bool:
    """False when `INFER_CLUSTER_NORM_FUSE=0` (A/B of the add + RMSNorm prologue on the GPU)."""
    return env_switch("INFER_CLUSTER_NORM_FUSE")


def use_small_path(enabled: bool, x: torch.Tensor) -> bool:
    """The layers' rule: switch on, a 2-D input of at most GEMV_MAX_M rows, and Triton dispatch."""
    return enabled and x.dim() == 2 and 0 < x.shape[0] <= GEMV_MAX_M and use_triton(x)


def m_bucket(m: int) -> int:
    """Rows are tuned per power of two (1, 2, 4, 8, 16); 3 uses the 4-row config."""
    return 1 << max(0, m - 1).bit_length()


def default_config(m: int, n: int, k: int):
    """For shapes the table lacks: the heuristic up to `_DEFAULT_MAX_M` rows, cuBLAS (None) above."""
    return heuristic_config(m, n, k) if m_bucket(m) <= _DEFAULT_MAX_M else None


def heuristic_config(m: int, n: int, k: int):
    """Enough programs to cover the GPU twice, split-K when N alone cannot, CUDA-core products
    up to 4 rows and tensor-core dots above."""
    if m > GEMV_MAX_M or n > _MAX_DEFAULT_N:
        return None
    mb = m_bucket(m)
    if mb <= 4:
        block_n = 32
        while block_n > 2 and -(-n // block_n) < _TARGET_PROGRAMS:
            block_n //= 2
        block_k = max(64, min(512, 8192 // (mb * block_n)))  # product tile <= 8192 elements
        programs, dot = -(-n // block_n), False
    else:
        block_n, block_k, programs, dot = 16, 128, -(-n // 16), True
    split_k = 1
    while programs * split_k < _TARGET_PROGRAMS // 2 and k // (split_k * 2) >= 4 * block_k:
        split_k *= 2
    return GemvConfig(block_n=block_n, block_k=block_k, num_warps=4, num_stages=3,
                      split_k=split_k, use_dot=dot)


def pick_config(m: int, n: int, k: int, itemsize: int = 2, hopper: bool = True):
    """The tuned entry for (N, K, M bucket) if the sweep recorded one, else `default_config`.
    None means: use cuBLAS. The table was tuned on an H100 for 2-byte activations (bf16): its
    tiles can need twice the shared memory in float32 (a 64x256 tile with 4 stages asked for
    240 KB there), or more than a smaller GPU has, so other dtypes and GPUs other than compute
    capability 9.x (`hopper`) take the heuristic (at most ~50 KB of shared memory)."""
    key = (n, k, m_bucket(m))
    if itemsize == 2 and hopper and key in TUNED:
        return TUNED[key]
    return default_config(m, n, k)


def _hopper(t: torch.Tensor) -> bool:
    """Whether `t` lives on the kind of GPU the table was tuned on (the interpreter counts as one,
    so CPU tests exercise the tuned entries)."""
    return not t.is_cuda or torch.cuda.get_device_capability(t.device)[0] == 9


def fused_norm_config(m: int, n: int, k: int, itemsize: int = 2, hopper: bool = True):
    """The config of the GEMV with the add + RMSNorm prologue: the one `pick_config` gives.
    None: norm and linear apart (rows x K over `FUSED_NORM_MAX_ELEMS`, or the linear on cuBLAS)."""
    if m * k > FUSED_NORM_MAX_ELEMS:
        return None
    return pick_config(m, n, k, itemsize, hopper)


def linear_small_ref(x, weight, bias: Optional[torch.Tensor] = None):
    return F.linear(x, weight, bias)


def silu_mul_linear_small_ref(gate_up, weight):
    return F.linear(silu_and_mul_ref(gate_up), weight)


def rms_norm_linear_small_ref(x, residual, norm_weight, eps, weight, bias: Optional[torch.Tensor] = None):
    h, residual = add_rms_norm(x, residual, norm_weight, eps, norm=rms_norm_ref)
    return F.linear(h, weight, bias), residual


def linear_small(x, weight, bias: Optional[torch.Tensor] = None):
    if use_triton(x) and x.dim() == 2 and x.shape[0] <= GEMV_MAX_M:
        cfg = pick_config(x.shape[0], weight.shape[0], weight.shape[1], x.element_size(), _hopper(x))
        if cfg is not None:
            from .gemv_triton import linear_small_triton
            return linear_small_triton(x, weight, bias, cfg)
    return linear_small_ref(x, weight, bias)


def silu_mul_linear_small(gate_up, weight):
    if use_triton(gate_up) and gate_up.dim() == 2 and gate_up.shape[0] <= GEMV_MAX_M:
        cfg = pick_config(gate_up.shape[0], weight.shape[0], weight.shape[1], gate_up.element_size(),
                          _hopper(gate_up))
        if cfg is not None:
            from .gemv_triton import silu_mul_linear_small_triton
            return silu_mul_linear_small_triton(gate_up, weight, cfg)
    from .activation import silu_and_mul
    return F.linear(silu_and_mul(gate_up), weight)


def rms_norm_linear_small(x, residual, norm_weight, eps, weight, bias: Optional[torch.Tensor] = None):
    """`(linear(rms_norm(x + residual)), x + residual)` in one launch on the small path; with
    residual None, `(linear(rms_norm(x)), x)`. Elsewhere the separate norm and linear."""
    if use_triton(x) and x.dim() == 2 and x.shape[0] <= GEMV_MAX_M:
        # Keyed on x's dtype. After a fused MLP (kernels/mlp.py) x is its float32 sums, so the
        # next layer's qkv takes the heuristic launch, not the table's bf16 row, and the LM head
        # (no untuned fused launch that wide) keeps its norm apart: measured faster than the
        # table's rows in that step (H200, 2026-11-28: TPOT 0.721 vs 0.732 ms; the table was
        # tuned with two GEMVs before the qkv, docs/kernels.md "The fused batch-1 MLP").
        cfg = fused_norm_config(x.shape[0], weight.shape[0], weight.shape[1], x.element_size(), _hopper(x))
        if cfg is not None:
            from .gemv_triton import rms_norm_linear_small_triton
            return rms_norm_linear_small_triton(x, residual, norm_weight, eps, weight, bias, cfg)
    h, residual = add_rms_norm(x, residual, norm_weight, eps)
    return linear_small(h, weight, bias), residual
