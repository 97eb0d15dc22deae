"""Small-batch linear (`kernels/gemv*.py`): Triton vs the `F.linear` reference, the fused SiLU
variant, the dispatch rule and the launch-config table. CPU cases run under the interpreter on
odd shapes; the `gpu` cases use the real Qwen3-0.6B shapes, one rank's Llama-3-8B shard at T=2 and a
CUDA graph."""

import pytest
import torch
import torch.nn.functional as F

from infer_cluster.kernels import gemv
from infer_cluster.kernels.activation import silu_and_mul_ref
from infer_cluster.kernels.gemv_triton import (MAX_M, GemvConfig, linear_small_triton,
                                               silu_mul_linear_small_triton)
from infer_cluster.kernels.gemv_tuned import TUNED
from tests.kernels.conftest import INTERPRET, tol

# One config per code path: CUDA-core products, tensor-core dot with split-K, masked K tail.
CONFIGS = {
    "fma": GemvConfig(block_n=8, block_k=32),
    "fma_split": GemvConfig(block_n=4, block_k=64, split_k=2),
    "dot_split": GemvConfig(block_n=16, block_k=32, split_k=3, use_dot=True),
}


def _ref(x, w, b=None):
    """float32 reference on the same (possibly bf16) values, rounded like the output."""
    return F.linear(x.float(), w.float(), None if b is None else b.float()).to(x.dtype)


@pytest.mark.parametrize("cfg", list(CONFIGS), ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_small_matches_ref(device, cfg, dtype, m, bias):
    n, k = 37, 75  # neither a multiple of any tile
    x = torch.randn(m, k, device=device, dtype=dtype)
    w = torch.randn(n, k, device=device, dtype=dtype)
    b = torch.randn(n, device=device, dtype=dtype) if bias else None
    out = linear_small_triton(x, w, b, CONFIGS[cfg])
    assert out.shape == (m, n) and out.dtype == dtype
    atol, rtol = tol(dtype)
    torch.testing.assert_close(out, _ref(x, w, b), atol=atol, rtol=rtol)


@pytest.mark.parametrize("cfg", ["fma", "dot_split"], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 3, 8])
def test_silu_mul_linear_small_matches_ref(device, cfg, dtype, m):
    n, inter = 29, 67
    gate_up = 3 * torch.randn(m, 2 * inter, device=device, dtype=dtype)
    w = torch.randn(n, inter, device=device, dtype=dtype)
    before = gate_up.clone()
    out = silu_mul_linear_small_triton(gate_up, w, CONFIGS[cfg])
    if dtype == torch.float32:
        torch.testing.assert_close(out, _ref(silu_and_mul_ref(gate_up), w), atol=1e-4, rtol=1e-4)
    else:
        # The kernel rounds silu(gate) and the product to bf16 as silu_and_mul_ref does; the
        # interpreter's bf16 rounding is not round-to-nearest, so bound the error instead: two
        # roundings of each activation (2 * 2^-8 relative) plus the output's own rounding.
        g, u = gate_up.float().chunk(2, dim=-1)
        act = F.silu(g) * u
        exact = F.linear(act, w.float())
        bound = 2 ** -7 * F.linear(act.abs(), w.float().abs()) + 2 ** -7 * exact.abs() + 1e-3
        assert ((out.float() - exact).abs() <= bound).all()
    assert torch.equal(gate_up, before)


def test_strided_input_rows(device):
    base = torch.randn(4, 100, device=device)
    x = base[:, 10:10 + 48]  # rows not contiguous with each other
    w = torch.randn(20, 48, device=device)
    torch.testing.assert_close(linear_small_triton(x, w, cfg=CONFIGS["fma"]), _ref(x, w),
                               atol=1e-4, rtol=1e-4)


