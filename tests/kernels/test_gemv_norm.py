"""The small-batch linear with the fused residual add + RMSNorm prologue
(`rms_norm_linear_small*` in `kernels/gemv*.py`) against plain torch: the norm of `x + residual`
(rounded as `rms_norm_ref` rounds), then `F.linear`; the new residual written once and exactly.
CPU cases run under the interpreter on odd shapes; the `gpu` cases use the Qwen3-0.6B shapes,
the configs the dispatch picks, and a CUDA graph."""

import pytest
import torch
import torch.nn.functional as F

from infer_cluster.kernels import gemv
from infer_cluster.kernels.gemv_triton import GemvConfig, rms_norm_linear_small_triton
from infer_cluster.kernels.norm import rms_norm_ref
from tests.kernels.conftest import INTERPRET

CONFIGS = {
    "fma": GemvConfig(block_n=8, block_k=32),
    "fma_split": GemvConfig(block_n=4, block_k=64, split_k=2),
    "dot_split": GemvConfig(block_n=16, block_k=32, split_k=3, use_dot=True),
}


def _torch_ref(x, r, nw, eps, w, b):
    """Plain torch, written out (not through the project's references): the sum rounded to the
    activation dtype, the norm in float32 rounded back, the weight multiply in the dtype, then a
    float32 product rounded like the output."""
    h = x if r is None else (x.float() + r.float()).to(x.dtype)
    hf = h.float()
    normed = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    xin = (nw.float() * normed.float()).to(x.dtype)
    y = F.linear(xin.float(), w.float(), None if b is None else b.float()).to(x.dtype)
    return y, h, xin


def _inputs(device, dtype, m, n, k, residual, bias):
    x = 2 * torch.randn(m, k, device=device, dtype=dtype)
    r = torch.randn(m, k, device=device, dtype=dtype) if residual else None
    nw = (1 + 0.5 * torch.randn(k, device=device)).to(dtype)
    w = torch.randn(n, k, device=device, dtype=dtype) / k ** 0.5
    b = torch.randn(n, device=device, dtype=dtype) if bias else None
    return x, r, nw, w, b


def _check_close(y, h, x, r, nw, eps, w, b):
    y_ref, h_ref, xin = _torch_ref(x, r, nw, eps, w, b)
    if r is None:
        assert h is x  # the residual of the first layer is its input, not a copy
    else:
        # The sum is one rounding of exact float32 values: identical, bar the interpreter's bf16
        # conversion (truncating, not round-to-nearest: one bf16 ulp).
        exact = x.dtype == torch.float32 or not INTERPRET
        torch.testing.assert_close(h, h_ref, atol=0 if exact else 1e-2, rtol=0 if exact else 8e-3)
    if x.dtype == torch.float32:
        torch.testing.assert_close(y, y_ref, atol=1e-4, rtol=1e-4)
    else:
        # Three roundings of each input element to bf16 (sum, normed, weighted: 2^-8 relative
        # each, doubled for the interpreter's truncation) bound the error by their sum over K.
        bound = 6 * 2.0 ** -8 * (xin.float().abs() @ w.float().abs().t()) + 2e-2 * y_ref.float().abs() + 1e-2
        assert ((y.float() - y_ref.float()).abs() <= bound).all()


