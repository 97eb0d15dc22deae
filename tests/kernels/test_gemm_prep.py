"""The qkv GEMM with the attention prep in its epilogue (kernels/gemm_prep_gluon.py) and its
dispatch (`kernels.gemm.prep_linear_mid`): the sm_90 build (no GPU), the rules, and on a Hopper
GPU its q and cache writes against the same GEMM followed by `qkv_prep`, padded slots untouched,
PDL in a graph, and a Qwen3-0.6B-shape engine's greedy tokens with and without it."""

import pytest
import torch
import torch.nn.functional as F

from infer_cluster.kernels import build_rope_cache
from infer_cluster.kernels.gemm import gemm_config, mid_path, prep_linear_mid
from infer_cluster.kernels.gemm_gluon import GemmConfig
from infer_cluster.kernels.gemm_prep_gluon import prep_supported
from infer_cluster.kernels.qkv_prep import qkv_prep_ref
from tests.kernels.conftest import sm90_check

BLOCK_SIZE, MAX_POS = 16, 4096

BUILD = sm90_check("gemm_prep_build", """
import re
from bench.ptxas_gluon import gemm_prep_variants
from bench.sm90_build import compile_sm90, ptxas_report
for name, kernel, ptrs, ints, consts, opts, dns in gemm_prep_variants():
    c = compile_sm90(kernel, ptrs, ints, consts, opts, dns)
    r = ptxas_report(c.asm["ptx"])
    lines = [l.strip() for l in c.asm["ptx"].splitlines()]
    wait = next(i for i, l in enumerate(lines) if l.startswith("griddepcontrol.wait"))
    tma = [i for i, l in enumerate(lines) if l.startswith("@") and "cp.async.bulk.tensor" in l
           and re.search(r"[.]shared::[a-z]+[.]global", l)]
    fma = sum(l.startswith("fma.rn.f32") for l in lines)
    print(consts["STAGES"], r["regs"], r["spills"], int(r["wgmma_serialized"]), c.metadata.shared,
          sum(i < wait for i in tma), fma)
""")


def test_sm90_build(sm90_builds):
    rows = [tuple(map(int, line.split())) for line in sm90_builds.get(BUILD).splitlines()]
    assert len(rows) == 3
    for stages, regs, spills, serialized, shared, before_wait, fma in rows:
        assert spills == 0 and regs <= 255 and not serialized, (regs, spills, serialized)
        assert shared <= 227 * 1024
        assert before_wait == stages  # only the weight tiles are requested before the PDL wait
        assert fma == 0  # no contraction: the epilogue rounds as the separate kernels do


def test_rules():
    assert prep_supported(GemmConfig(block_n=128, block_k=128, stages=4), 128)
    assert not prep_supported(GemmConfig(block_n=64, block_k=128, stages=4), 128)  # half a head a tile
    assert not prep_supported(GemmConfig(block_n=128, block_k=128, stages=4, splits=2), 128)
    # a prep row is found only under its own key, and only where it holds one head a tile
    from infer_cluster.kernels import gemm_table
    cfg = GemmConfig(block_n=128, block_k=64, stages=4)
    saved = dict(gemm_table.TABLE)
    try:
        gemm_table.TABLE[(4096, 1024, 1, "prep")] = cfg
        assert gemm_config(64, 4096, 1024, prep_head_dim=128) == cfg
        assert gemm_config(64, 4096, 1024, prep_head_dim=64) is None
        assert gemm_config(65, 4096, 1024, prep_head_dim=128) == saved.get((4096, 1024, 2, "prep"))
    finally:
        gemm_table.TABLE.clear()
        gemm_table.TABLE.update(saved)


def _case(device, m, hq, hkv, d, norm, int8, dtype=torch.bfloat16, k=1024, pad_every=5, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(m, k, device=device, dtype=dtype, generator=g)
    w = (torch.randn((hq + 2 * hkv) * d, k, device=device, generator=g) / k ** 0.5).to(dtype)
    positions = torch.randint(0, MAX_POS, (m,), device=device, generator=g)
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, d, 2, device=device).float() / d))
    cos, sin = build_rope_cache(inv_freq, MAX_POS)
    blocks = m // BLOCK_SIZE + 4
    slots = torch.randperm(blocks * BLOCK_SIZE, device=device, generator=g)[:m]
    if pad_every:
        slots[::pad_every] = -1
    shape = (blocks, BLOCK_SIZE, hkv, d)
    # Caches start from junk so that a padded token's slot is detectably untouched.
    if int8:
        kc = torch.randint(-127, 128, shape, device=device, dtype=torch.int8, generator=g)
        scales = [torch.rand(blocks, hkv, BLOCK_SIZE, device=device, generator=g) for _ in range(2)]
    else:
        kc = torch.randn(shape, device=device, generator=g).to(dtype)
        scales = [None, None]
    nw = [(torch.rand(d, device=device, generator=g) + 0.5).to(dtype) for _ in range(2)] if norm else [None, None]
    prep = dict(positions=positions, cos_cache=cos, sin_cache=sin, slot_mapping=slots, k_cache=kc,
                v_cache=kc.clone(), q_norm_weight=nw[0], k_norm_weight=nw[1], eps=1e-6, k_scale=scales[0],
                v_scale=scales[1], num_heads=hq, num_kv_heads=hkv, head_dim=d)
    return x, w, prep


