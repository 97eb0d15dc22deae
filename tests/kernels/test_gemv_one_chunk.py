"""The small-batch linear's one-chunk build (on by default, `INFER_CLUSTER_GEMV_ONE_CHUNK=0`
turns it off; `kernels/gemv_triton.py`): a CUDA-core launch whose K slice is a single BLOCK_K
chunk compiles without the chunk loop. It must agree with the general build (the same products;
on the GPU the float32 sum across lanes may be added in another order, so float32 results agree
to rounding, and the H100 gave equal bf16 bits) for the plain, fused-SiLU and fused-norm
kernels, split-K and a masked K tail; it must be
taken exactly where the slice is one chunk; and its sm_90 build must use fewer registers than
the general one without spilling (the point of it: more programs per SM). CPU cases run under
the interpreter; the `gpu` case uses the Qwen3-0.6B batch-1 configs the table picks."""

import pytest
import torch
import torch.nn.functional as F

from infer_cluster.kernels import gemv_triton
from infer_cluster.kernels.gemv import pick_config
from infer_cluster.kernels.gemv_triton import (GemvConfig, linear_small_triton,
                                               rms_norm_linear_small_triton,
                                               silu_mul_linear_small_triton)
from tests.kernels.conftest import tol

ENV = "INFER_CLUSTER_GEMV_ONE_CHUNK"
# (n, k, config, one chunk?): K in one chunk; split-K whose splits are one chunk each; a K tail
# masked inside the one chunk; two chunks (the general path, whatever the switch says).
CASES = {
    "one": (24, 64, GemvConfig(block_n=8, block_k=64), True),
    "split_one": (20, 128, GemvConfig(block_n=4, block_k=64, split_k=2), True),
    "tail": (16, 50, GemvConfig(block_n=4, block_k=64), True),
    "two_chunks": (16, 128, GemvConfig(block_n=4, block_k=64), False),
}


class _Recorder:
    """Wraps the Triton kernel: records each launch's ONE_CHUNK, then launches the real one."""

    def __init__(self, kernel):
        self.kernel, self.seen = kernel, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.seen.append(kwargs["ONE_CHUNK"])
            return self.kernel[grid](*args, **kwargs)
        return launch


def _same(off, on):
    """The general and one-chunk builds agree: float32 sums to rounding (lane order may differ
    on the GPU), bf16 within one rounding of those sums."""
    if off.dtype == torch.float32:
        torch.testing.assert_close(on, off, rtol=1e-5, atol=1e-6)
    else:
        torch.testing.assert_close(on.float(), off.float(), rtol=2 ** -7, atol=1e-3)


def _run_both(monkeypatch, fn):
    """fn() with the switch off, then on: both results and what each launch compiled."""
    recorder = _Recorder(gemv_triton._gemv_kernel)
    monkeypatch.setattr(gemv_triton, "_gemv_kernel", recorder)
    out = {}
    for value in ("0", "1"):
        monkeypatch.setenv(ENV, value)
        out[value] = fn()
    return out["0"], out["1"], recorder.seen


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 3])
def test_one_chunk_build_gives_the_agrees(device, monkeypatch, case, dtype, m):
    n, k, cfg, one = CASES[case]
    x = torch.randn(m, k, device=device, dtype=dtype)
    w = torch.randn(n, k, device=device, dtype=dtype) / k ** 0.5
    b = torch.randn(n, device=device, dtype=dtype)
    off, on, seen = _run_both(monkeypatch, lambda: linear_small_triton(x, w, b, cfg))
    assert seen == [False, one]
    _same(off, on)
    ref = F.linear(x.float(), w.float(), b.float()).to(dtype)
    atol, rtol = tol(dtype)
    torch.testing.assert_close(on, ref, atol=atol, rtol=rtol)


@pytest.mark.parametrize("case", ["one", "tail", "two_chunks"])
def test_fused_silu_one_chunk_gives_the_agrees(device, monkeypatch, case):
    n, k, cfg, one = CASES[case]
    gate_up = torch.randn(2, 2 * k, device=device, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=device, dtype=torch.bfloat16) / k ** 0.5
    off, on, seen = _run_both(monkeypatch, lambda: silu_mul_linear_small_triton(gate_up, w, cfg))
    assert seen == [False, one]
    _same(off, on)


