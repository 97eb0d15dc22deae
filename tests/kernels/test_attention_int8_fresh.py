"""Fresh K/V for int8 KV caches in prefill: the step's own keys/values come unquantized from
`k_new`/`v_new` (rows of the step's flat batch, like q), the cached prefix from the int8 cache.

Why: with an int8 cache, prefill used to read its own new tokens back from the quantized cache;
now the prefill kernel takes the unquantized rows for the step's positions. These tests check
- the Triton prefill kernel (entry point, one split, a forced split) against
  `paged_attention_ref(..., k_new=, v_new=)` on fresh prompts, chunks over cached prefixes that
  end mid-tile, mixed batches (decode rows, an empty sequence), with and without GQA. The cache
  rows at the step's positions hold *other* random values than k_new/v_new, so a kernel that
  read them instead would fail; each case asserts that the difference is well above tolerance;
- the reference's semantics on their own (a no-op when k_new equals the cached rows, the same
  as attention over a cache spliced with the fresh rows, closer to float attention than int8);
- that decode (max_query_len 1) and float caches ignore the rows, and the argument checks;
- `qkv_prep(..., store_k=True)`: the normed, rotated k is written back into qkv's k columns,
  everything else as with store_k=False.

The interpreter and float32 q keep q exact, so the references here use the unquantized q. On
CUDA the default int8 prefill method ("mma_k") rounds q to int8 for the cached prefix (not for
the fresh rows): the `device` tests then force an exact-q operand method, and
`test_gpu_prefill_int8_fresh` checks the default with loose bounds.
"""

import pytest
import torch

from infer_cluster.kernels.attention import paged_attention_ref
from infer_cluster.kernels.attention_prefill_triton import prefill_attention
from infer_cluster.kernels.attention_triton import int8_quantizes_q, paged_attention_triton
from infer_cluster.kernels.kv_append import quantize_int8_ref
from infer_cluster.kernels.norm import rms_norm_ref
from infer_cluster.kernels.qkv_prep import qkv_prep, qkv_prep_ref, split_qkv
from infer_cluster.kernels.qkv_prep_triton import qkv_prep_triton
from infer_cluster.kernels.rotary import apply_rotary_ref
from tests.kernels.conftest import tol
from tests.kernels.test_attention import make_batch
from tests.kernels.test_attention_int8 import _dequantized, int8_batch
from tests.kernels.test_qkv_prep import _case, _run

DTYPES = [torch.float32, torch.bfloat16]


def _dtype_id(d):
    return str(d).removeprefix("torch.")


# -- helpers --------------------------------------------------------------------------------------

