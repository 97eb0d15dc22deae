"""The random rows' per-step columns on the device, in one launch: what the sampler's upload
carries, cast to the dtypes the draw reads, plus each row's Philox uniform.

Owns `random_columns(packed)`: from the sampler's float64 upload `[6, n]` (temperature, top_k,
top_p, min_p, then the seed's and the step's 64 bits as raw bits) it writes float32
temperature, top_p, min_p and 1 / temperature, int64 top_k, and the float64 uniform. In torch
that was the uniforms' launch plus five casts and a division, each a launch of its own
(~10-20 us of host time apiece on the H200's host inside the engine).

The uniform is the first of `random_stream.step_uniforms(seeds, steps)` per row:
`tl.randint4x` with the seed as key and the step as counter (the host stream's layout), 53
bits. The casts are torch's: float64 -> float32 rounds to nearest, float64 -> int64 truncates,
and 1 / temperature is the IEEE division. tests/kernels/test_sample_draw.py compares them with
torch and the host.

To extend: a new per-row column is one more row of the upload and one more store here.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 128  # rows per program


@triton.jit
def _uniform53(seed, step):
    """The first uniform in [0, 1) of Philox(key=seed, counter=step), float64."""
    a, b, _c, _d = tl.randint4x(seed, step)  # a key per lane: the seed broadcasts like the counter
    w0 = a.to(tl.uint32, bitcast=True).to(tl.uint64)
    w1 = b.to(tl.uint32, bitcast=True).to(tl.uint64)
    bits = (w0 << 21) | (w1 >> 11)  # 53 random bits, as `step_uniforms`
    return bits.to(tl.float64) * (2.0 ** -53)


@triton.jit(do_not_specialize=["n", "sr", "sc", "sf"])
def _columns_kernel(packed_ptr, bits_ptr, sr, sc, n, f32_ptr, sf, top_k_ptr, u_ptr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    col = i.to(tl.int64) * sc
    t = tl.load(packed_ptr + col, mask=mask, other=1.0).to(tl.float32)
    top_k = tl.load(packed_ptr + sr + col, mask=mask, other=0.0).to(tl.int64)
    top_p = tl.load(packed_ptr + 2 * sr + col, mask=mask, other=1.0).to(tl.float32)
    min_p = tl.load(packed_ptr + 3 * sr + col, mask=mask, other=0.0).to(tl.float32)
    seed = tl.load(bits_ptr + 4 * sr + col, mask=mask, other=0)
    step = tl.load(bits_ptr + 5 * sr + col, mask=mask, other=0)
    tl.store(f32_ptr + i, t, mask=mask)
    tl.store(f32_ptr + sf + i, top_p, mask=mask)
    tl.store(f32_ptr + 2 * sf + i, min_p, mask=mask)
    tl.store(f32_ptr + 3 * sf + i, tl.div_rn(tl.full(t.shape, 1.0, tl.float32), t), mask=mask)
    tl.store(top_k_ptr + i, top_k, mask=mask)
    tl.store(u_ptr + i, _uniform53(seed, step), mask=mask)


def random_columns(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(float32 [4, n]: temperature, top_p, min_p, 1 / temperature; int64 [n] top_k; float64 [n]
    uniform) from the float64 upload `packed` [6, n] (any strides; rows 4 and 5 hold the seed's
    and the step's int64 bits)."""
    n = packed.shape[1]
    dev = packed.device
    # Each float32 column starts 16 bytes aligned, whatever n: the draw's kernels take them as
    # pointers, and Triton specializes on that alignment (an odd start would compile a second
    # variant of each while serving).
    f32 = torch.empty(4, -(-n // 4) * 4, dtype=torch.float32, device=dev)[:, :n]
    top_k = torch.empty(n, dtype=torch.int64, device=dev)
    uniform = torch.empty(n, dtype=torch.float64, device=dev)
    if n:
        _columns_kernel[(triton.cdiv(n, _BLOCK),)](packed, packed.view(torch.int64), packed.stride(0),
                                                   packed.stride(1), n, f32, f32.stride(0), top_k, uniform,
                                                   BLOCK=_BLOCK, num_warps=4)
    return f32, top_k, uniform
