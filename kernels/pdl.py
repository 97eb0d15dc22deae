"""Programmatic dependent launch (PDL, sm_90+): the next kernel's programs start while the one
before it drains, and load what they can before they wait for it.

Owns: `pdl_enabled(t)` (a CUDA tensor on an sm_90+ device, not the Triton interpreter, and
`INFER_CLUSTER_PDL` not 0/off) and two jit helpers, no-ops unless their flag is set, so a kernel
compiled without PDL is the code it was before:
  * `pdl_release(ENABLED)`: called first thing by a kernel whose successor may be PDL-launched;
    once every program of it has called it, the successor's programs may take free SM slots.
  * `pdl_wait(ENABLED)`: in a kernel launched with `launch_pdl=True`, returns once the kernel
    before it has finished and its writes are visible. Before it, the kernel may read only memory
    no kernel of the step writes: the small-batch GEMV (`gemv_triton.py`) loads its first weight
    tile there, so that tile's HBM latency overlaps the previous kernel's tail. (Prefetch hints
    instead of loads did not help: `prefetch.global.L2` in ad8d8cd and bulk L2 prefetch on a side
    stream in 07285eb both made batch-1 decode slower; bench/RESULTS.md.)
Every program of a PDL-launched kernel must reach `pdl_wait` before it ends, so that its own
completion still implies its predecessor's (kernels later in the stream rely on it).
Inside CUDA graphs the launch attribute becomes a programmatic edge (CUDA >= 12.3).
To extend: give a kernel a `PDL: tl.constexpr`, call `pdl_release(PDL)` at its top, and if it is
launched with PDL, `pdl_wait(PDL)` before its first read of anything an earlier kernel wrote.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .dispatch import env_switch


def pdl_enabled(t: torch.Tensor) -> bool:
    if not t.is_cuda or os.environ.get("TRITON_INTERPRET", "0") == "1":
        return False
    if not env_switch("INFER_CLUSTER_PDL"):
        return False
    return torch.cuda.get_device_capability(t.device)[0] >= 9


def pdl_launch(enabled: bool) -> dict:
    """The launch option for a PDL launch: `**pdl_launch(pdl)` (nothing when off, so the
    interpreter, which knows no such option, never sees it)."""
    return {"launch_pdl": True} if enabled else {}


@triton.jit
def pdl_release(ENABLED: tl.constexpr):
    if ENABLED:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def pdl_wait(ENABLED: tl.constexpr):
    if ENABLED:
        tl.extra.cuda.gdc_wait()
