"""The fused small-batch MLP (`kernels/mlp*.py`: add + RMSNorm, gate_up, SiLU * up, down in one
launch, float32 sums added with atomics) against plain torch written out here, and the fused-norm
GEMV taking those float32 sums as its input. CPU cases run under the interpreter on odd shapes;
the `gpu` cases use the Qwen3-0.6B shape, the launch the rule picks, and a CUDA graph."""

import pytest
import torch
import torch.nn.functional as F

from infer_cluster.kernels import mlp
from infer_cluster.kernels.gemv_triton import GemvConfig, rms_norm_linear_small_triton
from infer_cluster.kernels.mlp_triton import fused_mlp_small_triton
from tests.kernels.conftest import INTERPRET


def _torch_ref(x, r, nw, eps, wgu, wd):
    """Each rounding of the unfused path, written out: x rounded to the weights' dtype, the sum,
    the norm, the weight multiply, gate and up, silu(gate), the product; float32 dot products."""
    dt = wgu.dtype
    h = (x.to(dt).float() + r.float()).to(dt)
    hf = h.float()
    normed = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).to(dt)
    xin = (nw.float() * normed.float()).to(dt)
    gu = F.linear(xin.float(), wgu.float()).to(dt).float()
    inter = wd.shape[1]
    gate, up = gu[:, :inter], gu[:, inter:]
    act = (gate / (1 + torch.exp(-gate))).to(dt).float()
    a = (act * up).to(dt)
    return F.linear(a.float(), wd.float()), h, a


def _inputs(device, dtype, m, k, inter, x_float32=False):
    x = 2 * torch.randn(m, k, device=device, dtype=torch.float32 if x_float32 else dtype)
    r = torch.randn(m, k, device=device, dtype=dtype)
    nw = (1 + 0.5 * torch.randn(k, device=device)).to(dtype)
    wgu = (torch.randn(2 * inter, k, device=device) / k ** 0.5).to(dtype)
    wd = (torch.randn(k, inter, device=device) / inter ** 0.5).to(dtype)
    return x, r, nw, wgu, wd


def _check(acc, h, x, r, nw, wgu, wd, eps=1e-6):
    y_ref, h_ref, a = _torch_ref(x, r, nw, eps, wgu, wd)
    exact = wgu.dtype == torch.float32 or not INTERPRET  # the interpreter truncates to bf16
    torch.testing.assert_close(h, h_ref, atol=0 if exact else 1e-2, rtol=0 if exact else 8e-3)
    if wgu.dtype == torch.float32:
        torch.testing.assert_close(acc, y_ref, atol=1e-4, rtol=1e-4)
    else:
        # Each product's input went through up to six bf16 roundings on either side (doubled
        # for the interpreter's truncation): bounded by their sum over the intermediate width.
        bound = 12 * 2.0 ** -8 * (a.float().abs() @ wd.float().abs().t()) + 2e-2 * y_ref.abs() + 2e-2
        assert ((acc - y_ref).abs() <= bound).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("shape", [(64, 96, 16), (48, 40, 16), (75, 37, 8)], ids=str)
def test_fused_mlp_matches_torch(device, dtype, m, shape):
    k, inter, block_c = shape  # (48, 40): K and I off the tiles; (75, 37): neither a power of two
    x, r, nw, wgu, wd = _inputs(device, dtype, m, k, inter)
    acc = torch.zeros(m, k, device=device)
    zero = torch.full((m, k), 7.0, device=device)
    before = (x.clone(), r.clone())
    out, h = fused_mlp_small_triton(x, r, nw, 1e-6, wgu, wd, acc, zero, block_c=block_c, num_warps=4)
    assert out is acc and h.dtype == dtype and h.shape == (m, k)
    assert torch.equal(x, before[0]) and torch.equal(r, before[1])
    assert torch.count_nonzero(zero) == 0  # the other accumulator, zeroed for the next layer
    _check(acc, h, x, r, nw, wgu, wd)


def test_fused_mlp_without_residual(device):
    # A first layer's MLP would have no residual: x itself is normalised and returned as h.
    x, _, nw, wgu, wd = _inputs(device, torch.bfloat16, 2, 48, 40)
    acc = torch.zeros(2, 48, device=device)
    _, h = fused_mlp_small_triton(x, None, nw, 1e-6, wgu, wd, acc, block_c=16, num_warps=4)
    assert h is x
    _check(acc, h, x, torch.zeros_like(x), nw, wgu, wd)  # x + 0 == x: the same reference


def test_fused_mlp_adds_into_acc(device):
    # The sums are added to what acc holds (the caller zeroes it): twice gives twice.
    x, r, nw, wgu, wd = _inputs(device, torch.float32, 1, 32, 48)
    acc = torch.zeros(1, 32, device=device)
    fused_mlp_small_triton(x, r, nw, 1e-6, wgu, wd, acc, block_c=16, num_warps=4)
    once = acc.clone()
    fused_mlp_small_triton(x, r, nw, 1e-6, wgu, wd, acc, block_c=16, num_warps=4)
    torch.testing.assert_close(acc, 2 * once, atol=1e-5, rtol=1e-5)
    assert once.abs().max() > 0


