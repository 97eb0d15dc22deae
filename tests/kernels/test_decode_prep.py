"""Decode attention with the input prep folded in (`decode_prep_attention_triton`) against the two
launches it replaces (`qkv_prep_triton` then `decode_attention`) and against the references
(`prep_attention_ref`): the attention output and every cache slot, written or not."""

import pytest
import torch

from infer_cluster.kernels import build_rope_cache
from infer_cluster.kernels.attention_triton import decode_attention
from infer_cluster.kernels.decode_prep import fusable, prep_attention, prep_attention_ref
from infer_cluster.kernels.decode_prep_triton import decode_prep_attention_triton
from infer_cluster.kernels.qkv_prep_triton import qkv_prep_triton
from tests.kernels.conftest import tol

MAX_POS = 512


def _case(device, dtype, ctx_lens, hq, hkv, d, block_size, norm, pad_rows=0, no_query=()):
    """A decode step: sequence i has one query row at position ctx_lens[i]-1 whose k/v are not yet
    in the cache (its slot holds junk); `pad_rows` CUDA-graph padding rows follow (seq_len 1,
    slot -1); sequences in `no_query` own no row."""
    ctx_lens = list(ctx_lens) + [1] * pad_rows
    num_seqs = len(ctx_lens)
    q_lens = [0 if i in no_query else 1 for i in range(num_seqs)]
    n = sum(q_lens)
    blocks_per_seq = max(-(-c // block_size) for c in ctx_lens) + 1
    num_blocks = num_seqs * blocks_per_seq + 2
    perm = torch.randperm(num_blocks, device=device)[:num_seqs * blocks_per_seq]
    block_tables = perm.view(num_seqs, blocks_per_seq).to(torch.int32)
    qsl = torch.tensor([0] + q_lens, device=device).cumsum(0).to(torch.int32)
    rows = [i for i in range(num_seqs) if q_lens[i]]
    positions = torch.tensor([ctx_lens[i] - 1 for i in rows], device=device)
    slots = []
    for i in rows:
        p = ctx_lens[i] - 1
        pad = i >= num_seqs - pad_rows
        slots.append(-1 if pad else int(block_tables[i, p // block_size]) * block_size + p % block_size)
    shape = (num_blocks, block_size, hkv, d)
    kc = torch.randn(shape, device=device).to(dtype)  # junk everywhere, the context included
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2, device=device).float() / d))
    cos, sin = build_rope_cache(inv_freq, MAX_POS)
    weights = [(torch.rand(d, device=device) + 0.5).to(dtype) for _ in range(2)] if norm else [None, None]
    return dict(qkv=torch.randn(n, (hq + 2 * hkv) * d, device=device).to(dtype), positions=positions,
                cos_cache=cos, sin_cache=sin, slot_mapping=torch.tensor(slots, device=device),
                k_cache=kc, v_cache=torch.randn(shape, device=device).to(dtype),
                block_tables=block_tables, query_start_loc=qsl,
                seq_lens=torch.tensor(ctx_lens, dtype=torch.int32, device=device),
                scale=d ** -0.5, q_norm_weight=weights[0], k_norm_weight=weights[1], eps=1e-6,
                num_heads=hq, num_kv_heads=hkv, head_dim=d)


def _fresh(case):
    return {k: (v.clone() if k in ("qkv", "k_cache", "v_cache") else v) for k, v in case.items()}


def _fused(case, **kw):
    c = _fresh(case)
    out = decode_prep_attention_triton(**c, **kw)
    return out, c["k_cache"], c["v_cache"]


def _two_launches(case, **kw):
    c = _fresh(case)
    q = qkv_prep_triton(c["qkv"], c["positions"], c["cos_cache"], c["sin_cache"], c["slot_mapping"],
                        c["k_cache"], c["v_cache"], c["q_norm_weight"], c["k_norm_weight"], c["eps"],
                        num_heads=c["num_heads"], num_kv_heads=c["num_kv_heads"], head_dim=c["head_dim"])
    out = torch.empty_like(q)
    decode_attention(q, c["k_cache"], c["v_cache"], c["block_tables"], c["query_start_loc"],
                     c["seq_lens"], c["scale"], out, **kw)
    return out, c["k_cache"], c["v_cache"]


def _reference(case):
    c = _fresh(case)
    out = prep_attention_ref(**c, max_query_len=1)
    return out, c["k_cache"], c["v_cache"]


def _assert_close(got, want, dtype, real_rows):
    atol, rtol = tol(dtype)
    torch.testing.assert_close(got[0][real_rows], want[0][real_rows], atol=atol, rtol=rtol)
    torch.testing.assert_close(got[1], want[1], atol=atol, rtol=rtol)  # written slots and the rest
    torch.testing.assert_close(got[2], want[2], atol=atol, rtol=rtol)


CASES = [  # ctx_lens, hq, hkv, d, block_size, norm
    ([5, 17, 33, 1], 4, 2, 32, 16, True),     # GQA 2, a 1-token context, the new token at a page start
    ([16, 32, 9], 4, 4, 64, 8, False),        # MHA, contexts ending on page and tile boundaries
    ([40, 3], 6, 2, 16, 16, True),            # GQA 3 (padded to 16 rows), narrow heads
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("ctx_lens,hq,hkv,d,block_size,norm", CASES)
def test_fused_matches_two_launches_and_reference(device, dtype, num_splits, ctx_lens, hq, hkv, d,
                                                  block_size, norm):
    case = _case(device, dtype, ctx_lens, hq, hkv, d, block_size, norm)
    real = slice(0, len(ctx_lens))
    fused = _fused(case, num_splits=num_splits)
    _assert_close(fused, _two_launches(case, num_splits=num_splits), dtype, real)
    _assert_close(fused, _reference(case), dtype, real)


@pytest.mark.parametrize("num_splits", [1, 4])
def test_padding_rows_and_rows_without_query_write_nothing(device, num_splits):
    """CUDA-graph padding rows (seq_len 1, slot -1) and sequences with no query row leave the cache
    as it was; the real rows still match the two launches."""
    dtype = torch.float32
    case = _case(device, dtype, [20, 7, 12], 4, 2, 32, 8, True, pad_rows=2, no_query=(1,))
    out, kc, vc = _fused(case, num_splits=num_splits)
    ref_out, ref_kc, ref_vc = _two_launches(case, num_splits=num_splits)
    atol, rtol = tol(dtype)
    # Rows: sequence 0, sequence 2, then the two padding rows (sequence 1 owns none).
    torch.testing.assert_close(out[:2], ref_out[:2], atol=atol, rtol=rtol)
    torch.testing.assert_close(kc, ref_kc, atol=atol, rtol=rtol)
    torch.testing.assert_close(vc, ref_vc, atol=atol, rtol=rtol)
    written = case["slot_mapping"] >= 0
    assert int(written.sum()) == 2
    flat = lambda c: c.reshape(-1, *c.shape[2:])  # noqa: E731
    untouched = torch.ones(flat(kc).shape[0], dtype=torch.bool, device=device)
    untouched[case["slot_mapping"][written]] = False
    assert torch.equal(flat(kc)[untouched], flat(case["k_cache"])[untouched])
    assert torch.equal(flat(vc)[untouched], flat(case["v_cache"])[untouched])
    assert torch.isfinite(out).all()


def test_dispatch_fuses_decode_steps_on_float_caches_only(device, monkeypatch):
    monkeypatch.setenv("INFER_CLUSTER_KERNELS", "triton")  # the Triton path on the interpreter too
    case = _case(device, torch.float32, [9, 4], 4, 2, 32, 8, True)
    assert fusable(case["qkv"], case["k_cache"], 1)
    assert not fusable(case["qkv"], case["k_cache"], 2)
    assert not fusable(case["qkv"], case["k_cache"], None)
    assert not fusable(case["qkv"], case["k_cache"].to(torch.int8), 1)
    monkeypatch.setenv("INFER_CLUSTER_KERNELS", "torch")
    assert not fusable(case["qkv"], case["k_cache"], 1)
    monkeypatch.setenv("INFER_CLUSTER_KERNELS", "triton")
    # Fused or not, the public entry agrees with the reference.
    want = _reference(case)
    atol, rtol = tol(torch.float32)
    for fuse in (True, False):
        c = _fresh(case)
        out = prep_attention(**c, max_query_len=1, fuse=fuse)
        torch.testing.assert_close(out, want[0], atol=atol, rtol=rtol)
        torch.testing.assert_close(c["k_cache"], want[1], atol=atol, rtol=rtol)
        torch.testing.assert_close(c["v_cache"], want[2], atol=atol, rtol=rtol)


def test_bad_inputs_raise_before_launch(device, monkeypatch):
    monkeypatch.setenv("INFER_CLUSTER_KERNELS", "triton")
    case = _case(device, torch.float32, [9, 4], 4, 2, 32, 8, True)
    bad = _fresh(case)
    bad["positions"] = bad["positions"][:1]
    with pytest.raises(ValueError, match="positions"):
        prep_attention(**bad, max_query_len=1)
    bad = _fresh(case)
    bad["query_start_loc"] = bad["query_start_loc"][:2]
    with pytest.raises(ValueError, match="query_start_loc"):
        prep_attention(**bad, max_query_len=1)
    assert torch.equal(bad["k_cache"], case["k_cache"])  # nothing launched


PTX_ORDER = """
from bench.ptxas_check import _decode_prep_variants, compile_sm90, ptxas_info
for name, kernel, ptrs, ints, consts, opts, dns in _decode_prep_variants():
    ptx = compile_sm90(kernel, ptrs, ints, consts, opts, dns).asm["ptx"]
    lines = [l.strip() for l in ptx.splitlines()]
    first = lambda key: next(i for i, l in enumerate(lines) if l.startswith(key))
    print(name.replace(" ", "_"), first("griddepcontrol.launch_dependents"), first("griddepcontrol.wait"),
          min(first("ld.global"), first("cp.async")), ptxas_info(ptx)[1])
"""


def test_sm90_build_waits_before_any_read_and_never_spills():
    """The sm_90 build (ahead of time, no GPU): PDL release first, then the wait, before any load
    (qkv comes from the kernel before it); no register spills."""
    from tests.kernels.conftest import run_without_interpreter
    rows = [line.split() for line in run_without_interpreter(PTX_ORDER).splitlines()]
    assert len(rows) == 3
    for name, release, wait, first_read, spills in rows:
        assert int(release) < int(wait) < int(first_read), name
        assert int(spills) == 0, name
