"""Triton KV block swap: every (block pair, layer, field) row copied straight between the device
pool and the page-locked host pool in ONE launch per direction, no staging buffer and no CPU
gather. The host pool is read or written through its device mapping (UVA zero-copy: loads and
stores from the SMs cross PCIe/NVLink-C2C), so non-consecutive host blocks cost the same as
consecutive ones.

Owns: `kv_swap_triton`, the GPU twin of `kv_swap_ref` (same `SwapLayout`, same effect), and the
per-layout plan it caches on the layout (word size, alignment, offset tables).
Addressing: all tensors are copied as raw words (int32 when every row and base allows it, else
int16 / int8), so one kernel serves bf16/fp16/fp32 K and V, int8 codes and float32 scales.
Device fields are reached as `dev_base + dev_off[field, layer] + block * ROW` where `dev_base` is
layer 0's first field and `dev_off` the word distance of each (field, layer) tensor from it;
host fields as `host_base + host_off[field] + (block * num_layers + layer) * ROW`. Rows of the
first `NUM_A` fields are `ROW_A` words (K, V), the rest `ROW_B` (scales); both are compile-time
constants so masks and 16-byte vector accesses are resolved when compiling, and the loaded
offsets carry an alignment hint (`ALIGN` words, checked on the host).
Grid: (pairs, fields * layers, row chunks). A program whose chunk lies past its row does nothing.
Must never be called on a host pool that is not mapped for the device (on CUDA Triton's launcher
turns the host base pointer into its device address with cuPointerGetAttribute and fails
loudly otherwise), and never synchronize.
To extend: a third row size would need a third constexpr group; keep one launch per direction.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .kv_swap import SwapLayout

DEFAULT_CHUNK_BYTES = 8192  # per program; the GPU micro-benchmark (bench/kv_swap.py) sweeps it
_WORDS = {4: torch.int32, 2: torch.int16, 1: torch.int8}


@triton.jit
def _copy_row(dev_row, host_row, chunk, TO_HOST: tl.constexpr, ROW: tl.constexpr, CHUNK: tl.constexpr):
    start = chunk * CHUNK
    if start < ROW:
        offs = start + tl.arange(0, CHUNK)
        if TO_HOST:
            src = dev_row
            dst = host_row
        else:
            src = host_row
            dst = dev_row
        if ROW % CHUNK == 0:
            tl.store(dst + offs, tl.load(src + offs))
        else:
            mask = offs < ROW
            tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)


@triton.jit
def _kv_swap_kernel(dev_base, host_base, dev_off_ptr, host_off_ptr, host_idx_ptr, dev_idx_ptr, num_layers,
                    TO_HOST: tl.constexpr, NUM_A: tl.constexpr, ROW_A: tl.constexpr, ROW_B: tl.constexpr,
                    CHUNK_A: tl.constexpr, CHUNK_B: tl.constexpr, ALIGN: tl.constexpr):
    pair = tl.program_id(0)
    field_layer = tl.program_id(1)  # field * num_layers + layer
    chunk = tl.program_id(2)
    field = field_layer // num_layers
    layer = field_layer % num_layers
    h = tl.load(host_idx_ptr + pair).to(tl.int64)
    d = tl.load(dev_idx_ptr + pair).to(tl.int64)
    dev_off = tl.multiple_of(tl.load(dev_off_ptr + field_layer), ALIGN)
    host_off = tl.multiple_of(tl.load(host_off_ptr + field), ALIGN)
    host_row = h * num_layers + layer
    if field < NUM_A:
        _copy_row(dev_base + dev_off + d * ROW_A, host_base + host_off + host_row * ROW_A, chunk,
                  TO_HOST, ROW_A, CHUNK_A)
    else:
        _copy_row(dev_base + dev_off + d * ROW_B, host_base + host_off + host_row * ROW_B, chunk,
                  TO_HOST, ROW_B, CHUNK_B)


class _Plan:
    """What the kernel needs of a layout, computed once: word views of the two bases, the offset
    tables on the device, row sizes in words and the alignment the offsets guarantee."""

    def __init__(self, layout: SwapLayout):
        dev0, host0 = layout.device[0][0], layout.host[0]
        ptrs = [t.data_ptr() for fields in layout.device for t in fields] + [h.data_ptr() for h in layout.host]
        self.word = next(w for w in (4, 2, 1) if all(r % w == 0 for r in layout.row_bytes)
                         and all(p % w == 0 for p in ptrs))
        dtype = _WORDS[self.word]
        self.dev_base = dev0.reshape(-1).view(dtype)
        self.host_base = host0.reshape(-1).view(dtype)
        rows = [r // self.word for r in layout.row_bytes]
        self.num_a = next((j for j, r in enumerate(rows) if r != rows[0]), len(rows))
        if any(r != rows[-1] for r in rows[self.num_a:]):
            raise ValueError(f"fields must be one row size, then at most one other, got rows of {rows} words")
        self.row_a, self.row_b = rows[0], rows[-1]
        dev_off = [(layout.device[layer][j].data_ptr() - dev0.data_ptr()) // self.word
                   for j in range(layout.num_fields) for layer in range(layout.num_layers)]
        host_off = [(h.data_ptr() - host0.data_ptr()) // self.word for h in layout.host]
        self.align = 16
        while self.align > 1 and any(o % self.align for o in dev_off + host_off):
            self.align //= 2
        self.dev_off = torch.tensor(dev_off, dtype=torch.int64, device=dev0.device)
        self.host_off = torch.tensor(host_off, dtype=torch.int64, device=dev0.device)


def _chunk(row_words: int, chunk_words: int) -> int:
    return min(triton.next_power_of_2(row_words), chunk_words)


def kv_swap_triton(layout: SwapLayout, host_blocks: torch.Tensor, device_blocks: torch.Tensor,
                   to_host: bool, chunk_bytes: Optional[int] = None, num_warps: int = 4) -> None:
    layout.check_indices(host_blocks, device_blocks)
    n = host_blocks.numel()
    if n == 0:
        return
    plan = layout._triton_plan
    if plan is None:
        plan = layout._triton_plan = _Plan(layout)
    chunk_words = triton.next_power_of_2(max(1, (chunk_bytes or DEFAULT_CHUNK_BYTES) // plan.word))
    chunk_a, chunk_b = _chunk(plan.row_a, chunk_words), _chunk(plan.row_b, chunk_words)
    grid = (n, layout.num_fields * layout.num_layers,
            max(triton.cdiv(plan.row_a, chunk_a), triton.cdiv(plan.row_b, chunk_b)))
    _kv_swap_kernel[grid](
        plan.dev_base, plan.host_base, plan.dev_off, plan.host_off, host_blocks, device_blocks,
        layout.num_layers, TO_HOST=to_host, NUM_A=plan.num_a, ROW_A=plan.row_a, ROW_B=plan.row_b,
        CHUNK_A=chunk_a, CHUNK_B=chunk_b, ALIGN=plan.align, num_warps=num_warps)
