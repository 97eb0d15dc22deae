"""Launch parameters of the small-batch linear kernels (`kernels/gemv_triton.py`).

Owns: `GemvConfig` (validated in __post_init__) and MAX_M, the most rows one launch handles.
Imports no Triton, so the config table (`gemv_tuned.py`) and the dispatch (`gemv.py`) load on
machines without it. To add a launch knob: a field here, its use in `gemv_triton._launch`, and
a value in `bench/gemv.py`'s sweep grid.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_M = 16  # rows one launch handles; the dot path pads M to 16


@dataclass(frozen=True)
class GemvConfig:
    block_n: int = 8
    block_k: int = 256
    num_warps: int = 4
    num_stages: int = 2
    split_k: int = 1
    use_dot: bool = False

    def __post_init__(self):
        for name in ("block_n", "block_k"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"GemvConfig.{name} must be a power of two, got {v}")
        if self.use_dot and (self.block_n < 16 or self.block_k < 16):
            raise ValueError(f"use_dot needs block_n and block_k >= 16, got {self.block_n}, {self.block_k}")
        if self.split_k < 1 or self.num_warps < 1 or self.num_stages < 1:
            raise ValueError(f"split_k, num_warps and num_stages must be >= 1: {self}")