def test_bad_inputs_raise():
    w = torch.zeros(8, 16)
    with pytest.raises(ValueError, match="at most"):
        linear_small_triton(torch.zeros(MAX_M + 1, 16), w)
    with pytest.raises(ValueError, match="width"):
        linear_small_triton(torch.zeros(2, 15), w)
    with pytest.raises(ValueError, match="dtype"):
        linear_small_triton(torch.zeros(2, 16, dtype=torch.bfloat16), w)
    with pytest.raises(ValueError, match="bias"):
        linear_small_triton(torch.zeros(2, 16), w, torch.zeros(7))
    with pytest.raises(ValueError, match="2 \\* I"):
        silu_mul_linear_small_triton(torch.zeros(2, 15), w)
    with pytest.raises(ValueError, match="power of two"):
        GemvConfig(block_n=12)
    with pytest.raises(ValueError, match="use_dot"):
        GemvConfig(block_n=8, use_dot=True)


def test_cpu_dispatch_is_the_reference(monkeypatch):
    # Without forcing, CPU tensors take F.linear itself: the CPU model path does not change.
    monkeypatch.delenv("INFER_CLUSTER_KERNELS", raising=False)
    x, w, b = torch.randn(3, 40), torch.randn(24, 40), torch.randn(24)
    assert torch.equal(gemv.linear_small(x, w, b), F.linear(x, w, b))
    gu = torch.randn(3, 80)
    assert torch.equal(gemv.silu_mul_linear_small(gu, w), gemv.silu_mul_linear_small_ref(gu, w))
    assert not gemv.use_small_path(True, x)


@pytest.mark.skipif(not INTERPRET, reason="forcing Triton on CPU tensors needs the interpreter")
def test_forced_triton_dispatch_reaches_kernel(monkeypatch):
    monkeypatch.setenv("INFER_CLUSTER_KERNELS", "triton")
    import infer_cluster.kernels.gemv_triton as gt
    calls = []
    real = gt.linear_small_triton
    monkeypatch.setattr(gt, "linear_small_triton", lambda *a: calls.append(a[3]) or real(*a))
    x, w = torch.randn(2, 40), torch.randn(24, 40)
    assert gemv.use_small_path(True, x) and not gemv.use_small_path(False, x)
    assert not gemv.use_small_path(True, torch.randn(gemv.GEMV_MAX_M + 1, 40))
    torch.testing.assert_close(gemv.linear_small(x, w), F.linear(x, w), atol=1e-4, rtol=1e-4)
    assert calls == [gemv.pick_config(2, 24, 40)]


@pytest.mark.parametrize("value,enabled", [(None, True), ("1", True), ("0", False), ("off", False)])
def test_env_switch(monkeypatch, value, enabled):
    if value is None:
        monkeypatch.delenv("INFER_CLUSTER_GEMV", raising=False)
    else:
        monkeypatch.setenv("INFER_CLUSTER_GEMV", value)
    assert gemv.gemv_enabled() is enabled


QWEN3 = {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072)}
LLAMA8B = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}


@pytest.mark.parametrize("m", [1, 2, 3, 4, 8, 16])
def test_configs_are_valid_for_served_shapes(m):
    for n, k in [*QWEN3.values(), *LLAMA8B.values(), (151936, 1024), (128256, 4096)]:
        cfg = gemv.pick_config(m, n, k)
        assert cfg is None or isinstance(cfg, GemvConfig)
    assert gemv.m_bucket(m) >= m
    for key, cfg in TUNED.items():
        assert len(key) == 3 and key[2] in (1, 2, 4, 8, 16)
        assert cfg is None or isinstance(cfg, GemvConfig)


LLAMA8B_TP2 = {"qkv": (3072, 4096), "o": (4096, 2048), "gate_up": (14336, 4096), "down": (4096, 7168),
               "lm_head": (64128, 4096)}  # one rank's shard at T=2 (its own entries in the table)


@pytest.mark.parametrize("m", [1, 2, 3, 4, 8, 16])
@pytest.mark.parametrize("name", list(QWEN3))
def test_qwen3_shapes_on_gpu(gpu_device, name, m):
    _check_shape_on_gpu(gpu_device, name, *QWEN3[name], m)


