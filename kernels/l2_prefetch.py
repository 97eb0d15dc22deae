"""L2 prefetch of weight ranges: the mode rule and the checked entry point.

Owns: `MODES`, `l2_prefetch_mode(device)` (the mode a device gets: `INFER_CLUSTER_L2_PREFETCH`
= auto / off / bulk / lines, auto meaning "bulk" on sm_90+ CUDA devices and "off" elsewhere) and
`l2_prefetch(tensors, dummy, mode)`, which checks the tensors and launches
`l2_prefetch_triton` once per four of them. Prefetching changes no value anywhere, so there is no
reference implementation: off CUDA the mode is always "off" and nothing calls this.
To extend: a new mode goes into MODES, the rule below, and `l2_prefetch_triton`.
"""

from __future__ import annotations

import os
from typing import Sequence

import torch

MODES = ("off", "bulk", "lines")
_ENV = "INFER_CLUSTER_L2_PREFETCH"


def l2_prefetch_mode(device: torch.device) -> str:
    """The prefetch mode for `device`; raises ValueError for an unknown `INFER_CLUSTER_L2_PREFETCH`."""
    asked = os.environ.get(_ENV, "auto").strip().lower() or "auto"
    if asked in ("0", "false", "no"):
        asked = "off"
    if asked not in MODES + ("auto",):
        raise ValueError(f"{_ENV} must be one of auto, {', '.join(MODES)}; got {asked!r}")
    if device.type != "cuda" or asked == "off":
        return "off"
    major, _ = torch.cuda.get_device_capability(device)
    need = 8 if asked == "lines" else 9
    if major < need:
        return "off"
    return "bulk" if asked == "auto" else asked


def l2_prefetch(tensors: Sequence[torch.Tensor], dummy: torch.Tensor, mode: str) -> None:
    """Ask for every byte of `tensors` (contiguous, 16-byte aligned, on one CUDA device) to be
    pulled into L2. Returns at once; the bytes arrive while later kernels run."""
    if mode not in MODES or mode == "off":
        raise ValueError(f"l2_prefetch mode must be one of {', '.join(MODES[1:])}, got {mode!r}")
    ranges = []
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        if not t.is_cuda or not t.is_contiguous() or t.data_ptr() % 16 or nbytes % 16:
            raise ValueError(f"l2_prefetch needs contiguous, 16-byte aligned CUDA tensors whose size "
                             f"is a multiple of 16 bytes; got {tuple(t.shape)} {t.dtype} on {t.device}")
        if nbytes:
            ranges.append((t.data_ptr(), nbytes))
    from .l2_prefetch_triton import MAX_RANGES, l2_prefetch_triton
    for i in range(0, len(ranges), MAX_RANGES):
        l2_prefetch_triton(ranges[i:i + MAX_RANGES], dummy, mode)
