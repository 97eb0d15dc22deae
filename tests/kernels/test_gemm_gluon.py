"""The Gluon mid-size GEMM (kernels/gemm_gluon.py) and its dispatch (kernels/gemm.py): the sm_90
build (no GPU: ahead-of-time compile in a child), the table's rules, and on a Hopper GPU its
outputs against cuBLAS, ragged rows, and chained PDL launches in a graph."""

import pytest
import torch
import torch.nn.functional as F

from infer_cluster.kernels.activation import silu_and_mul, silu_and_mul_ref
from infer_cluster.kernels.gemm import MID_MAX_M, gemm_config, linear_mid, mid_path, silu_linear_mid
from infer_cluster.kernels.gemm_gluon import GemmConfig
from tests.kernels.conftest import sm90_check

BUILD = sm90_check("gemm_build", """
import re
from bench.ptxas_gluon import gemm_variants
from bench.sm90_build import compile_sm90, ptxas_report
for name, kernel, ptrs, ints, consts, opts, dns in gemm_variants():
    c = compile_sm90(kernel, ptrs, ints, consts, opts, dns)
    r = ptxas_report(c.asm["ptx"])
    regs, spills, serial = r["regs"], r["spills"], int(r["wgmma_serialized"])
    lines = [l.strip() for l in c.asm["ptx"].splitlines()]
    wait = next(i for i, l in enumerate(lines) if l.startswith("griddepcontrol.wait"))
    # TMA loads (global to shared: `shared::cta.global` from Triton 3.7, `shared::cluster.global`
    # before it) before the wait, by descriptor argument: weights (param 1) vs x (param 0)
    tma = [(i, l) for i, l in enumerate(lines) if l.startswith("@") and "cp.async.bulk.tensor" in l
           and re.search(r"[.]shared::[a-z]+[.]global", l)]
    before = sum(i < wait for i, _ in tma)
    wgmma = sum("wgmma.mma_async" in l for l in lines)
    print(int(consts["SILU"]), consts["STAGES"], regs, spills, c.metadata.shared, before, wgmma, serial)
""")


def test_sm90_build_prefetches_only_weights_before_the_wait(sm90_builds):
    rows = [tuple(map(int, line.split())) for line in sm90_builds.get(BUILD).splitlines()]
    assert sorted(r[0] for r in rows) == [0, 0, 0, 0, 1]
    for silu, stages, regs, spills, shared, before_wait, wgmma, serialized in rows:
        assert spills == 0 and regs <= 255, (regs, spills)
        assert shared <= 227 * 1024
        # the first STAGES weight tiles (gate and up with SILU) are issued before
        # griddepcontrol.wait, x's after it
        assert before_wait == stages * (2 if silu else 1), before_wait
        assert wgmma > 0 and not serialized, "ptxas serialized the warpgroup MMAs"


def test_config_fits_and_programs():
    cfg = GemmConfig(block_n=128, block_k=64, stages=4)
    assert cfg.fits(256, 1024, 2048) and cfg.fits(17, 1024, 2048)
    assert not cfg.fits(256, 1000, 2048) and not cfg.fits(256, 1024, 2000) and not cfg.fits(0, 1024, 2048)
    assert cfg.programs(256, 1024) == 4 * 8 and cfg.programs(65, 1024) == 2 * 8
    assert cfg.shared_bytes() == 4 * (64 + 128) * 64 * 2 + 64 * 128 * 2  # the ring, the output tile
    split = GemmConfig(block_n=64, block_k=128, stages=6, splits=4)
    assert split.fits(64, 1024, 3072) and split.fits(256, 1024, 2048)
    assert not split.fits(64, 1024, 1152)  # 9 K steps of 128 do not split 4 ways
    assert split.programs(256, 1024) == 4 * 16  # tiles; the splits are the grid's second axis
    assert split.shared_bytes() == 6 * (64 + 64) * 128 * 2 + 64 * 64 * 4  # a float32 output tile


def test_cpu_and_small_inputs_stay_on_torch():
    x, w = torch.randn(64, 128), torch.randn(256, 128)
    assert not mid_path(True, x, w)  # CPU
    # without a table entry (or tiles) linear_mid is F.linear exactly
    assert gemm_config(64, 256, 128) is None and gemm_config(64, 256, 128, silu=True) is None
    assert torch.equal(linear_mid(x, w), F.linear(x, w))
    assert torch.equal(silu_linear_mid(x, w), silu_and_mul_ref(F.linear(x, w)))


