"""Triton SiLU-and-mul: `silu(x[..., :d]) * x[..., d:]` in one pass over the gate/up output.

Owns: `silu_and_mul_triton`, the GPU twin of `silu_and_mul_ref`. Never modifies x.
Grid: (num_rows, cdiv(d, BLOCK)). Rounding follows the reference: silu is rounded to x's dtype
before the multiply (as `F.silu(a) * b` does), so bf16 results match it closely. To extend with
another gated activation, add a constexpr switch on the gate function here.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, d, sx_r, sx_c, so_r, so_c, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    gate = tl.load(x_ptr + row * sx_r + cols * sx_c, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * sx_r + (cols + d) * sx_c, mask=mask, other=0.0).to(tl.float32)
    act = gate / (1.0 + tl.exp(-gate))
    # Round the activation to the output dtype first: the reference materialises F.silu(gate).
    act = act.to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * so_r + cols * so_c, (act * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul_triton(x):
    if x.dim() == 0 or x.shape[-1] % 2:
        raise ValueError(f"last dim must be even (gate|up), got shape {tuple(x.shape)}")
    d = x.shape[-1] // 2
    out = torch.empty(*x.shape[:-1], d, dtype=x.dtype, device=x.device)
    x2 = x.reshape(-1, 2 * d)  # a view when possible; strides are passed, so no copy is forced
    out2 = out.view(-1, d)
    if x2.shape[0] == 0 or d == 0:
        return out
    block = min(triton.next_power_of_2(d), 1024)
    grid = (x2.shape[0], triton.cdiv(d, block))
    _silu_and_mul_kernel[grid](x2, out2, d, *x2.stride(), *out2.stride(), BLOCK=block)
    return out
