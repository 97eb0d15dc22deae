"""Triton read of page-locked, device-mapped host memory into a device tensor (UVA zero-copy).

Owns: `mapped_read_triton(src, out)`: `out[:] = src[:]` for 1-D tensors of one dtype, where `src`
is host memory that the device can address (registered with cudaHostRegisterMapped, see
worker/device/host_memory.py; Triton's launcher turns its host pointer into the device address and fails
loudly if there is none). The SMs pull the bytes over PCIe, so the copy never waits for a copy
engine that other streams keep busy (worker/device/upload.py says why that matters). Under
`TRITON_INTERPRET=1` both tensors live on the CPU and the same program runs.
Must never be given pageable host memory on CUDA, and never synchronize.
To extend: other layouts (2-D, strided) would take strides like the other kernels here.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024  # elements per program (8 KB of int64)


@triton.jit(do_not_specialize=["n"])  # the length changes every step: one compiled variant
def _mapped_read_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)


def mapped_read_triton(src: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    if src.dim() != 1 or out.dim() != 1 or src.shape != out.shape or src.dtype != out.dtype:
        raise ValueError(f"mapped_read needs 1-D tensors of one shape and dtype, got "
                         f"{tuple(src.shape)} {src.dtype} and {tuple(out.shape)} {out.dtype}")
    if not (src.is_contiguous() and out.is_contiguous()):
        raise ValueError("mapped_read needs contiguous tensors")
    n = src.shape[0]
    if n:
        _mapped_read_kernel[(triton.cdiv(n, BLOCK),)](src, out, n, BLOCK=BLOCK)
    return out
