"""Programmatic dependent launch (PDL, Hopper and later): a kernel may start while the kernel
before it on the stream is still running, to do work that does not depend on it.

Owns: `pdl_enabled(t)` (CUDA tensor, compute capability >= 9, not the Triton interpreter, and
`INFER_CLUSTER_PDL` not "0"), and the jit helpers `pdl_trigger(ENABLED)` and `pdl_wait(ENABLED)`
(no-ops when ENABLED is false, so kernels compile the same code as before without it).
Protocol:
  * a kernel that precedes a PDL-launched one calls `pdl_trigger` first thing: once every one of
    its programs has started, the next kernel's programs may be scheduled on free SMs;
  * a kernel launched with `launch_pdl=True` may touch only data no earlier kernel writes (its
    weights) before `pdl_wait`, which returns once the previous kernel has finished and its
    writes are visible. The small-batch GEMV (`gemv_triton.py`) prefetches its weight slab into
    L2 there, so the weight reads of a decode step overlap the tail of the kernel before it.
Inside CUDA graphs the launch attribute becomes a programmatic edge (CUDA >= 12.3).
Must never be enabled for a kernel that reads activations before `pdl_wait`.
To extend: give another kernel a `PDL: tl.constexpr` flag, call `pdl_trigger(PDL)` (and, if it
is launched with PDL, `pdl_wait(PDL)` before its first activation read).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


def pdl_enabled(t: torch.Tensor) -> bool:
    if not t.is_cuda or os.environ.get("TRITON_INTERPRET", "0") == "1":
        return False
    if os.environ.get("INFER_CLUSTER_PDL", "1") == "0":
        return False
    return torch.cuda.get_device_capability(t.device)[0] >= 9


@triton.jit
def pdl_trigger(ENABLED: tl.constexpr):
    if ENABLED:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def pdl_wait(ENABLED: tl.constexpr):
    if ENABLED:
        tl.extra.cuda.gdc_wait()


@triton.jit
def prefetch_l2(ptrs):
    """Ask for the 128-byte lines at `ptrs` to be brought into L2 (no registers, no fault)."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // dummy $0", "=r,l", [ptrs],
                              dtype=tl.int32, is_pure=False, pack=1)
