"""Fused q/k norm + rotary + KV append (`qkv_prep_triton`) vs `qkv_prep_ref`, and the reference vs
the decoder's old composition (rms_norm, apply_rotary, kv_append)."""

import pytest
import torch

from infer_cluster.kernels import apply_rotary, build_rope_cache, kv_append, rms_norm
from infer_cluster.kernels.qkv_prep import qkv_prep, qkv_prep_ref
from infer_cluster.kernels.qkv_prep_triton import qkv_prep_triton
from tests.kernels.conftest import tol

BLOCK_SIZE, MAX_POS = 16, 512


def _case(device, dtype, n, hq, hkv, d, norm, int8, pad_every=3):
    qkv = torch.randn(n, (hq + 2 * hkv) * d, device=device).to(dtype)
    positions = torch.randint(0, MAX_POS, (n,), device=device)  # arbitrary, not increasing
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2, device=device).float() / d))
    cos, sin = build_rope_cache(inv_freq, MAX_POS)
    num_blocks = n // BLOCK_SIZE + 4
    slots = torch.randperm(num_blocks * BLOCK_SIZE, device=device)[:n]
    if pad_every:
        slots[::pad_every] = -1
    shape = (num_blocks, BLOCK_SIZE, hkv, d)
    # Caches start from junk so that skipped slots are detectably untouched.
    if int8:
        kc = torch.randint(-127, 128, shape, device=device, dtype=torch.int8)
        scales = [torch.rand(num_blocks, hkv, BLOCK_SIZE, device=device) for _ in range(2)]
    else:
        kc = torch.randn(shape, device=device).to(dtype)
        scales = [None, None]
    weights = [(torch.rand(d, device=device) + 0.5).to(dtype) for _ in range(2)] if norm \
        else [None, None]
    return dict(qkv=qkv, positions=positions, cos_cache=cos, sin_cache=sin, slot_mapping=slots,
                k_cache=kc, v_cache=kc.clone(), q_norm_weight=weights[0],
                k_norm_weight=weights[1], eps=1e-6, k_scale=scales[0], v_scale=scales[1],
                num_heads=hq, num_kv_heads=hkv, head_dim=d)


def _run(fn, case, **kw):
    """Calls fn on fresh copies of the mutable inputs; returns (q, k_cache, v_cache, scales...)."""
    c = {k: (v.clone() if isinstance(v, torch.Tensor) and k in
             ("qkv", "k_cache", "v_cache", "k_scale", "v_scale") else v) for k, v in case.items()}
    q = fn(**c, **kw)
    return q, c["k_cache"], c["v_cache"], c["k_scale"], c["v_scale"]


def _assert_matches(got, ref, case, dtype):
    atol, rtol = tol(dtype)
    q, kc, vc, ks, vs = got
    rq, rkc, rvc, rks, rvs = ref
    torch.testing.assert_close(q, rq, atol=atol, rtol=rtol)
    valid = case["slot_mapping"] >= 0
    flat = lambda c: c.reshape(-1, *c.shape[2:])  # noqa: E731  [slots, hkv, d]
    if kc.dtype == torch.int8:
        # Codes within one step, scales close. bf16 k may round one ulp apart (rsqrt, sum order);
        # the CPU interpreter truncates float32 -> bf16 where torch rounds (twice with a norm), so
        # there a code may move by two steps.
        steps = 1 if dtype == torch.float32 or kc.is_cuda else 2
        srtol = 1e-6 if dtype == torch.float32 else 2e-2
        assert (kc.int() - rkc.int()).abs().max().item() <= steps
        assert (vc.int() - rvc.int()).abs().max().item() <= 1
        torch.testing.assert_close(ks, rks, atol=1e-6, rtol=srtol)
        torch.testing.assert_close(vs, rvs, atol=0, rtol=1e-6)
    else:
        torch.testing.assert_close(kc, rkc, atol=atol, rtol=rtol)
        torch.testing.assert_close(vc, rvc, atol=0, rtol=0)  # v is a plain copy
    # Padded tokens' slots are never named; every slot not written keeps the junk it started with.
    written = torch.zeros(kc.shape[0] * kc.shape[1], dtype=torch.bool, device=kc.device)
    written[case["slot_mapping"][valid]] = True
    for cache in (kc, vc):
        assert torch.equal(flat(cache)[~written], flat(case["k_cache"])[~written])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("hq,hkv,d", [(4, 2, 64), (2, 1, 128)])
def test_qkv_prep_matches_ref(device, dtype, norm, int8, hq, hkv, d):
    case = _case(device, dtype, 7, hq, hkv, d, norm, int8)
    _assert_matches(_run(qkv_prep_triton, case), _run(qkv_prep_ref, case), case, dtype)


@pytest.mark.parametrize("block_h", [1, 2])
def test_qkv_prep_several_head_groups(device, block_h):
    # Heads split over several programs per token, odd head counts, a padded head_dim tile (80).
    case = _case(device, torch.float32, 5, 3, 3, 80, True, False, pad_every=2)
    ref = _run(qkv_prep_ref, case)
    _assert_matches(_run(qkv_prep_triton, case, block_h=block_h), ref, case, torch.float32)


