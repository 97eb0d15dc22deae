"""The sampler's Philox stream (numpy, host) equals Triton's `tl.randint4x` for the same
(seed, offset), so a device kernel can draw the very numbers the host path draws."""

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from infer_cluster.worker.sampling.random_stream import philox4x32


@triton.jit
def _randint4x_kernel(out_ptr, offsets_ptr, seed, n):
    i = tl.arange(0, 16)
    mask = i < n
    off = tl.load(offsets_ptr + i, mask=mask, other=0)
    a, b, c, d = tl.randint4x(seed, off)
    tl.store(out_ptr + i * 4 + 0, a.to(tl.int64, bitcast=False) & 0xFFFFFFFF, mask=mask)
    tl.store(out_ptr + i * 4 + 1, b.to(tl.int64, bitcast=False) & 0xFFFFFFFF, mask=mask)
    tl.store(out_ptr + i * 4 + 2, c.to(tl.int64, bitcast=False) & 0xFFFFFFFF, mask=mask)
    tl.store(out_ptr + i * 4 + 3, d.to(tl.int64, bitcast=False) & 0xFFFFFFFF, mask=mask)


@pytest.mark.parametrize("seed", [0, 12345, 2**40 + 7])
def test_host_philox_equals_triton_randint4x(device, seed):
    offsets = torch.tensor([0, 1, 2, 7, 1000, 2**31 - 1, 2**33 + 5, 2**40], dtype=torch.int64, device=device)
    out = torch.zeros(len(offsets) * 4, dtype=torch.int64, device=device)
    _randint4x_kernel[(1,)](out, offsets, seed, len(offsets))
    off = offsets.cpu().numpy().astype(np.uint64)
    zero = np.zeros_like(off)
    mask = np.uint64(0xFFFFFFFF)
    want = philox4x32((off & mask, off >> np.uint64(32), zero, zero),
                      (np.full_like(off, seed & 0xFFFFFFFF), np.full_like(off, seed >> 32)))
    got = out.cpu().view(-1, 4).numpy()
    for lane in range(4):
        assert [int(v) for v in got[:, lane]] == [int(v) for v in want[lane]], lane