@pytest.mark.parametrize("cfg", list(CONFIGS), ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize("residual", [False, True])
def test_rms_norm_linear_small_matches_torch(device, cfg, dtype, m, residual):
    n, k = 37, 75  # neither a multiple of any tile
    x, r, nw, w, b = _inputs(device, dtype, m, n, k, residual, bias=cfg == "fma")
    before = (x.clone(), None if r is None else r.clone())
    y, h = rms_norm_linear_small_triton(x, r, nw, 1e-6, w, b, CONFIGS[cfg])
    assert y.shape == (m, n) and y.dtype == dtype and h.shape == (m, k)
    assert torch.equal(x, before[0]) and (r is None or torch.equal(r, before[1]))
    _check_close(y, h, x, r, nw, 1e-6, w, b)


@pytest.mark.parametrize("split_k", [1, 4])
def test_new_residual_is_written_by_first_column_block_only(device, split_k):
    # Many column blocks (N / block_n = 10), a K tail, split-K slices, and inputs that are row-
    # strided views: every element of the new residual is written (h is an uninitialised buffer).
    m, n, k = 3, 40, 100
    _, _, nw, w, _ = _inputs(device, torch.float32, m, n, k, True, False)
    x = torch.randn(m, k + 28, device=device)[:, 5:k + 5]
    r = torch.randn(m, k + 12, device=device)[:, :k]
    cfg = GemvConfig(block_n=4, block_k=16, split_k=split_k)
    y, h = rms_norm_linear_small_triton(x, r, nw, 1e-5, w, None, cfg)
    torch.testing.assert_close(h, x + r, atol=0, rtol=0)
    _check_close(y, h, x, r, nw, 1e-5, w, None)


def test_reference_matches_the_unfused_path(device):
    # The dispatch's reference is the project's add + RMSNorm then F.linear; the kernel agrees
    # with it (the same numbers the model computes on the unfused path).
    x, r, nw, w, b = _inputs(device, torch.float32, 3, 24, 64, True, True)
    y_ref, h_ref = gemv.rms_norm_linear_small_ref(x, r, nw, 1e-6, w, b)
    normed, h2 = rms_norm_ref(x, nw, 1e-6, r)
    torch.testing.assert_close(y_ref, F.linear(normed, w, b), atol=0, rtol=0)
    torch.testing.assert_close(h_ref, h2, atol=0, rtol=0)
    y, h = rms_norm_linear_small_triton(x, r, nw, 1e-6, w, b, CONFIGS["fma_split"])
    torch.testing.assert_close(y, y_ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(h, h_ref, atol=0, rtol=0)


def test_dispatch_falls_back_off_triton(monkeypatch):
    monkeypatch.setenv("INFER_CLUSTER_KERNELS", "torch")
    x, r, nw, w, b = _inputs("cpu", torch.float32, 2, 16, 32, True, False)
    y, h = gemv.rms_norm_linear_small(x, r, nw, 1e-6, w, b)
    y_ref, h_ref = gemv.rms_norm_linear_small_ref(x, r, nw, 1e-6, w, b)
    torch.testing.assert_close(y, y_ref, atol=0, rtol=0)
    torch.testing.assert_close(h, h_ref, atol=0, rtol=0)
    y, h = gemv.rms_norm_linear_small(x, None, nw, 1e-6, w, b)
    assert h is x


def test_norm_fuse_switch(monkeypatch):
    monkeypatch.delenv("INFER_CLUSTER_NORM_FUSE", raising=False)
    assert gemv.norm_fuse_enabled()
    for off in ("0", "off", "false"):
        monkeypatch.setenv("INFER_CLUSTER_NORM_FUSE", off)
        assert not gemv.norm_fuse_enabled()


def test_fused_config_is_the_tables():
    # Where the table chose cuBLAS the norm runs on its own: the heuristic there was slower.
    assert gemv.pick_config(4, 4096, 1024) is None  # qwen3-0.6b qkv at 4 rows: cuBLAS by 0.3 us
    assert gemv.fused_norm_config(4, 4096, 1024) is None
    assert gemv.fused_norm_config(4, 6144, 4096) is None  # llama-3-8b qkv at 4 rows
    assert gemv.fused_norm_config(1, 4096, 1024) == gemv.TUNED[(4096, 1024, 1)] is not None
    assert gemv.fused_norm_config(1, 151936, 1024) == gemv.pick_config(1, 151936, 1024)
    assert gemv.fused_norm_config(1, 200000, 1024, itemsize=4) is None


def test_fused_prologue_only_while_rows_times_k_is_small():
    # Every program re-reads all rows of h first: one row of the 8B shape (K = 4096) fuses; from 2
    # rows the norm runs apart (its GEMV then per the table: cuBLAS where it chose None), and
    # Qwen3-0.6B (K = 1024) would fuse up to 4 rows where the table has a GEMV.
    assert gemv.fused_norm_config(1, 4096, 1024) is not None   # qwen3-0.6b qkv, batch 1 (TPOT)
    assert gemv.fused_norm_config(1, 6144, 4096) is not None   # llama-3-8b qkv, batch 1
    assert gemv.fused_norm_config(1, 3072, 4096) is not None   # its T=2 shard
    assert gemv.fused_norm_config(16, 6144, 1024) is None      # qwen3-0.6b gate_up, 16 rows: tuned, not fused
    for m in (2, 4, 8, 16):
        assert m * 4096 > gemv.FUSED_NORM_MAX_ELEMS
        assert gemv.fused_norm_config(m, 3072, 4096) is None
        assert gemv.fused_norm_config(m, 14336, 4096) is None


def test_rejects_mismatched_norm_inputs():
    x, r, nw, w, _ = _inputs("cpu", torch.float32, 2, 8, 16, True, False)
    with pytest.raises(ValueError, match="norm weight"):
        rms_norm_linear_small_triton(x, r, nw[:8], 1e-6, w)
    with pytest.raises(ValueError, match="residual"):
        rms_norm_linear_small_triton(x, r.double(), nw, 1e-6, w)


def test_column_parallel_shards_fuse_the_full_norm(monkeypatch):
    # Tensor parallel: each rank's column-parallel qkv (with bias, GQA replicas) runs the norm of
    # the full hidden in its prologue; the ranks' outputs side by side are the unsharded layer's,
    # and each rank holds the same new residual. Column-parallel forwards run no collective.
    from infer_cluster.worker.models.parallel import ColumnParallelLinear, ParallelState
    monkeypatch.setenv("INFER_CLUSTER_KERNELS", "triton")
    hidden, sizes = 48, [32, 8, 8]
    torch.manual_seed(3)
    full_w, full_b = torch.randn(sum(sizes), hidden), torch.randn(sum(sizes))
    x, r, nw = torch.randn(3, hidden), torch.randn(3, hidden), 1 + 0.3 * torch.randn(hidden)

    def layer(rank, tp, fuse):
        monkeypatch.setenv("INFER_CLUSTER_NORM_FUSE", "1" if fuse else "0")
        col = ColumnParallelLinear(hidden, sizes, True, ParallelState(tp_rank=rank, tp_size=tp))
        for i, (w, b) in enumerate(zip(full_w.split(sizes), full_b.split(sizes))):
            col.load_shard(col.weight, w, i)
            col.load_shard(col.bias, b, i)
        return col

    want, want_res = layer(0, 1, False).forward_rms_norm(x, r, nw, 1e-6)
    torch.testing.assert_close(want_res, x + r, atol=0, rtol=0)
    shards = []
    for rank in range(2):
        col = layer(rank, 2, True)
        assert col.fuse_norm
        y, res = col.forward_rms_norm(x, r, nw, 1e-6)
        torch.testing.assert_close(res, want_res, atol=0, rtol=0)
        shards.append(y.split(col.shard_sizes, dim=1))
    got = torch.cat([torch.cat([s[i] for s in shards], dim=1) for i in range(3)], dim=1)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


QWEN3_SHAPES = {"qkv": (4096, 1024), "gate_up": (6144, 1024), "llama8b_qkv": (6144, 4096)}


@pytest.mark.parametrize("shape", list(QWEN3_SHAPES), ids=str)
@pytest.mark.parametrize("m", [1, 2, 4, 8, 16])
def test_gpu_picked_configs(gpu_device, shape, m):
    n, k = QWEN3_SHAPES[shape]
    x, r, nw, w, _ = _inputs(gpu_device, torch.bfloat16, m, n, k, True, False)
    y, h = gemv.rms_norm_linear_small(x, r, nw, 1e-6, w)
    _check_close(y, h, x, r, nw, 1e-6, w, None)


def test_gpu_cuda_graph(gpu_device):
    n, k = QWEN3_SHAPES["qkv"]
    x, r, nw, w, _ = _inputs(gpu_device, torch.bfloat16, 1, n, k, True, False)
    gemv.rms_norm_linear_small(x, r, nw, 1e-6, w)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y, h = gemv.rms_norm_linear_small(x, r, nw, 1e-6, w)
    x.copy_(torch.randn_like(x))
    r.copy_(torch.randn_like(r))
    graph.replay()
    torch.cuda.synchronize()
    _check_close(y, h, x, r, nw, 1e-6, w, None)
