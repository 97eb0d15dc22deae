"""Fused decoder MLP for decode batches of a row or so: dispatch, reference and the rule of use.

Owns: `fused_mlp_small(x, residual, norm_weight, eps, gate_up_weight, down_weight, acc, zero)`
(= the fused add + RMSNorm, the gate_up projection, `silu(gate) * up` and the down projection,
added as float32 into the zeroed `acc`; returns `(acc, x + residual)` and zeroes `zero` when
given), `fused_mlp_ref` (its plain-torch twin), `fused_mlp_config(rows, hidden, inter)` (the
launch a shape gets, or None: keep the two GEMVs), `use_fused_mlp` (the layers' whole rule) and
`fused_mlp_enabled()`, which reads the
`INFER_CLUSTER_FUSED_MLP=0` A/B switch once, when the layers are built.
Keeps no state; the two accumulators live in `DecoderModel.forward` (worker/models/decoder.py).

The rule: only where it was measured to win, batch-1 decode of MLPs no bigger than the
Qwen3-0.6B shape's (hidden 1024, intermediate 3072) on one rank; every program adds a whole
hidden-wide row with atomics, so the atomics grow with hidden x intermediate / channels per
program, and wider MLPs keep the GEMVs. To extend it to a shape or a row count: measure
`bench/fused_mlp.py` there and widen `_MAX_ROWS` / `_MAX_WEIGHT_ELEMS`.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .activation import silu_and_mul_ref
from .dispatch import env_switch, use_triton
from .norm import add_rms_norm, rms_norm_ref

_MAX_ROWS = 1
_MAX_WEIGHT_ELEMS = 1024 * 3072  # hidden x intermediate of the Qwen3-0.6B shape
_BLOCK_C, _WARPS = 16, 8  # channels per program, warps (bench/fused_mlp.py, H100)


def fused_mlp_enabled() -> bool:
    """False when `INFER_CLUSTER_FUSED_MLP=0` (A/B against the gate_up and down GEMVs)."""
    return env_switch("INFER_CLUSTER_FUSED_MLP")


def fused_mlp_config(rows: int, hidden: int, inter: int) -> Optional[tuple[int, int]]:
    """`(channels per program, warps)` for the fused launch, or None where it does not apply."""
    if not 0 < rows <= _MAX_ROWS or hidden * inter > _MAX_WEIGHT_ELEMS:
        return None
    return _BLOCK_C, _WARPS


def use_fused_mlp(enabled: bool, x: torch.Tensor, inter: int) -> bool:
    """The layers' rule: switch on, the small-batch GEMV path for `x` (kernels/gemv.py), a shape
    `fused_mlp_config` takes, and on CUDA a GPU of compute capability 9.x (where it was measured)."""
    from .gemv import _hopper, use_small_path
    return bool(use_small_path(enabled, x) and fused_mlp_config(x.shape[0], x.shape[1], inter)
                and _hopper(x))


def fused_mlp_ref(x, residual, norm_weight, eps, gate_up_weight, down_weight):
    """`(down(silu_and_mul(gate_up(rms_norm(x + residual)))), x + residual)`, the down output
    in the weights' dtype (the unfused path's rounding)."""
    h, residual = add_rms_norm(x, residual, norm_weight, eps, norm=rms_norm_ref)
    return F.linear(silu_and_mul_ref(F.linear(h, gate_up_weight)), down_weight), residual


def fused_mlp_small(x, residual, norm_weight, eps, gate_up_weight, down_weight,
                    acc: torch.Tensor, zero: Optional[torch.Tensor] = None):
    """Adds the MLP's output into the zeroed float32 `acc` ([rows, hidden]); returns
    `(acc, x + residual)`. Off Triton, the reference (its output rounded, as the GEMVs round)."""
    if use_triton(x):
        cfg = fused_mlp_config(x.shape[0], x.shape[-1], down_weight.shape[-1]) or (_BLOCK_C, _WARPS)
        from .mlp_triton import fused_mlp_small_triton
        return fused_mlp_small_triton(x, residual, norm_weight, eps, gate_up_weight, down_weight,
                                      acc, zero, block_c=cfg[0], num_warps=cfg[1])
    y, residual = fused_mlp_ref(x, residual, norm_weight, eps, gate_up_weight, down_weight)
    acc.add_(y.float())
    if zero is not None:
        zero.zero_()
    return acc, residual