def _fresh(prep):
    """The prep arguments with caches and scales of their own (both paths write them)."""
    out = dict(prep)
    for name in ("k_cache", "v_cache", "k_scale", "v_scale"):
        if out[name] is not None:
            out[name] = out[name].clone()
    return out


def test_cpu_falls_back_to_the_reference():
    x, w, prep = _case("cpu", 20, 4, 2, 64, norm=True, int8=False, k=128, dtype=torch.float32)
    ref_prep = _fresh(prep)
    q = prep_linear_mid(x, w, **prep)
    want = qkv_prep_ref(F.linear(x, w), **ref_prep)
    assert torch.equal(q, want)
    assert torch.equal(prep["k_cache"], ref_prep["k_cache"]) and torch.equal(prep["v_cache"], ref_prep["v_cache"])
    assert not mid_path(True, x, w, prep_head_dim=64)


def _sm90(gpu_device):
    if torch.cuda.get_device_capability(gpu_device)[0] != 9:
        pytest.skip("the Gluon GEMM is built for sm_90 (Hopper)")


def _assert_near(got, want, dtype):
    """A last-place difference in a normed value moves the rotated one by up to a last place of
    the head's largest value (rotate-half adds two products): within two of those of `want`,
    on under 2% of the values."""
    scale = want.float().abs().amax(dim=-1, keepdim=True) * torch.finfo(dtype).eps
    diff = (got.float() - want.float()).abs()
    assert (diff <= 2 * scale).all(), (diff / scale).max().item()
    assert (got != want).float().mean() < 0.02


@pytest.mark.parametrize("m", [17, 64, 100, 256])
@pytest.mark.parametrize("norm,int8", [(True, False), (True, True), (False, False), (False, True)])
@pytest.mark.parametrize("hq,hkv,d,bk,stages", [(16, 8, 128, 128, 4), (4, 2, 64, 64, 3)])
def test_gpu_matches_gemm_then_qkv_prep(gpu_device, m, norm, int8, hq, hkv, d, bk, stages):
    _sm90(gpu_device)
    from infer_cluster.kernels.gemm_gluon import gemm_sm90
    from infer_cluster.kernels.gemm_prep_gluon import gemm_prep_sm90
    from infer_cluster.kernels.qkv_prep_triton import qkv_prep_triton
    x, w, prep = _case(gpu_device, m, hq, hkv, d, norm, int8, seed=m)
    cfg = GemmConfig(block_n=d, block_k=bk, stages=stages)
    ref_prep = _fresh(prep)
    want = qkv_prep_triton(gemm_sm90(x, w, cfg), **ref_prep)
    kc0, vc0 = prep["k_cache"].clone(), prep["v_cache"].clone()
    for pdl in (False, True):
        got_prep = _fresh(prep)
        got = gemm_prep_sm90(x, w, cfg, **got_prep, pdl=pdl)
        assert got.shape == (m, hq, d) and got.dtype == x.dtype
        if not norm:  # the same products, rounded and rotated as the separate kernels do
            assert torch.equal(got, want)
        else:  # the norm's sum of squares adds in another order
            _assert_near(got, want, x.dtype)
        written = prep["slot_mapping"] >= 0
        blk, off = prep["slot_mapping"] // BLOCK_SIZE, prep["slot_mapping"] % BLOCK_SIZE
        for name, scale in (("k_cache", "k_scale"), ("v_cache", "v_scale")):
            g_c, w_c, c0 = got_prep[name], ref_prep[name], kc0 if name == "k_cache" else vc0
            keep = torch.ones(c0.shape[:2], dtype=torch.bool, device=gpu_device)
            keep[blk[written], off[written]] = False
            assert torch.equal(g_c[keep], c0[keep])  # padded tokens and other slots untouched
            if int8:
                diff = (g_c.int() - w_c.int()).abs()
                assert diff.max() <= (2 if norm and name == "k_cache" else 0)
                torch.testing.assert_close(got_prep[scale], ref_prep[scale], rtol=1e-2, atol=0)
                if not (norm and name == "k_cache"):
                    assert torch.equal(got_prep[scale], ref_prep[scale])
            elif norm and name == "k_cache":
                _assert_near(g_c[~keep], w_c[~keep], x.dtype)
            else:
                assert torch.equal(g_c, w_c)


