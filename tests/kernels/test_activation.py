"""Triton SiLU-and-mul vs `silu_and_mul_ref`."""

import pytest
import torch

from infer_cluster.kernels.activation import silu_and_mul_ref
from infer_cluster.kernels.activation_triton import silu_and_mul_triton
from tests.kernels.conftest import tol


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 64), (7, 2 * 48), (33, 2 * 1100), (2, 3, 2 * 40)])
def test_silu_and_mul_matches_ref(device, dtype, shape):
    x = 3 * torch.randn(shape, device=device, dtype=dtype)
    x_before = x.clone()
    out = silu_and_mul_triton(x)
    ref = silu_and_mul_ref(x)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    atol, rtol = tol(dtype)
    torch.testing.assert_close(out, ref, atol=atol, rtol=rtol)
    assert torch.equal(x, x_before)


def test_silu_and_mul_strided_rows(device):
    # A column slice: rows are not contiguous with each other.
    base = torch.randn(5, 200, device=device)
    x = base[:, 10:10 + 2 * 64]
    torch.testing.assert_close(silu_and_mul_triton(x), silu_and_mul_ref(x), atol=1e-4, rtol=1e-4)


def test_silu_and_mul_empty_and_odd():
    assert silu_and_mul_triton(torch.zeros(0, 8)).shape == (0, 4)
    with pytest.raises(ValueError, match="even"):
        silu_and_mul_triton(torch.zeros(2, 7))
