"""Device dispatch for kernels: Triton on CUDA, the plain-torch reference elsewhere.

Owns: the single rule every kernel's public function uses to pick an implementation, and
`env_switch`, the one reader of the kernels' on/off A/B switches (`INFER_CLUSTER_GEMV`, ...).
`INFER_CLUSTER_KERNELS=torch` forces the references everywhere (for A/B checks on a GPU);
`=triton` forces Triton (CPU only works under `TRITON_INTERPRET=1`, which tests use).
"""

from __future__ import annotations

import os

import torch


def use_triton(t: torch.Tensor) -> bool:
    forced = os.environ.get("INFER_CLUSTER_KERNELS", "").lower()
    if forced == "torch":
        return False
    if forced == "triton":
        return True
    return t.is_cuda


def env_switch(name: str) -> bool:
    """An on/off switch from the environment, on unless set to 0 / false / off / no."""
    return os.environ.get(name, "1").strip().lower() not in ("0", "false", "off", "no")
