"""Triton RMSNorm (+ fused residual add) vs `rms_norm_ref`."""

import pytest
import torch

from infer_cluster.kernels.norm import rms_norm_ref
from infer_cluster.kernels.norm_triton import rms_norm_triton
from tests.kernels.conftest import tol


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 64), (7, 1024), (33, 80), (2, 3, 128)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_ref(device, dtype, shape, with_residual):
    x = torch.randn(shape, device=device, dtype=dtype)
    weight = 1 + 0.1 * torch.randn(shape[-1], device=device, dtype=dtype)
    residual = torch.randn_like(x) if with_residual else None
    x_before = x.clone()
    res_before = residual.clone() if with_residual else None
    got = rms_norm_triton(x, weight, 1e-6, residual)
    ref = rms_norm_ref(x, weight, 1e-6, residual)
    atol, rtol = tol(dtype)
    if with_residual:
        assert isinstance(got, tuple) and len(got) == 2
        torch.testing.assert_close(got[0], ref[0], atol=atol, rtol=rtol)
        torch.testing.assert_close(got[1], ref[1], atol=atol, rtol=rtol)
        assert torch.equal(residual, res_before)
    else:
        assert got.dtype == ref.dtype and got.shape == ref.shape
        torch.testing.assert_close(got, ref, atol=atol, rtol=rtol)
    assert torch.equal(x, x_before)


def test_rms_norm_float32_weight_promotes_like_ref(device):
    x = torch.randn(5, 96, device=device, dtype=torch.bfloat16)
    weight = torch.rand(96, device=device)
    got, ref = rms_norm_triton(x, weight, 1e-5), rms_norm_ref(x, weight, 1e-5)
    assert got.dtype == ref.dtype == torch.float32
    torch.testing.assert_close(got, ref, atol=2e-2, rtol=2e-2)


def test_rms_norm_strided_rows(device):
    base = torch.randn(6, 300, device=device)
    x = base[:, 7:7 + 128]
    weight = torch.randn(128, device=device)
    torch.testing.assert_close(rms_norm_triton(x, weight, 1e-6), rms_norm_ref(x, weight, 1e-6),
                               atol=1e-4, rtol=1e-4)


def test_rms_norm_rejects_bad_weight():
    with pytest.raises(ValueError, match="weight"):
        rms_norm_triton(torch.zeros(2, 8), torch.ones(4), 1e-6)


@pytest.mark.parametrize("splits,rows,rows_pad", [(2, 5, 64), (4, 64, 64), (3, 1, 64)])
def test_add_rms_norm_of_split_partials(device, splits, rows, rows_pad):
    """Split-K partial sums (kernels/gemm.py) beside a residual: the Triton kernel adds them in
    split order and rounds the sum to the residual's dtype, as the torch path does."""
    from infer_cluster.kernels.gemm import sum_partials
    from infer_cluster.kernels.norm import add_rms_norm
    from infer_cluster.kernels.norm_triton import add_rms_norm_partials_triton
    hidden = 96
    parts = torch.randn(splits, rows_pad, hidden, device=device)
    parts[:, rows:] = float("nan")  # padding rows are never read
    res = torch.randn(rows, hidden, device=device, dtype=torch.bfloat16)
    weight = 1 + 0.1 * torch.randn(hidden, device=device, dtype=torch.bfloat16)
    out, summed = add_rms_norm_partials_triton(parts, res, weight, 1e-6)
    total = parts[0, :rows].clone()
    for s in range(1, splits):
        total += parts[s, :rows]
    assert torch.equal(sum_partials(parts, rows), total)
    ref_out, ref_sum = rms_norm_ref(total.to(torch.bfloat16), weight, 1e-6, res)
    assert summed.dtype == torch.bfloat16 and out.shape == (rows, hidden)
    # (the interpreter's bf16 casts may differ from round-to-nearest by a unit in the last
    # place; the GPU test in test_gemm_gluon.py compares bit for bit)
    atol, rtol = tol(torch.bfloat16)
    torch.testing.assert_close(summed, ref_sum, atol=atol, rtol=rtol)
    torch.testing.assert_close(out, ref_out, atol=atol, rtol=rtol)
    # the dispatcher takes the same path for partials, and the reference path agrees with it
    got = add_rms_norm(parts, res, weight, 1e-6)
    torch.testing.assert_close(got[1], ref_sum, atol=atol, rtol=rtol)
    got_ref = add_rms_norm(parts, res, weight, 1e-6, norm=rms_norm_ref)
    torch.testing.assert_close(got_ref[0], ref_out, atol=0, rtol=0)


def test_add_rms_norm_partials_rejects_bad_shapes():
    from infer_cluster.kernels.norm_triton import add_rms_norm_partials_triton
    res, w = torch.zeros(8, 32, dtype=torch.bfloat16), torch.ones(32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="partials"):
        add_rms_norm_partials_triton(torch.zeros(2, 4, 32), res, w, 1e-6)  # fewer rows than res
    with pytest.raises(ValueError, match="partials"):
        add_rms_norm_partials_triton(torch.zeros(2, 8, 32, dtype=torch.bfloat16), res, w, 1e-6)