@pytest.mark.parametrize("case", ["one", "split_one", "tail"])
@pytest.mark.parametrize("residual", [False, True])
def test_fused_norm_one_chunk_gives_the_agrees(device, monkeypatch, case, residual):
    n, k, cfg, one = CASES[case]
    x = torch.randn(1, k, device=device, dtype=torch.bfloat16)
    r = torch.randn(1, k, device=device, dtype=torch.bfloat16) if residual else None
    nw = (1 + 0.5 * torch.randn(k, device=device)).to(torch.bfloat16)
    w = torch.randn(n, k, device=device, dtype=torch.bfloat16) / k ** 0.5
    (y_off, h_off), (y_on, h_on), seen = _run_both(
        monkeypatch, lambda: rms_norm_linear_small_triton(x, r, nw, 1e-6, w, None, cfg))
    assert seen == [False, one]
    _same(y_off, y_on)
    assert torch.equal(h_off, h_on)  # x + residual: one add, whatever the build


def test_the_dot_path_never_takes_it(device, monkeypatch):
    cfg = GemvConfig(block_n=16, block_k=64, use_dot=True)
    x = torch.randn(2, 64, device=device)
    w = torch.randn(32, 64, device=device)
    off, on, seen = _run_both(monkeypatch, lambda: linear_small_triton(x, w, None, cfg))
    assert seen == [False, False] and torch.equal(off, on)  # the same build twice


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", [(4096, 1024), (6144, 1024), (1024, 2048)])
def test_qwen3_batch1_shapes_on_gpu(gpu_device, monkeypatch, n, k):
    cfg = pick_config(1, n, k)
    assert cfg is not None and not cfg.use_dot
    x = torch.randn(1, k, device=gpu_device, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=gpu_device, dtype=torch.bfloat16) / k ** 0.5
    off, on, seen = _run_both(monkeypatch, lambda: linear_small_triton(x, w, None, cfg))
    assert seen == [False, True]
    _same(off, on)


from tests.kernels.conftest import sm90_check  # noqa: E402

SM90_REGISTERS = sm90_check("gemv_one_chunk_registers", """
from bench.sm90_build import compile_sm90, ptxas_info
from infer_cluster.kernels.gemv_triton import _gemv_kernel
# qkv / gate_up of the Qwen3-0.6B shape at one row, fused norm, the table's 4 x 1024 tile
ints = dict(M=1, N=6144, K=1024, k_per_split=1024, sxm=1024, swn=1024, som=6144, sos=0, srm=1024,
            shm=1024)
ptrs = dict(x_ptr="*bf16", w_ptr="*bf16", b_ptr="*bf16", out_ptr="*bf16", r_ptr="*bf16",
            nw_ptr="*bf16", h_ptr="*bf16")
for one in (False, True):
    consts = dict(HAS_BIAS=False, SILU_MUL=False, NORM=True, HAS_RES=True, PARTIAL=False,
                  USE_DOT=False, DOT_F32=False, EVEN_K=True, STAGES=1, BLOCK_M=1, BLOCK_N=4,
                  BLOCK_K=1024, NORM_BLOCK=1024, PDL=True, ONE_CHUNK=one)
    ptx = compile_sm90(_gemv_kernel, ptrs, ints, consts, dict(num_warps=4, num_stages=1), ()).asm["ptx"]
    print(one, *ptxas_info(ptx))
""")


def test_sm90_one_chunk_build_uses_fewer_registers(sm90_builds):
    """The reason for the build (no GPU needed: Triton's bundled ptxas). The 4 x 1024 fused-norm
    tile took 71 registers, 7 programs of 4 warps per SM: gate_up's 1,536 programs were 1.66
    waves. With the one-chunk build it took 40 (12 per SM, one wave) on triton 3.7.1."""
    rows = {one: (int(regs), int(spills)) for one, regs, spills in
            (line.split() for line in sm90_builds.get(SM90_REGISTERS).splitlines())}
    (general, general_spills), (one_chunk, one_spills) = rows["False"], rows["True"]
    assert general_spills == 0 and one_spills == 0
    assert one_chunk < general, rows