def test_qkv_prep_returns_q_in_place_and_all_padded(device):
    case = _case(device, torch.float32, 4, 4, 2, 64, False, True, pad_every=1)
    qkv = case["qkv"]
    got = _run(qkv_prep_triton, case)
    assert torch.equal(got[1], case["k_cache"]) and torch.equal(got[3], case["k_scale"])
    case["qkv"] = qkv
    q = qkv_prep_triton(**case)
    assert q.data_ptr() == qkv.data_ptr() and q.shape == (4, 4, 64)  # a view of qkv, rotated


def test_qkv_prep_empty_batch(device):
    case = _case(device, torch.float32, 0, 4, 2, 64, True, False, pad_every=0)
    assert qkv_prep_triton(**case).shape == (0, 4, 64)


@pytest.mark.parametrize("norm", [False, True])
def test_ref_is_the_old_composition(norm):
    # The CPU path of the model must stay exactly what Attention.forward computed before.
    case = _case("cpu", torch.bfloat16, 6, 4, 2, 64, norm, False)
    got = _run(qkv_prep, case)
    c = {k: (v.clone() if k in ("qkv", "k_cache", "v_cache") else v) for k, v in case.items()}
    n, q_size, kv_size = 6, 4 * 64, 2 * 64
    q = c["qkv"][:, :q_size].view(n, 4, 64)
    k = c["qkv"][:, q_size:q_size + kv_size].view(n, 2, 64)
    v = c["qkv"][:, q_size + kv_size:].view(n, 2, 64)
    if norm:
        q, k = rms_norm(q, c["q_norm_weight"], 1e-6), rms_norm(k, c["k_norm_weight"], 1e-6)
    apply_rotary(q, k, c["positions"], c["cos_cache"], c["sin_cache"])
    kv_append(k, v, c["k_cache"], c["v_cache"], c["slot_mapping"])
    for a, b in zip(got[:3], (q, c["k_cache"], c["v_cache"])):
        assert torch.equal(a, b)


def test_qkv_prep_rejects_bad_inputs():
    case = _case("cpu", torch.float32, 3, 4, 2, 64, True, False)
    with pytest.raises(ValueError, match="give both or neither"):
        qkv_prep_triton(**{**case, "k_norm_weight": None})
    with pytest.raises(ValueError, match="slot_mapping"):
        qkv_prep_triton(**{**case, "slot_mapping": case["slot_mapping"][:2]})
    with pytest.raises(ValueError, match="qkv must be"):
        qkv_prep_triton(**{**case, "num_kv_heads": 1})
    with pytest.raises(ValueError, match="dtype"):
        qkv_prep_triton(**{**case, "q_norm_weight": case["q_norm_weight"].double(),
                           "k_norm_weight": case["k_norm_weight"].double()})
    with pytest.raises(ValueError, match="int8 KV cache needs"):
        qkv_prep_triton(**{**case, "k_cache": case["k_cache"].to(torch.int8),
                           "v_cache": case["v_cache"].to(torch.int8)})


# -- GPU only: the model's shape, old Triton composition, CUDA graphs ---------------------------

def _old_triton(qkv, positions, cos_cache, sin_cache, slot_mapping, k_cache, v_cache,
                q_norm_weight, k_norm_weight, eps, k_scale, v_scale, num_heads, num_kv_heads,
                head_dim):
    from infer_cluster.kernels.kv_append_triton import kv_append_triton
    from infer_cluster.kernels.norm_triton import rms_norm_triton
    from infer_cluster.kernels.rotary_triton import apply_rotary_triton
    from infer_cluster.kernels.qkv_prep import split_qkv
    q, k, v = split_qkv(qkv, num_heads, num_kv_heads, head_dim)
    if q_norm_weight is not None:
        q, k = rms_norm_triton(q, q_norm_weight, eps), rms_norm_triton(k, k_norm_weight, eps)
    apply_rotary_triton(q, k, positions, cos_cache, sin_cache)
    kv_append_triton(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    return q


@pytest.mark.parametrize("n", [1, 64, 300])
@pytest.mark.parametrize("norm,int8", [(True, False), (True, True), (False, False)])
def test_qkv_prep_qwen3_shape_gpu(gpu_device, n, norm, int8):
    case = _case(gpu_device, torch.bfloat16, n, 16, 8, 128, norm, int8, pad_every=7)
    got = _run(qkv_prep_triton, case)
    _assert_matches(got, _run(qkv_prep_ref, case), case, torch.bfloat16)
    _assert_matches(got, _run(_old_triton, case), case, torch.bfloat16)


def test_qkv_prep_in_cuda_graph(gpu_device):
    case = _case(gpu_device, torch.bfloat16, 8, 16, 8, 128, True, True, pad_every=3)
    live = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in case.items()}
    qkv_prep_triton(**live)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q = qkv_prep_triton(**live)
    fresh = _case(gpu_device, torch.bfloat16, 8, 16, 8, 128, True, True, pad_every=3)
    for key in ("qkv", "positions", "slot_mapping", "k_cache", "v_cache", "k_scale", "v_scale"):
        live[key].copy_(fresh[key])
    fresh["q_norm_weight"], fresh["k_norm_weight"] = live["q_norm_weight"], live["k_norm_weight"]
    graph.replay()
    torch.cuda.synchronize()
    got = (q, live["k_cache"], live["v_cache"], live["k_scale"], live["v_scale"])
    _assert_matches(got, _run(qkv_prep_ref, fresh), fresh, torch.bfloat16)