def _sm90(gpu_device):
    if torch.cuda.get_device_capability(gpu_device)[0] != 9:
        pytest.skip("the Gluon GEMM is built for sm_90 (Hopper)")


@pytest.mark.parametrize("m", [17, 64, 100, 256])
@pytest.mark.parametrize("n,k,bn,bk,stages", [(4096, 1024, 128, 64, 6), (1024, 2048, 64, 128, 4),
                                              (1024, 3072, 64, 64, 8), (6144, 1024, 256, 64, 3),
                                              (2048, 128, 64, 64, 4)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_matches_cublas(gpu_device, m, n, k, bn, bk, stages, dtype):
    _sm90(gpu_device)
    from infer_cluster.kernels.gemm_gluon import gemm_sm90
    g = torch.Generator(device=gpu_device).manual_seed(m * 7 + n)
    x = torch.randn(m, k, device=gpu_device, dtype=dtype, generator=g)
    w = torch.randn(n, k, device=gpu_device, dtype=dtype, generator=g) / k ** 0.5
    cfg = GemmConfig(block_n=bn, block_k=bk, stages=stages)  # (2048, 128): fewer steps than stages
    ref = x.float() @ w.float().T
    for pdl in (False, True):
        out = gemm_sm90(x, w, cfg, pdl=pdl)
        assert out.shape == (m, n) and out.dtype == dtype
        torch.testing.assert_close(out.float(), ref, atol=3e-2, rtol=2e-2)


@pytest.mark.parametrize("m", [17, 64, 200])
@pytest.mark.parametrize("inter,k,bn,bk,stages", [(3072, 1024, 64, 128, 4), (1536, 1024, 128, 64, 3),
                                                  (256, 576, 64, 64, 4)])
def test_gpu_silu_epilogue_equals_gemm_then_silu_kernel(gpu_device, m, inter, k, bn, bk, stages):
    _sm90(gpu_device)
    from infer_cluster.kernels.gemm_gluon import gemm_sm90
    x = torch.randn(m, k, device=gpu_device, dtype=torch.bfloat16)
    w = torch.randn(2 * inter, k, device=gpu_device, dtype=torch.bfloat16) / k ** 0.5
    cfg = GemmConfig(block_n=bn, block_k=bk, stages=stages)
    fused = gemm_sm90(x, w, cfg, silu=True)
    assert fused.shape == (m, inter)
    # the same tiles accumulate in the same order, and the epilogue rounds as the SiLU kernel
    assert torch.equal(fused, silu_and_mul(gemm_sm90(x, w, cfg)))
    torch.testing.assert_close(fused.float(), silu_and_mul_ref(F.linear(x, w)).float(), atol=3e-2,
                               rtol=2e-2)


@pytest.mark.parametrize("m", [17, 64, 100, 256])
@pytest.mark.parametrize("n,k,bn,bk,stages,splits", [(1024, 3072, 64, 128, 6, 4), (1024, 2048, 64, 128, 4, 2),
                                                     (1024, 2048, 128, 64, 4, 8), (512, 384, 64, 64, 2, 3)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_split_partials_add_up_to_the_product(gpu_device, m, n, k, bn, bk, stages, splits, dtype):
    _sm90(gpu_device)
    from infer_cluster.kernels.gemm import is_partials, sum_partials
    from infer_cluster.kernels.gemm_gluon import gemm_sm90
    g = torch.Generator(device=gpu_device).manual_seed(m * 5 + splits)
    x = torch.randn(m, k, device=gpu_device, dtype=dtype, generator=g)
    w = torch.randn(n, k, device=gpu_device, dtype=dtype, generator=g) / k ** 0.5
    cfg = GemmConfig(block_n=bn, block_k=bk, stages=stages, splits=splits)
    ref = x.float() @ w.float().T
    for pdl in (False, True):
        parts = gemm_sm90(x, w, cfg, pdl=pdl, partials=True)
        rows_pad = -(-m // 64) * 64
        assert is_partials(parts) and parts.shape == (splits, rows_pad, n)
        assert torch.equal(parts[:, m:], torch.zeros_like(parts[:, m:]))  # x's rows past M read as 0
        torch.testing.assert_close(sum_partials(parts, m), ref, atol=2e-3, rtol=2e-3)
    # a caller not taking partials gets the unsplit product in x's dtype
    plain = gemm_sm90(x, w, cfg, partials=False)
    assert plain.shape == (m, n) and plain.dtype == dtype
    torch.testing.assert_close(plain.float(), ref, atol=3e-2, rtol=2e-2)


@pytest.mark.parametrize("m", [17, 200])
def test_gpu_add_rms_norm_of_partials_equals_norm_of_their_rounded_sum(gpu_device, m):
    """The norm kernel adds the splits in order and rounds as the GEMM's output would be
    rounded: equal bit for bit to the unfused path fed that sum."""
    _sm90(gpu_device)
    from infer_cluster.kernels.gemm import sum_partials
    from infer_cluster.kernels.gemm_gluon import gemm_sm90
    from infer_cluster.kernels.norm import add_rms_norm
    x = torch.randn(m, 3072, device=gpu_device, dtype=torch.bfloat16)
    w = torch.randn(1024, 3072, device=gpu_device, dtype=torch.bfloat16) / 55
    res = torch.randn(m, 1024, device=gpu_device, dtype=torch.bfloat16)
    nw = 1 + 0.1 * torch.randn(1024, device=gpu_device, dtype=torch.bfloat16)
    parts = gemm_sm90(x, w, GemmConfig(block_n=64, block_k=128, stages=6, splits=4), partials=True)
    out, summed = add_rms_norm(parts, res, nw, 1e-6)
    ref_out, ref_sum = add_rms_norm(sum_partials(parts, m).to(torch.bfloat16), res, nw, 1e-6)
    assert torch.equal(summed, ref_sum) and torch.equal(out, ref_out)


def test_gpu_graph_of_pdl_launches_matches_eager(gpu_device):
    _sm90(gpu_device)
    from infer_cluster.kernels.gemm_gluon import gemm_sm90
    cfg1 = GemmConfig(block_n=128, block_k=64, stages=4)
    cfg2 = GemmConfig(block_n=64, block_k=128, stages=4)
    x = torch.randn(200, 1024, device=gpu_device, dtype=torch.bfloat16)
    w1 = torch.randn(2048, 1024, device=gpu_device, dtype=torch.bfloat16) / 32
    w2 = torch.randn(1024, 2048, device=gpu_device, dtype=torch.bfloat16) / 45

    def chain():  # each GEMM reads what the one before wrote: PDL must wait for it
        h = gemm_sm90(x, w1, cfg1)
        return gemm_sm90(h, w2, cfg2)
    eager = chain()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain()
    for _ in range(3):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)
    ref = F.linear(F.linear(x, w1), w2)
    torch.testing.assert_close(out.float(), ref.float(), atol=5e-2, rtol=3e-2)


def test_gpu_mid_path_rule(gpu_device, monkeypatch):
    from infer_cluster.kernels import gemm_table
    monkeypatch.setitem(gemm_table.TABLE, (256, 128, 1), GemmConfig(block_n=64, block_k=64, stages=2))
    monkeypatch.setitem(gemm_table.TABLE, (256, 128, 1, "silu"), GemmConfig(block_n=64, block_k=64, stages=2))
    w = torch.randn(256, 128, device=gpu_device, dtype=torch.bfloat16)
    hopper = torch.cuda.get_device_capability(gpu_device)[0] == 9
    x = torch.randn(32, 128, device=gpu_device, dtype=torch.bfloat16)
    assert mid_path(True, x, w) == hopper
    assert mid_path(True, x, w, silu=True) == hopper
    if hopper:
        torch.testing.assert_close(linear_mid(x, w).float(), F.linear(x, w).float(), atol=3e-2, rtol=2e-2)
        torch.testing.assert_close(silu_linear_mid(x, w).float(), silu_and_mul_ref(F.linear(x, w)).float(),
                                   atol=3e-2, rtol=2e-2)
    assert not mid_path(False, x, w)
    assert not mid_path(True, torch.randn(16, 128, device=gpu_device, dtype=torch.bfloat16), w)
    assert not mid_path(True, torch.randn(65, 128, device=gpu_device, dtype=torch.bfloat16), w)  # no entry
    assert not mid_path(True, torch.randn(MID_MAX_M + 1, 128, device=gpu_device, dtype=torch.bfloat16), w)
    assert not mid_path(True, x.float(), w.float())