@pytest.mark.parametrize("m", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("name", list(LLAMA8B_TP2))
def test_llama_tp2_shard_shapes_on_gpu(gpu_device, name, m):
    _check_shape_on_gpu(gpu_device, name, *LLAMA8B_TP2[name], m)


def _check_shape_on_gpu(gpu_device, name, n, k, m):
    """The dispatched op (the table's config, or cuBLAS) against a float32 reference."""
    dt = torch.bfloat16
    w = torch.randn(n, k, device=gpu_device, dtype=dt) / k ** 0.5
    if name == "down":
        gate_up = torch.randn(m, 2 * k, device=gpu_device, dtype=dt)
        out = gemv.silu_mul_linear_small(gate_up, w)
        ref = _ref(silu_and_mul_ref(gate_up), w)
    else:
        x = torch.randn(m, k, device=gpu_device, dtype=dt)
        b = torch.randn(n, device=gpu_device, dtype=dt) if name == "qkv" else None
        out, ref = gemv.linear_small(x, w, b), _ref(x, w, b)
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("cfg", [GemvConfig(block_n=32, block_k=128, num_warps=8),
                                 GemvConfig(block_n=64, block_k=128, use_dot=True)], ids=["fma", "dot"])
def test_lm_head_shape_on_gpu(gpu_device, cfg):
    w = torch.randn(151936, 1024, device=gpu_device, dtype=torch.bfloat16) / 32
    x = torch.randn(4, 1024, device=gpu_device, dtype=torch.bfloat16)
    torch.testing.assert_close(linear_small_triton(x, w, cfg=cfg), _ref(x, w), atol=2e-2, rtol=2e-2)


def test_graph_replay_on_gpu(gpu_device):
    # The engine captures these kernels in CUDA graphs: a replay with new inputs must be right.
    w = torch.randn(1024, 3072, device=gpu_device, dtype=torch.bfloat16) / 55
    gate_up = torch.randn(4, 6144, device=gpu_device, dtype=torch.bfloat16)
    gemv.silu_mul_linear_small(gate_up, w)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gemv.silu_mul_linear_small(gate_up, w)
    gate_up.copy_(torch.randn_like(gate_up))
    graph.replay()
    torch.testing.assert_close(out, _ref(silu_and_mul_ref(gate_up), w), atol=2e-2, rtol=2e-2)


@pytest.mark.skipif(not INTERPRET, reason="forcing Triton on CPU tensors needs the interpreter")
def test_model_layers_take_the_small_path(monkeypatch):
    # The real layers (column/row parallel with bias, fused MLP, LM head) forced onto Triton agree
    # with the same layers built under INFER_CLUSTER_GEMV=0, and the small kernels really ran.
    from types import SimpleNamespace

    import infer_cluster.kernels.gemv_triton as gt
    from infer_cluster.worker.models.decoder import MLP
    from infer_cluster.worker.models.parallel import (ColumnParallelLinear, ParallelLMHead,
                                                      ParallelState, RowParallelLinear)
    monkeypatch.setenv("INFER_CLUSTER_KERNELS", "triton")
    calls = []
    for name in ("linear_small_triton", "silu_mul_linear_small_triton"):
        real = getattr(gt, name)
        monkeypatch.setattr(gt, name, lambda *a, _r=real, _n=name: calls.append(_n) or _r(*a))
    spec = SimpleNamespace(hidden_size=48, intermediate_size=40)

    def build(gemv_on):
        monkeypatch.setenv("INFER_CLUSTER_GEMV", "1" if gemv_on else "0")
        torch.manual_seed(1)
        ps = ParallelState()
        layers = [ColumnParallelLinear(48, [24, 8, 8], True, ps), RowParallelLinear(40, 48, True, ps),
                  MLP(spec, ps), ParallelLMHead(100, 48, ps)]
        for p in (p for layer in layers for p in layer.parameters()):
            p.data.normal_()
        return layers

    x, h = torch.randn(2, 48), torch.randn(2, 40)  # untuned shapes take the small path up to 2 rows
    outs = {}
    for gemv_on in (False, True):
        col, row, mlp, head = build(gemv_on)
        outs[gemv_on] = [col(x), row(h), mlp(x), head.logits(x)]
        assert calls == ([] if not gemv_on else ["linear_small_triton", "linear_small_triton",
                                                 "linear_small_triton", "silu_mul_linear_small_triton",
                                                 "linear_small_triton"])
    for got, ref in zip(outs[True], outs[False]):
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


from tests.kernels.conftest import sm90_check  # noqa: E402

SM90_GEMV_CHECK = sm90_check("gemv_picked_configs", """
from bench.ptxas_check import gemv_variants
from bench.sm90_build import compile_sm90, ptxas_info
for name, kernel, ptrs, ints, consts, opts, dns in gemv_variants():
    ptx = compile_sm90(kernel, ptrs, ints, consts, opts, dns).asm["ptx"]
    regs, spills = ptxas_info(ptx)
    print(name, spills, ptx.count("cp.async."), ptx.count("mma.sync"))
""")


def test_sm90_build_of_the_picked_configs(sm90_builds):
    """Every config `pick_config` gives the Qwen3-0.6B shapes compiles for an H100 ahead of time
    (no GPU needed; in a child process, as the interpreter cannot compile) without spills, with
    the K loop pipelined (cp.async) and the dot configs on tensor cores (mma)."""
    rows = [line.split() for line in sm90_builds.get(SM90_GEMV_CHECK).splitlines()]
    assert rows
    for *name, spills, cp_async, mma in rows:
        assert int(spills) == 0, name
        assert int(cp_async) > 0 or "s1" in name, name
        assert int(mma) > 0 or "dot" not in name, name


def test_tuned_table_is_for_two_byte_dtypes_only():
    """The H100 table's tiles were tuned for bf16; float32 (twice the shared memory per tile)
    takes the heuristic, which never asks for more than the GPU has."""
    from infer_cluster.kernels import gemv
    key = next(k for k, v in gemv.TUNED.items() if v is not None)
    n, k, m = key
    assert gemv.pick_config(m, n, k) == gemv.TUNED[key]
    assert gemv.pick_config(m, n, k, itemsize=4) == gemv.default_config(m, n, k)


def test_untuned_shapes_take_cublas_from_four_rows():
    """The heuristic serves untuned shapes up to 2 rows; from 4 rows they go to cuBLAS (None)."""
    from infer_cluster.kernels import gemv
    n, k = 5000, 3000  # in no table
    assert all((n, k, m) not in gemv.TUNED for m in (1, 2, 4, 8, 16))
    for m in (1, 2):
        assert gemv.pick_config(m, n, k) == gemv.heuristic_config(m, n, k) is not None
    for m in (3, 4, 8, 16):
        assert gemv.pick_config(m, n, k) is None
        assert gemv.heuristic_config(m, n, k) is not None  # the heuristic itself covers 16 rows


def test_llama_tp2_shard_shapes_are_tuned():
    from infer_cluster.kernels import gemv
    for n, k in [(3072, 4096), (4096, 2048), (14336, 4096), (4096, 7168), (64128, 4096)]:
        assert all((n, k, m) in gemv.TUNED for m in (1, 2, 4, 8, 16)), (n, k)
    assert gemv.pick_config(16, 14336, 4096) is None  # gate_up shard at 16 rows: cuBLAS won


def test_tuned_table_is_for_the_gpu_it_was_tuned_on():
    from infer_cluster.kernels import gemv
    key = next(k for k, v in gemv.TUNED.items() if v is not None)
    n, k, m = key
    assert gemv.pick_config(m, n, k, hopper=False) == gemv.default_config(m, n, k)