def own_slots(qsl, seq_lens, block_tables, block_size):
    """(block ids, offsets) `[num_tokens]` of the cache row at every query row's own position."""
    blocks, offs = [], []
    starts, lens = qsl.tolist(), seq_lens.tolist()
    for i, ctx in enumerate(lens):
        q_len = starts[i + 1] - starts[i]
        for p in range(ctx - q_len, ctx):
            blocks.append(int(block_tables[i, p // block_size]))
            offs.append(p % block_size)
    as_long = dict(dtype=torch.long, device=qsl.device)
    return torch.tensor(blocks, **as_long), torch.tensor(offs, **as_long)


def step_slots(qsl, seq_lens, block_tables, block_size):
    """(block ids, offsets, query rows) of the cache row at each query row's own position, for
    the sequences whose positions come from k_new/v_new: those with more than one query token
    (one-token rows read the cache, like decode)."""
    blocks, offs, rows = [], [], []
    starts, lens = qsl.tolist(), seq_lens.tolist()
    for i, ctx in enumerate(lens):
        q_len = starts[i + 1] - starts[i]
        if q_len < 2:
            continue
        for j, p in enumerate(range(ctx - q_len, ctx)):
            blocks.append(int(block_tables[i, p // block_size]))
            offs.append(p % block_size)
            rows.append(starts[i] + j)
    as_long = dict(dtype=torch.long, device=qsl.device)
    return torch.tensor(blocks, **as_long), torch.tensor(offs, **as_long), torch.tensor(rows, **as_long)


def fresh_batch(device, dtype, q_lens, ctx_lens, heads, kv_heads, dim, block_size):
    """(int8 batch, k_new, v_new, float batch). k_new/v_new are new random rows in `dtype`, so the
    int8 cache at the step's positions (quantized from make_batch's other random rows) differs."""
    batch = make_batch(device, dtype, q_lens, ctx_lens, heads, kv_heads, dim, block_size)
    n = batch[0].shape[0]
    k_new = torch.randn(n, kv_heads, dim, dtype=dtype).to(device)
    v_new = torch.randn(n, kv_heads, dim, dtype=dtype).to(device)
    return int8_batch(batch), k_new, v_new, batch


def spliced(cache, scales, k_new, qsl, seq_lens, block_tables):
    """float32 copy of an (int8, dequantized) cache whose rows at the step's positions are k_new."""
    out = (_dequantized(cache, scales) if cache.dtype == torch.int8 else cache).float().clone()
    blk, off, rows = step_slots(qsl, seq_lens, block_tables, cache.shape[1])
    out[blk, off] = k_new[rows].float()
    return out


def ref_fresh(ib, k_new, v_new, scale, q=None):
    q0, kc, vc, ks, vs, bt, qsl, sl = ib
    return paged_attention_ref(q0 if q is None else q, kc, vc, bt, qsl, sl, scale, k_scale=ks,
                               v_scale=vs, k_new=k_new, v_new=v_new)


def ref_stale(ib, scale, q=None):
    """The int8-only reference: what a kernel that ignored k_new/v_new would match."""
    q0, kc, vc, ks, vs, bt, qsl, sl = ib
    return paged_attention_ref(q0 if q is None else q, kc, vc, bt, qsl, sl, scale, k_scale=ks,
                               v_scale=vs)


def run_fresh(ib, k_new, v_new, scale, max_query_len, mode, cvt=None):
    """"entry": `paged_attention_triton`; an int: `prefill_attention(num_splits=mode)`."""
    q, kc, vc, ks, vs, bt, qsl, sl = ib
    if mode == "entry":
        return paged_attention_triton(q, kc, vc, bt, qsl, sl, scale, max_query_len, k_scale=ks,
                                      v_scale=vs, k_new=k_new, v_new=v_new)
    out = torch.full_like(q, float("nan"))
    prefill_attention(q, kc, vc, bt, qsl, sl, scale, max_query_len, out, k_scale=ks, v_scale=vs,
                      cvt=cvt, num_splits=mode, k_new=k_new, v_new=v_new)
    return out


def assert_fresh_matters(ib, k_new, v_new, scale, atol, q=None):
    """The fresh reference is far (>> atol) from the int8-only one on the rows that have a query."""
    diff = (ref_fresh(ib, k_new, v_new, scale, q).float() - ref_stale(ib, scale, q).float()).abs()
    assert diff.max() > 20 * atol, f"k_new/v_new barely change the output ({diff.max():.3g})"
    return diff


# -- Triton vs reference (interpreter; CUDA with an exact-q operand method) -----------------------

# (q_lens, ctx_lens, num_heads, num_kv_heads, head_dim, block_size)
FRESH_CASES = [
    ([7, 20], [7, 20], 4, 2, 32, 16),                      # fresh prompts, GQA 2
    ([9, 5], [30, 42], 4, 2, 64, 16),                      # chunks over prefixes 21, 37 (mid-tile)
    ([5, 1, 0, 17, 1], [30, 23, 4, 17, 40], 4, 2, 32, 16),  # mixed: decode rows, empty, a prompt
    ([12, 3, 1], [45, 3, 9], 2, 2, 64, 32),                # no GQA, page 32, prefix 33
    ([6, 11], [6, 29], 2, 2, 32, 16),                      # no GQA, a prompt beside a chunk
]


def _case_id(c):
    return f"q{c[0]}-ctx{c[1]}-h{c[2]}/{c[3]}-d{c[4]}-bs{c[5]}"


@pytest.mark.parametrize("mode", ["entry", 1, 4], ids=["entry", "splits1", "splits4"])
@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
@pytest.mark.parametrize("case", FRESH_CASES, ids=_case_id)
def test_prefill_int8_fresh_matches_ref(device, dtype, case, mode):
    q_lens, ctx_lens, heads, kv_heads, dim, block_size = case
    ib, k_new, v_new, _ = fresh_batch(device, dtype, q_lens, ctx_lens, heads, kv_heads, dim,
                                      block_size)
    q, kc = ib[0], ib[1]
    max_q, scale = max(q_lens), dim ** -0.5
    cvt = None
    if int8_quantizes_q(q, kc, max_q):  # CUDA, 16-bit q: the default rounds q for the prefix
        has_prefix = any(c > n for n, c in zip(q_lens, ctx_lens) if n)
        if mode == "entry" and has_prefix:
            pytest.skip("default method rounds q for the prefix: test_gpu_prefill_int8_fresh")
        cvt = "prmt_load"
    got = run_fresh(ib, k_new, v_new, scale, max_q, mode, cvt)
    ref = ref_fresh(ib, k_new, v_new, scale)
    assert got.shape == q.shape and got.dtype == q.dtype
    assert not torch.isnan(got).any(), "read KV past seq_lens (NaN trap)"
    atol, rtol = tol(dtype)
    torch.testing.assert_close(got, ref.to(dtype), atol=atol, rtol=rtol)
    # A kernel that took the step's rows from the cache would be this far off.
    assert_fresh_matters(ib, k_new, v_new, scale, atol)
    assert not torch.allclose(got.float(), ref_stale(ib, scale).float(), atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
def test_decode_ignores_fresh_kv(device, dtype):
    # max_query_len 1 takes the decode kernel, which reads every row from the cache.
    ib, k_new, v_new, _ = fresh_batch(device, dtype, [1, 1, 0, 1], [1, 37, 5, 20], 4, 2, 32, 16)
    q, kc, vc, ks, vs, bt, qsl, sl = ib
    plain = paged_attention_triton(q, kc, vc, bt, qsl, sl, 0.2, 1, k_scale=ks, v_scale=vs)
    got = paged_attention_triton(q, kc, vc, bt, qsl, sl, 0.2, 1, k_scale=ks, v_scale=vs,
                                 k_new=k_new, v_new=v_new)
    assert torch.equal(got, plain)


@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
def test_float_cache_fresh_rows_match(device, dtype):
    # A float cache holds the step's rows exactly: given them as k_new/v_new, the kernel (which
    # ignores them) and the reference (which uses them) agree with the plain reference.
    batch = make_batch(device, dtype, [9, 1, 0, 4], [30, 17, 3, 4], 4, 2, 32, 16)
    q, kc, vc, bt, qsl, sl = batch
    blk, off = own_slots(qsl, sl, bt, kc.shape[1])
    k_new, v_new = kc[blk, off].clone(), vc[blk, off].clone()
    got = paged_attention_triton(q, kc, vc, bt, qsl, sl, 0.15, 9, k_new=k_new, v_new=v_new)
    plain = paged_attention_ref(q, kc, vc, bt, qsl, sl, 0.15)
    ref = paged_attention_ref(q, kc, vc, bt, qsl, sl, 0.15, k_new=k_new, v_new=v_new)
    atol, rtol = tol(dtype)
    torch.testing.assert_close(got, plain, atol=atol, rtol=rtol)
    torch.testing.assert_close(ref, plain, atol=0, rtol=0)


# -- the reference's semantics -------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
def test_ref_fresh_rows_equal_to_cache_change_nothing(dtype):
    batch = make_batch("cpu", dtype, [5, 0, 1, 17, 3], [70, 4, 23, 17, 20], 4, 2, 64, 16)
    q, kc, vc, bt, qsl, sl = batch
    blk, off = own_slots(qsl, sl, bt, kc.shape[1])
    k_new, v_new = kc[blk, off].clone(), vc[blk, off].clone()
    plain = paged_attention_ref(q, kc, vc, bt, qsl, sl, 0.125)
    fresh = paged_attention_ref(q, kc, vc, bt, qsl, sl, 0.125, max(5, 17), k_new=k_new,
                                v_new=v_new)
    assert torch.equal(fresh, plain)


@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
def test_ref_fresh_is_attention_over_the_spliced_cache(dtype):
    # The semantics spelled out: the int8 cache dequantized, its rows at the step's positions
    # replaced by k_new/v_new, plain float attention over that.
    ib, k_new, v_new, _ = fresh_batch("cpu", dtype, [5, 1, 0, 17, 9], [30, 23, 4, 17, 42], 4, 2,
                                      32, 16)
    q, kc, vc, ks, vs, bt, qsl, sl = ib
    fk = spliced(kc, ks, k_new, qsl, sl, bt)
    fv = spliced(vc, vs, v_new, qsl, sl, bt)
    want = paged_attention_ref(q, fk, fv, bt, qsl, sl, 0.17)
    got = ref_fresh(ib, k_new, v_new, 0.17)
    assert got.dtype == q.dtype
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    assert_fresh_matters(ib, k_new, v_new, 0.17, tol(dtype)[0])


def test_ref_fresh_is_closer_to_float_attention():
    # k_new/v_new are the exact rows the int8 cache was quantized from: fresh prompts then match
    # float attention, and chunks err only through their prefix.
    q_lens, ctx_lens = [12, 7, 1, 20, 10], [12, 40, 25, 20, 30]
    batch = make_batch("cpu", torch.float32, q_lens, ctx_lens, 4, 2, 64, 16)
    q, fk, fv, bt, qsl, sl = batch
    ib = int8_batch(batch)
    blk, off = own_slots(qsl, sl, bt, fk.shape[1])
    k_new, v_new = fk[blk, off].clone(), fv[blk, off].clone()
    exact = paged_attention_ref(q, fk, fv, bt, qsl, sl, 0.125)
    err_fresh = (ref_fresh(ib, k_new, v_new, 0.125) - exact).abs()
    err_int8 = (ref_stale(ib, 0.125) - exact).abs()
    assert err_fresh.mean() < 0.75 * err_int8.mean(), (err_fresh.mean(), err_int8.mean())
    assert err_fresh.max() <= err_int8.max()
    prompts = torch.cat([torch.arange(qsl[i], qsl[i + 1]) for i in (0, 3)])
    assert err_fresh[prompts].max() < 1e-5
    assert err_int8[prompts].max() > 1e-3


# -- argument checks ------------------------------------------------------------------------------

def test_fresh_kv_checks(device):
    ib, k_new, v_new, _ = fresh_batch(device, torch.float32, [4, 2], [4, 19], 4, 2, 32, 16)
    q, kc, vc, ks, vs, bt, qsl, sl = ib

    def call(**kw):
        return paged_attention_triton(q, kc, vc, bt, qsl, sl, 0.2, 4, k_scale=ks, v_scale=vs, **kw)

    call(k_new=k_new, v_new=v_new)  # well-formed: runs
    with pytest.raises(ValueError):
        call(k_new=k_new)
    with pytest.raises(ValueError):
        call(v_new=v_new)
    for bad in (k_new[:-1], k_new[:, :1], k_new[..., :16], k_new.reshape(k_new.shape[0], -1)):
        with pytest.raises(ValueError):
            call(k_new=bad, v_new=v_new)
        with pytest.raises(ValueError):
            call(k_new=k_new, v_new=bad.clone())


# -- qkv_prep(store_k=True) -----------------------------------------------------------------------

def _expected_k(case):
    """Normed (when weights are given) and rotated k in qkv's dtype, as qkv_prep_ref computes it."""
    qkv = case["qkv"].clone()
    q, k, _ = split_qkv(qkv, case["num_heads"], case["num_kv_heads"], case["head_dim"])
    if case["q_norm_weight"] is not None:
        q = rms_norm_ref(q, case["q_norm_weight"], case["eps"])
        k = rms_norm_ref(k, case["k_norm_weight"], case["eps"])
    q, k = q.clone(), k.clone()
    apply_rotary_ref(q, k, case["positions"], case["cos_cache"], case["sin_cache"])
    return k


@pytest.mark.parametrize("fn", [qkv_prep_triton, qkv_prep_ref, qkv_prep],
                         ids=["triton", "ref", "dispatch"])
@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
@pytest.mark.parametrize("norm", [False, True])
def test_qkv_prep_store_k(device, fn, dtype, norm):
    case = _case(device, dtype, 9, 4, 2, 64, norm, int8=True)
    qkv0 = case["qkv"].clone()
    plain = _run(fn, case)
    case["qkv"] = qkv0.clone()
    stored = _run(fn, case, store_k=True)
    # q and the cache (codes, scales) exactly as without store_k.
    for a, b in zip(stored, plain):
        assert torch.equal(a, b)
    # The store went into the qkv passed in (`_run` clones it; run once more on our own copy).
    qkv = qkv0.clone()
    fn(**{**case, "qkv": qkv, "k_cache": case["k_cache"].clone(),
          "v_cache": case["v_cache"].clone(), "k_scale": case["k_scale"].clone(),
          "v_scale": case["v_scale"].clone()}, store_k=True)
    hq, hkv, d = case["num_heads"], case["num_kv_heads"], case["head_dim"]
    _, k_got, v_got = split_qkv(qkv, hq, hkv, d)
    _, _, v0 = split_qkv(qkv0, hq, hkv, d)
    assert k_got.dtype == dtype
    assert torch.equal(v_got, v0), "v columns changed"
    # Padded tokens (slot -1) have no query row: their k is not specified.
    valid = case["slot_mapping"] >= 0
    k_want = _expected_k(case)
    if fn is qkv_prep_ref or (fn is qkv_prep and not qkv.is_cuda):
        assert torch.equal(k_got[valid], k_want[valid])
    else:  # the interpreter truncates float32 -> bf16 where torch rounds (see test_qkv_prep)
        atol, rtol = tol(dtype)
        torch.testing.assert_close(k_got[valid], k_want[valid], atol=atol, rtol=rtol)
    # ... and they are the values the cache was quantized from.
    slots = case["slot_mapping"][valid].long()
    bs = case["k_cache"].shape[1]
    kc, ks = stored[1], stored[3]
    codes, scale = quantize_int8_ref(k_got[valid])
    assert (codes.int() - kc[slots // bs, slots % bs].int()).abs().max() <= 1
    torch.testing.assert_close(scale, ks[slots // bs, :, slots % bs], atol=1e-6, rtol=1e-6)


# -- GPU: the default operand method (q rounded to int8 for the prefix on 16-bit q) ---------------

def fresh_q_bound(q, ib, k_new, v_new, scale):
    """Worst-case |output error| per (token, head) if q is rounded to int8 for some keys (as
    `test_attention_int8.mma_q_bound`, with the fresh rows among the keys and values)."""
    _, kc, vc, ks, vs = ib[:5]
    k = torch.nan_to_num(_dequantized(kc, ks).float())
    v = torch.nan_to_num(_dequantized(vc, vs).float())
    k_l1 = max(k.abs().sum(dim=-1).max(), k_new.float().abs().sum(dim=-1).max())
    v_max = max(v.abs().max(), v_new.float().abs().max())
    delta = scale * q.float().abs().amax(dim=-1) / 254.0 * k_l1
    return (torch.exp(2 * delta) - 1) * v_max


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=_dtype_id)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gpu_prefill_int8_fresh(gpu_device, dtype, head_dim):
    # Fresh prompts (every key fresh: q stays exact whatever the method) at a loose 3e-2, then
    # chunks over long prefixes with the default method: within the q-rounding bound, small on
    # average, and far from the int8-only result.
    q_lens = [700, 1, 0, 130, 64]
    ib, k_new, v_new, _ = fresh_batch(gpu_device, dtype, q_lens, q_lens[:2] + [10] + q_lens[3:],
                                      16, 8, head_dim, 16)
    scale = head_dim ** -0.5
    got = run_fresh(ib, k_new, v_new, scale, 700, "entry")
    assert not torch.isnan(got).any()
    torch.testing.assert_close(got.float(), ref_fresh(ib, k_new, v_new, scale).float(),
                               atol=3e-2, rtol=3e-2)
    assert_fresh_matters(ib, k_new, v_new, scale, 3e-2)

    q_lens, ctx_lens = [300, 1, 0, 130, 17], [900, 1500, 10, 611, 64]
    ib, k_new, v_new, _ = fresh_batch(gpu_device, dtype, q_lens, ctx_lens, 16, 8, head_dim, 16)
    q = ib[0]
    for mode in ("entry", 1, 4):
        got = run_fresh(ib, k_new, v_new, scale, 300, mode).float()
        assert not torch.isnan(got).any()
        ref = ref_fresh(ib, k_new, v_new, scale).float()
        atol, rtol = tol(dtype)
        if int8_quantizes_q(q, ib[1], 300):
            # q rounded to int8 for the prefix keys only: no reference computes exactly that,
            # so bound the rounding error (as check_mma does) and its typical size.
            err = (got - ref).abs()
            bound = fresh_q_bound(q, ib, k_new, v_new, scale)[..., None] + atol
            assert (err <= bound).all(), f"int8 q error {err.max():.3g} over its bound"
            assert err.mean() < 5e-3, f"mean int8 q error {err.mean():.3g}"
        else:
            torch.testing.assert_close(got, ref, atol=atol, rtol=rtol)
        stale = ref_stale(ib, scale).float()
        assert (stale - ref).abs().mean() > 10 * (got - ref).abs().mean()
