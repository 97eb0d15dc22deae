"""Projections with their next op in the epilogue (`kernels/proj_epilogue_triton.py`) against the
unfused composition: `F.linear` then `qkv_prep_ref`, and `F.linear` then `silu_and_mul_ref`."""

import pytest
import torch
import torch.nn.functional as F

from infer_cluster.kernels.activation import silu_and_mul_ref
from infer_cluster.kernels.proj_epilogue_triton import gate_up_silu_triton, qkv_proj_prep_triton
from infer_cluster.kernels.qkv_prep import qkv_prep_ref
from tests.kernels.conftest import tol
from tests.kernels.test_qkv_prep import _case, _run

K = 64


def _with_x(case, dtype, n, hq, hkv, d):
    """The case's qkv becomes `x @ w.T` for a fresh x and w (rounded like a stored projection)."""
    dev = case["qkv"].device
    x = torch.randn(n, K, device=dev).to(dtype)
    w = (torch.randn((hq + 2 * hkv) * d, K, device=dev) / K ** 0.5).to(dtype)
    case["qkv"] = F.linear(x.float(), w.float()).to(dtype)
    return x, w


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("n,block_m", [(7, 16), (37, 16)])
def test_qkv_proj_prep_matches_unfused(device, dtype, norm, int8, n, block_m):
    hq, hkv, d = 4, 2, 64
    case = _case(device, dtype, n, hq, hkv, d, norm, int8)
    x, w = _with_x(case, dtype, n, hq, hkv, d)
    ref = _run(qkv_prep_ref, case)

    def fused(qkv, **kw):
        return qkv_proj_prep_triton(x, w, **kw, cfg=(block_m, 32, 4, 2))

    got = _run(fused, case)
    _assert_close(got, ref, case, dtype)


def _assert_close(got, ref, case, dtype):
    """As test_qkv_prep's check, except that v is a GEMM output here too (summation order), and
    bf16 allows one ulp of the projection's outputs (~8: 0.0625), which the rotary's differences
    can carry into a small result (the interpreter truncates to bf16 where torch rounds)."""
    atol, rtol = tol(dtype) if dtype == torch.float32 else (0.0625, 4e-2)
    q, kc, vc, ks, vs = got
    rq, rkc, rvc, rks, rvs = ref
    torch.testing.assert_close(q, rq, atol=atol, rtol=rtol)
    if kc.dtype == torch.int8:
        # bf16: a code may follow the projection's last-ulp differences (two steps; three on the
        # interpreter, which truncates).
        steps = 1 if dtype == torch.float32 else 2 if kc.is_cuda else 3
        for c, rc in ((kc, rkc), (vc, rvc)):
            assert (c.int() - rc.int()).abs().max().item() <= steps
        for s, rs in ((ks, rks), (vs, rvs)):
            torch.testing.assert_close(s, rs, atol=1e-6, rtol=1e-4 if dtype == torch.float32 else 3e-2)
    else:
        torch.testing.assert_close(kc, rkc, atol=atol, rtol=rtol)
        torch.testing.assert_close(vc, rvc, atol=atol, rtol=rtol)
    # Padded tokens' slots are never named; every slot not written keeps the junk it started with.
    valid = case["slot_mapping"] >= 0
    written = torch.zeros(kc.shape[0] * kc.shape[1], dtype=torch.bool, device=kc.device)
    written[case["slot_mapping"][valid]] = True
    flat = lambda c: c.reshape(-1, *c.shape[2:])  # noqa: E731  [slots, hkv, d]
    for cache in (kc, vc):
        assert torch.equal(flat(cache)[~written], flat(case["k_cache"])[~written])


def test_qkv_proj_prep_rejects_bad_shapes(device):
    case = _case(device, torch.float32, 4, 4, 2, 64, False, False)
    x, w = _with_x(case, torch.float32, 4, 4, 2, 64)
    case.pop("qkv")
    with pytest.raises(ValueError, match="rows"):
        qkv_proj_prep_triton(x, w[:-64], **case)
    with pytest.raises(ValueError, match="multiple of block_k"):
        qkv_proj_prep_triton(x, w, **case, cfg=(16, 48, 4, 2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [5, 40])
def test_gate_up_silu_matches_unfused(device, dtype, n):
    inter = 96
    x = torch.randn(n, K, device=device).to(dtype)
    w = (torch.randn(2 * inter, K, device=device) / K ** 0.5).to(dtype)
    ref = silu_and_mul_ref(F.linear(x.float(), w.float()).to(dtype))
    got = gate_up_silu_triton(x, w, cfg=(16, 32, 4, 2), block_n=32)
    # bf16: gate, silu and product each round once; the interpreter truncates there instead.
    atol, rtol = tol(dtype) if dtype == torch.float32 else (0.0625, 4e-2)
    torch.testing.assert_close(got, ref, atol=atol, rtol=rtol)
    with pytest.raises(ValueError, match="multiple of block_n"):
        gate_up_silu_triton(x, w, block_n=64)