def test_gpu_graph_of_pdl_launches_matches_eager(gpu_device):
    """The GEMM before it writes x; the fused launch must wait for it under PDL."""
    _sm90(gpu_device)
    from infer_cluster.kernels.gemm_gluon import gemm_sm90
    from infer_cluster.kernels.gemm_prep_gluon import gemm_prep_sm90
    x0, w, prep = _case(gpu_device, 200, 16, 8, 128, norm=True, int8=False)
    w0 = (torch.randn(1024, 1024, device=gpu_device) / 32).to(torch.bfloat16)
    cfg0 = GemmConfig(block_n=64, block_k=128, stages=4)
    cfg = GemmConfig(block_n=128, block_k=128, stages=4)

    def chain():
        return gemm_prep_sm90(gemm_sm90(x0, w0, cfg0), w, cfg, **prep)
    eager = chain().clone()
    k_eager = prep["k_cache"].clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain()
    for _ in range(3):
        out.zero_()
        prep["k_cache"].zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)
        written = prep["slot_mapping"] >= 0
        blk, off = prep["slot_mapping"][written] // BLOCK_SIZE, prep["slot_mapping"][written] % BLOCK_SIZE
        assert torch.equal(prep["k_cache"][blk, off], k_eager[blk, off])


def test_gpu_rejects_bad_inputs(gpu_device):
    _sm90(gpu_device)
    from infer_cluster.kernels.gemm_prep_gluon import gemm_prep_sm90
    x, w, prep = _case(gpu_device, 64, 16, 8, 128, norm=True, int8=False)
    with pytest.raises(ValueError, match="block_n must be head_dim"):
        gemm_prep_sm90(x, w, GemmConfig(block_n=64, block_k=128, stages=4), **prep)
    with pytest.raises(ValueError, match="rows"):
        gemm_prep_sm90(x, w[:-128], GemmConfig(block_n=128, block_k=128, stages=4), **prep)
    bad = dict(prep, positions=prep["positions"][:-1])
    with pytest.raises(ValueError, match="positions"):
        gemm_prep_sm90(x, w, GemmConfig(block_n=128, block_k=128, stages=4), **bad)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_engine_tokens_with_and_without_the_fused_prep(monkeypatch):
    """A Qwen3-0.6B-shape engine (dummy weights, CUDA graphs) decoding 64 requests, whose steps
    of 17-64 rows take the fused launch where the table has its row: greedy tokens against the
    same engine with `INFER_CLUSTER_GEMM_PREP=0`. Random weights give nearly flat
    distributions, where a last-place difference in a q/k norm can flip an argmax now and then,
    so most requests, not all, must keep every token, and the chosen tokens' logprobs must agree
    closely while they do."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon GEMM is built for sm_90 (Hopper)")
    from infer_cluster.kernels import gemm as gemm_mod
    from infer_cluster.protocol import SamplingParams
    from infer_cluster.worker import LLM
    if gemm_config(64, 4096, 1024, prep_head_dim=128) is None:
        pytest.skip("the GEMM table has no prep row for the Qwen3-0.6B qkv at 64 rows")
    calls = []
    real = gemm_mod.prep_linear_mid

    def counting(*args, **kw):
        calls.append(args[0].shape[0])
        return real(*args, **kw)
    prompts = [[(i * 37 + j * 11) % 5000 + 10 for j in range(20 + (i * 53) % 300)] for i in range(64)]
    params = SamplingParams(temperature=0, max_tokens=8, logprobs=1, ignore_eos=True)
    results = {}
    for fused in ("1", "0"):
        monkeypatch.setenv("INFER_CLUSTER_GEMM_PREP", fused)
        from infer_cluster.worker.models import decoder
        monkeypatch.setattr(decoder, "prep_linear_mid", counting)
        llm = LLM("qwen3-0.6b-shape", load_format="dummy", dtype="bfloat16", device="cuda", num_kv_blocks=4096,
                  max_model_len=1024, max_num_seqs=64)
        results[fused] = llm.generate(prompts, params, use_tqdm=False)
        llm.close()
        if fused == "1":
            assert calls and max(calls) <= 64, calls  # captured into the decode graphs
            calls.clear()
    assert not calls  # switched off: never called
    same = sum(a.token_ids == b.token_ids for a, b in zip(results["1"], results["0"]))
    gap = 0.0
    for a, b in zip(results["1"], results["0"]):
        for ta, tb, lp_a, lp_b in zip(a.token_ids, b.token_ids, a.logprobs, b.logprobs):
            if ta != tb:
                break
            gap = max(gap, abs(lp_a[0] - lp_b[0]))
    print(f"same tokens {same} of 64; largest logprob gap {gap:.4f}")
    assert same >= 56 and gap < 0.05
