"""Triton read of page-locked, device-mapped host memory into a device tensor (UVA zero-copy).

Owns: `mapped_read_triton(src, out)`: `out[:] = src[:]` for 1-D tensors of one dtype, and
`mapped_read_staged`: a head of int64 words plus a few rows of an int32 table inside the same
buffer (a decode step's graph inputs), in one launch. `src` is host memory that the device can
address (registered with cudaHostRegisterMapped, see worker/device/host_memory.py; Triton's
launcher turns its host pointer into the device address and fails loudly if there is none). The
SMs pull the bytes over PCIe, so the copy never waits for a copy engine that other streams keep
busy (worker/device/upload.py says why that matters). Under
`TRITON_INTERPRET=1` both tensors live on the CPU and the same program runs.
Must never be given pageable host memory on CUDA, and never synchronize.
To extend: other layouts would take strides as `mapped_read_staged` does.
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


@triton.jit(do_not_specialize=["rows", "cols"])  # both change every step: one compiled variant
def _staged_read_kernel(src64, dst64, head, src32, dst32, table_at, rows, cols, stride,
                        BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    head_programs = tl.cdiv(head, BLOCK)
    if pid < head_programs:
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        mask = offs < head
        tl.store(dst64 + offs, tl.load(src64 + offs, mask=mask), mask=mask)
    else:
        e = (pid - head_programs) * BLOCK + tl.arange(0, BLOCK)
        mask = e < rows * cols
        offs = table_at + (e // cols) * stride + e % cols
        tl.store(dst32 + offs, tl.load(src32 + offs, mask=mask), mask=mask)


def mapped_read_staged(src: torch.Tensor, out: torch.Tensor, head: int, table_at: int, rows: int,
                       cols: int, stride: int) -> torch.Tensor:
    """One launch for a step laid out as a head and a table (worker/runner/graph_inputs.py):
    `out[:head] = src[:head]` (int64 words), and of the int32 table that starts at int64 word
    `table_at` with rows of `stride` int32 values, the first `cols` values of the first `rows`
    rows. Only those bytes cross the link, however wide the table's rows are."""
    if src.dim() != 1 or out.dim() != 1 or src.dtype != torch.int64 or out.dtype != torch.int64:
        raise ValueError("mapped_read_staged needs 1-D int64 tensors")
    if not (src.is_contiguous() and out.is_contiguous()):
        raise ValueError("mapped_read_staged needs contiguous tensors")
    if cols > stride or head > table_at or 2 * table_at + rows * stride > 2 * min(src.shape[0], out.shape[0]):
        raise ValueError(f"a head of {head} words and {rows} x {cols} of a table of stride {stride} at "
                         f"word {table_at} do not fit {src.shape[0]} / {out.shape[0]} words")
    programs = triton.cdiv(head, BLOCK) + triton.cdiv(rows * cols, BLOCK)
    if programs:
        _staged_read_kernel[(programs,)](src, out, head, src.view(torch.int32), out.view(torch.int32),
                                         2 * table_at, rows, cols, stride, BLOCK=BLOCK)
    return out