def test_float32_sums_feed_the_next_layer(device):
    # Layer i's float32 sums are layer i+1's input: the fused MLP and the fused-norm GEMV round
    # them to bf16 first, exactly as if the down projection had stored bf16.
    x, r, nw, wgu, wd = _inputs(device, torch.bfloat16, 2, 64, 40, x_float32=True)
    if INTERPRET:  # its bf16 conversion truncates where torch's rounds: values bf16 holds exactly
        x = x.to(torch.bfloat16).float()
    acc = torch.zeros(2, 64, device=device)
    _, h = fused_mlp_small_triton(x, r, nw, 1e-6, wgu, wd, acc, block_c=16, num_warps=4)
    acc2 = torch.zeros(2, 64, device=device)
    _, h2 = fused_mlp_small_triton(x.to(torch.bfloat16), r, nw, 1e-6, wgu, wd, acc2, block_c=16,
                                   num_warps=4)
    assert torch.equal(h, h2)
    torch.testing.assert_close(acc, acc2, atol=1e-5, rtol=1e-5)
    w = (torch.randn(24, 64, device=device) / 8).to(torch.bfloat16)
    cfg = GemvConfig(block_n=8, block_k=32)
    y, hy = rms_norm_linear_small_triton(x, r, nw, 1e-6, w, None, cfg)
    y2, hy2 = rms_norm_linear_small_triton(x.to(torch.bfloat16), r, nw, 1e-6, w, None, cfg)
    assert y.dtype == torch.bfloat16 and hy.dtype == torch.bfloat16
    assert torch.equal(hy, hy2) and torch.equal(y, y2)


def test_bad_inputs_raise(device):
    x, r, nw, wgu, wd = _inputs(device, torch.bfloat16, 1, 32, 48)
    acc = torch.zeros(1, 32, device=device)
    with pytest.raises(ValueError, match="float32"):
        fused_mlp_small_triton(x, r, nw, 1e-6, wgu, wd, acc.to(torch.bfloat16))
    with pytest.raises(ValueError, match="weights must be"):
        fused_mlp_small_triton(x, r, nw, 1e-6, wgu[:10], wd, acc)
    with pytest.raises(ValueError, match="rows|inputs"):
        fused_mlp_small_triton(torch.zeros(5, 32, device=device, dtype=torch.bfloat16), None, nw,
                               1e-6, wgu, wd, torch.zeros(5, 32, device=device))
    with pytest.raises(ValueError, match="without a residual"):
        fused_mlp_small_triton(x.float(), None, nw, 1e-6, wgu, wd, acc)


def test_rule():
    assert mlp.fused_mlp_config(1, 1024, 3072) is not None  # Qwen3-0.6B batch 1: measured
    assert mlp.fused_mlp_config(2, 1024, 3072) is None
    assert mlp.fused_mlp_config(1, 4096, 14336) is None  # wider MLPs keep the GEMVs
    assert mlp.fused_mlp_config(0, 64, 96) is None


def test_dispatch_reference_matches_kernel(device):
    # fused_mlp_small off Triton (the plain-torch reference) and on it agree.
    x, r, nw, wgu, wd = _inputs(device, torch.float32, 1, 64, 96)
    acc_ref, acc = torch.zeros(1, 64, device=device), torch.zeros(1, 64, device=device)
    y, h = mlp.fused_mlp_ref(x, r, nw, 1e-6, wgu, wd)
    acc_ref.add_(y)
    fused_mlp_small_triton(x, r, nw, 1e-6, wgu, wd, acc, block_c=16, num_warps=4)
    torch.testing.assert_close(acc, acc_ref, atol=1e-4, rtol=1e-4)


def test_qwen3_shape_in_a_cuda_graph(gpu_device):
    m, k, inter = 1, 1024, 3072
    x, r, nw, wgu, wd = _inputs(gpu_device, torch.bfloat16, m, k, inter)
    block_c, warps = mlp.fused_mlp_config(m, k, inter)
    sums = torch.zeros(2, m, k, device=gpu_device)
    fused_mlp_small_triton(x, r, nw, 1e-6, wgu, wd, sums[0], sums[1], block_c, warps)  # compile
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        sums.zero_()
        out, h = fused_mlp_small_triton(x, r, nw, 1e-6, wgu, wd, sums[0], sums[1], block_c, warps)
    for _ in range(3):  # replays start from zeroed sums each time
        sums[1].fill_(3.0)
        g.replay()
        torch.cuda.synchronize()
        assert torch.count_nonzero(sums[1]) == 0
        _check(out, h, x, r, nw, wgu, wd)


def test_float32_sums_take_the_launches_measured_after_a_fused_mlp(monkeypatch):
    # The next layer's qkv and the LM head read the fused MLP's float32 sums. Measured in the
    # step (H200): the heuristic launch for the qkv and the LM head's norm apart beat the table's
    # bf16 rows there (TPOT 0.721 vs 0.732 ms), so float32 sums keep the float32 choice.
    from infer_cluster.kernels import gemv, gemv_triton
    seen = []
    monkeypatch.setenv("INFER_CLUSTER_KERNELS", "triton")
    monkeypatch.setattr(gemv_triton, "rms_norm_linear_small_triton",
                        lambda *a: seen.append(a[-1]) or (None, None))
    r, nw = torch.zeros(1, 1024, dtype=torch.bfloat16), torch.ones(1024, dtype=torch.bfloat16)
    qkv = torch.empty(4096, 1024, dtype=torch.bfloat16)
    gemv.rms_norm_linear_small(torch.zeros(1, 1024, dtype=torch.bfloat16), r, nw, 1e-6, qkv)
    gemv.rms_norm_linear_small(torch.zeros(1, 1024), r, nw, 1e-6, qkv)
    assert seen == [gemv.TUNED[(4096, 1024, 1)], gemv.heuristic_config(1, 4096, 1024)]
    assert gemv.fused_norm_config(1, 151936, 1024, itemsize=4) is None  # LM head: norm apart
