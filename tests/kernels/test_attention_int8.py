"""Paged attention over int8 KV caches (codes + per-token, per-head float32 scales): the Triton
decode and prefill kernels vs `paged_attention_ref`, which dequantizes the gathered blocks.

Batches come from `test_attention.make_batch` and are quantized with the append rule
(`quantize_int8_ref`); the NaN traps move to the scales (an int8 code cannot be NaN), so any
read past seq_lens still shows up as NaN in the output.
"""

import pytest
import torch
import triton
import triton.language as tl

from infer_cluster.kernels import attention_decode_triton, attention_prefill_triton
from infer_cluster.kernels.attention import paged_attention_ref
from infer_cluster.kernels.attention_int8_triton import (OP_ADD, OP_CAST, OP_MMA, OP_PRMT,
                                                         OP_PRMT_LOAD, _int8_operand, _quant_rows)
from infer_cluster.kernels.attention_triton import CVT_MODES
from infer_cluster.kernels.attention_triton import (decode_attention, int8_quantizes_q,
                                                    paged_attention_triton)
from infer_cluster.kernels.kv_append import dequantize_int8_ref, quantize_int8_ref
from tests.kernels.conftest import INTERPRET, tol
from tests.kernels.test_attention import DECODE_CASES, PREFILL_CASES, make_batch


def _quantize_cache(cache):
    """(codes [B, S, H, D] int8, scales [B, H, S] float32) with NaN scales where a row is NaN."""
    poisoned = torch.isnan(cache).any(dim=-1)
    codes, scale = quantize_int8_ref(torch.nan_to_num(cache))
    scale = scale.masked_fill(poisoned, float("nan"))
    return codes, scale.transpose(1, 2).contiguous()


def int8_batch(batch):
    q, k_cache, v_cache, block_tables, qsl, seq_lens = batch
    kc, ks = _quantize_cache(k_cache)
    vc, vs = _quantize_cache(v_cache)
    return q, kc, vc, ks, vs, block_tables, qsl, seq_lens


def _dequantized(codes, scales):
    return dequantize_int8_ref(codes, scales.transpose(1, 2))


def check_int8(batch, dtype, max_query_len, scale=None, float_batch=None):
    q, kc, vc, ks, vs, block_tables, qsl, seq_lens = batch
    scale = scale if scale is not None else q.shape[-1] ** -0.5
    got = paged_attention_triton(q, kc, vc, block_tables, qsl, seq_lens, scale, max_query_len,
                                 k_scale=ks, v_scale=vs)
    # The default method may round q to int8 too ("mma_k" on CUDA): then so does the reference.
    q_ref = quantized_q(q) if int8_quantizes_q(q, kc, max_query_len) else q
    ref_raw = paged_attention_ref(q_ref, kc, vc, block_tables, qsl, seq_lens, scale, k_scale=ks,
                                  v_scale=vs)
    ref = ref_raw.to(q.dtype)
    assert got.shape == q.shape and got.dtype == q.dtype
    assert not torch.isnan(got).any(), "read KV past seq_lens (NaN trap)"
    atol, rtol = tol(dtype)
    torch.testing.assert_close(got, ref, atol=atol, rtol=rtol)
    # The int8 reference is the float reference on the dequantized cache.
    deq = paged_attention_ref(q_ref, _dequantized(kc, ks), _dequantized(vc, vs), block_tables, qsl,
                              seq_lens, scale)
    torch.testing.assert_close(ref_raw, deq, atol=1e-5, rtol=1e-5)
    if float_batch is not None:  # and int8 stays near the unquantized cache (sanity bound)
        fq, fk, fv = float_batch[:3]
        exact = paged_attention_ref(fq, fk, fv, block_tables, qsl, seq_lens, scale)
        assert (got.float() - exact.float()).abs().max() < 0.1
    return got


DTYPES = [torch.float32, torch.bfloat16]


def quantized_q(q):
    """q as the OP_MMA kernels see it: int8 per (token, head) row by the KV append rule
    (`quantize_int8_ref`), dequantized to float32."""
    codes, scale = quantize_int8_ref(q)
    return dequantize_int8_ref(codes, scale)


def q_for(cvt, q):
    """The q a reference should use for a "cvt" mode: quantized for OP_MMA (int8 q @ K^T)."""
    return quantized_q(q) if CVT_MODES[cvt][0] == OP_MMA else q


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", DECODE_CASES, ids=lambda c: f"q{c[0]}-ctx{c[1]}-h{c[2]}/{c[3]}"
                         f"-d{c[4]}-bs{c[5]}")
def test_decode_int8_matches_ref(device, dtype, case):
    q_lens, ctx_lens, heads, kv_heads, dim, block_size = case
    batch = make_batch(device, dtype, q_lens, ctx_lens, heads, kv_heads, dim, block_size)
    check_int8(int8_batch(batch), dtype, max_query_len=1, float_batch=batch)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", PREFILL_CASES, ids=lambda c: f"q{c[0]}-ctx{c[1]}-h{c[2]}/{c[3]}"
                         f"-d{c[4]}-bs{c[5]}")
def test_prefill_int8_matches_ref(device, dtype, case):
    q_lens, ctx_lens, heads, kv_heads, dim, block_size = case
    batch = make_batch(device, dtype, q_lens, ctx_lens, heads, kv_heads, dim, block_size)
    check_int8(int8_batch(batch), dtype, max_query_len=max(q_lens), float_batch=batch)


# Tiles inside one page and across pages, with and without splits (empty partitions skipped).
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("block_n", [16, 64])
def test_decode_int8_configs_match_ref(device, block_n, num_splits, block_size):
    batch = make_batch(device, torch.float32, [1, 1, 0, 1], [130, 20, 9, 37], 8, 4, 48, block_size)
    q, kc, vc, ks, vs, block_tables, qsl, seq_lens = int8_batch(batch)
    out = torch.full_like(q, float("nan"))
    decode_attention(q, kc, vc, block_tables, qsl, seq_lens, 0.1, out, num_splits=num_splits,
                     config=dict(block_n=block_n), k_scale=ks, v_scale=vs)
    ref = paged_attention_ref(q, kc, vc, block_tables, qsl, seq_lens, 0.1, k_scale=ks, v_scale=vs)
    atol, rtol = tol(torch.float32)
    torch.testing.assert_close(out, ref, atol=atol, rtol=rtol)


def test_int8_checks():
    q, kc, vc, ks, vs, block_tables, qsl, seq_lens = int8_batch(
        make_batch("cpu", torch.float32, [1], [5], 2, 1, 32, 16))
    with pytest.raises(ValueError, match="k_scale"):
        paged_attention_triton(q, kc, vc, block_tables, qsl, seq_lens, 1.0, 1)
    with pytest.raises(ValueError, match="v_scale"):
        paged_attention_ref(q, kc, vc, block_tables, qsl, seq_lens, 1.0, k_scale=ks,
                            v_scale=vs.transpose(1, 2))
    with pytest.raises(ValueError, match="int8"):
        paged_attention_triton(q, kc.to(torch.int16), vc.to(torch.int16), block_tables, qsl,
                               seq_lens, 1.0, 1)


@triton.jit
def _codes_kernel(x_ptr, out_ptr, LOWP: tl.constexpr, OP: tl.constexpr, ASM: tl.constexpr):
    offs = tl.arange(0, 256)
    tl.store(out_ptr + offs, _int8_operand(tl.load(x_ptr + offs), LOWP, OP, ASM).to(tl.float32))


@pytest.mark.parametrize("op", [OP_ADD, OP_PRMT, OP_CAST, OP_PRMT_LOAD])
@pytest.mark.parametrize("lowp", [False, True])
def test_int8_operand_is_exact(device, lowp, op):
    # Every way to make fp16 operands (LOWP; the PTX ones on CUDA only) and the float32 path
    # give every code exactly.
    codes = torch.arange(-128, 128, dtype=torch.int32).to(torch.int8).to(device)
    out = torch.empty(256, device=device)
    _codes_kernel[(1,)](codes, out, LOWP=lowp, OP=op, ASM=codes.is_cuda)
    assert torch.equal(out, codes.float())


@pytest.mark.parametrize("cvt", sorted(CVT_MODES))
def test_int8_cvt_modes_on_interpreter(monkeypatch, cvt):
    # Each decode "cvt" mode on the CUDA fp16-operand path forced on the interpreter (the PTX
    # conversions fall back to their integer twins there, so this checks the OP_WORDS loads and
    # the join/reshape order): masked tails, several pages per tile, splits.
    if not INTERPRET:
        pytest.skip("interpreter only (test_gpu_decode_int8_cvt_modes runs them for real)")
    monkeypatch.setattr(attention_decode_triton, "_dot_mode",
                        lambda q, kv_dtype=None: (True, tl.float16))
    batch = make_batch("cpu", torch.float32, [1, 1, 0, 1], [70, 20, 9, 37], 4, 2, 64, 16)
    q, kc, vc, ks, vs, block_tables, qsl, seq_lens = int8_batch(batch)
    ref = paged_attention_ref(q_for(cvt, q), kc, vc, block_tables, qsl, seq_lens, 0.125,
                              k_scale=ks, v_scale=vs)
    for num_splits in (1, 2):
        out = torch.full_like(q, float("nan"))
        decode_attention(q, kc, vc, block_tables, qsl, seq_lens, 0.125, out,
                         num_splits=num_splits, config=dict(block_n=32, cvt=cvt, maxnreg=128),
                         k_scale=ks, v_scale=vs)
        torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("cvt", ["add", "words", "load_k_words_v", "mma_k", "mma_k_words_v"])
@pytest.mark.parametrize("dim", [64, 48])
def test_prefill_int8_cvt_on_interpreter(monkeypatch, cvt, dim):
    # The prefill kernel's int8 operand methods on the CUDA fp16 path forced on the interpreter:
    # word loads (K transposed after converting, V as loaded) in masked and unmasked tiles,
    # chunked prefill over a cached prefix, a mixed decode row; head_dim 48 is not a whole tile
    # and falls back to per-element loads.
    if not INTERPRET:
        pytest.skip("interpreter only (test_gpu_prefill_int8_cvt runs them for real)")
    monkeypatch.setattr(attention_prefill_triton, "_dot_mode",
                        lambda q, kv_dtype=None: (True, tl.float16))
    q_lens, ctx_lens = [21, 1, 0, 9], [21, 37, 5, 40]
    batch = make_batch("cpu", torch.float32, q_lens, ctx_lens, 4, 2, dim, 16)
    q, kc, vc, ks, vs, block_tables, qsl, seq_lens = int8_batch(batch)
    ref = paged_attention_ref(q_for(cvt, q), kc, vc, block_tables, qsl, seq_lens, 0.125,
                              k_scale=ks, v_scale=vs)
    out = torch.full_like(q, float("nan"))
    attention_prefill_triton.prefill_attention(q, kc, vc, block_tables, qsl, seq_lens, 0.125,
                                               max(q_lens), out, k_scale=ks, v_scale=vs, cvt=cvt)
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)


def test_decode_small_batch_split_rule():
    # The second split rule applies at or below small_programs (seqs x KV heads) only.
    dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    plan = attention_decode_triton.plan_decode_splits
    kw = dict(programs_per_sm=2, min_partition=256, small_per_sm=16, small_programs=512)
    if dev.type == "cpu":  # target 8 programs whatever programs_per_sm: the rule is a no-op
        assert plan(1, 8, 1 << 20, dev, **kw) == 1
        return
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert plan(32, 8, 1 << 20, dev, **kw) == -(-16 * sms // 256)
    assert plan(256, 8, 1 << 20, dev, **kw) == -(-2 * sms // 2048)
    assert plan(32, 8, 1 << 20, dev, **dict(kw, small_per_sm=None)) == -(-2 * sms // 256)


def test_decode_cvt_mode_checked():
    q, kc, vc, ks, vs, block_tables, qsl, seq_lens = int8_batch(
        make_batch("cpu", torch.float32, [1], [5], 2, 1, 32, 16))
    with pytest.raises(ValueError, match="cvt"):
        decode_attention(q, kc, vc, block_tables, qsl, seq_lens, 1.0, torch.empty_like(q),
                         config=dict(cvt="nope"), k_scale=ks, v_scale=vs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("q_lens,ctx_lens", [([1, 1, 1], [1, 40, 33]), ([5, 0, 1, 17], [70, 4, 23, 17])])
def test_int8_cuda_operand_path_on_interpreter(monkeypatch, dtype, q_lens, ctx_lens):
    # The CUDA half-precision policy (fp16 dot operands from the bit trick, q cast once) run on
    # the interpreter by forcing LOWP, so the path is checked without a GPU. fp16 operands:
    # bf16-level tolerance.
    if not INTERPRET:
        pytest.skip("interpreter only (the GPU tests run this path for real)")
    fp16_dots = lambda q, kv_dtype=None: (True, tl.float16)  # noqa: E731
    monkeypatch.setattr(attention_decode_triton, "_dot_mode", fp16_dots)
    monkeypatch.setattr(attention_prefill_triton, "_dot_mode", fp16_dots)
    batch = make_batch("cpu", dtype, q_lens, ctx_lens, 4, 2, 64, 16)
    check_int8(int8_batch(batch), torch.bfloat16, max_query_len=max(q_lens), float_batch=batch)


# Bigger shapes run on the GPU only (the interpreter would take minutes).
@pytest.mark.parametrize("cvt", sorted(CVT_MODES))
@pytest.mark.parametrize("config", [dict(), dict(block_n=64, maxnreg=128)],
                         ids=["default", "n64-regs128"])
def test_gpu_decode_int8_cvt_modes(gpu_device, cvt, config):
    # Each int8 decode variant `bench/int8_decode.py --variants` times, at the Qwen3-0.6B head
    # shape (bf16 q): one split and forced splits, tails inside and across pages.
    ctx = [1, 17, 600, 611, 4097, 100, 2000, 129]
    batch = make_batch(gpu_device, torch.bfloat16, [1] * len(ctx), ctx, 16, 8, 128, 16)
    q, kc, vc, ks, vs, block_tables, qsl, seq_lens = int8_batch(batch)
    ref = paged_attention_ref(q_for(cvt, q), kc, vc, block_tables, qsl, seq_lens, 128 ** -0.5,
                              k_scale=ks, v_scale=vs)
    for num_splits in (1, 5):
        out = torch.full_like(q, float("nan"))
        decode_attention(q, kc, vc, block_tables, qsl, seq_lens, 128 ** -0.5, out,
                         num_splits=num_splits, config=dict(config, cvt=cvt), k_scale=ks,
                         v_scale=vs)
        atol, rtol = tol(torch.bfloat16)
        torch.testing.assert_close(out, ref.to(out.dtype), atol=atol, rtol=rtol)



@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_gpu_decode_int8_large(gpu_device, dtype):
    ctx = [1, 17, 600, 611, 4097, 100, 32768 // 4]
    batch = make_batch(gpu_device, dtype, [1] * len(ctx), ctx, 16, 8, 128, 16)
    check_int8(int8_batch(batch), dtype, max_query_len=1, float_batch=batch)
    batch = make_batch(gpu_device, dtype, [1] * 64, [613] * 64, 32, 4, 64, 32)
    check_int8(int8_batch(batch), dtype, 1, float_batch=batch)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("num_splits", [1, 4, 33])
@pytest.mark.parametrize("block_n", [16, 64, 128])
def test_gpu_decode_int8_configs(gpu_device, dtype, num_splits, block_n):
    batch = make_batch(gpu_device, dtype, [1] * 6, [1, 15, 16, 333, 2049, 700], 16, 8, 128, 16)
    q, kc, vc, ks, vs, block_tables, qsl, seq_lens = int8_batch(batch)
    out = torch.full_like(q, float("nan"))
    decode_attention(q, kc, vc, block_tables, qsl, seq_lens, 0.088, out, num_splits=num_splits,
                     config=dict(block_n=block_n), k_scale=ks, v_scale=vs)
    q_ref = quantized_q(q) if int8_quantizes_q(q, kc, 1) else q
    ref = paged_attention_ref(q_ref, kc, vc, block_tables, qsl, seq_lens, 0.088, k_scale=ks,
                              v_scale=vs)
    atol, rtol = tol(dtype)
    torch.testing.assert_close(out, ref.to(out.dtype), atol=atol, rtol=rtol)


@pytest.mark.parametrize("cvt", sorted(CVT_MODES))
@pytest.mark.parametrize("head_dim", [128, 256])
def test_gpu_prefill_int8_cvt(gpu_device, cvt, head_dim):
    # Each prefill operand method on real CUDA (PTX conversions, word loads), bf16 q.
    q_lens, ctx_lens = [700, 1, 0, 130, 64], [900, 1500, 10, 130, 64]
    batch = make_batch(gpu_device, torch.bfloat16, q_lens, ctx_lens, 16, 8, head_dim, 16)
    q, kc, vc, ks, vs, block_tables, qsl, seq_lens = int8_batch(batch)
    ref = paged_attention_ref(q_for(cvt, q), kc, vc, block_tables, qsl, seq_lens, 0.09,
                              k_scale=ks, v_scale=vs)
    out = torch.full_like(q, float("nan"))
    attention_prefill_triton.prefill_attention(q, kc, vc, block_tables, qsl, seq_lens, 0.09,
                                               700, out, k_scale=ks, v_scale=vs, cvt=cvt)
    atol, rtol = tol(torch.bfloat16)
    torch.testing.assert_close(out, ref.to(out.dtype), atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("head_dim", [64, 80, 128, 256])
def test_gpu_prefill_int8_large(gpu_device, dtype, head_dim):
    q_lens = [1000, 1, 0, 257, 64, 1]
    ctx_lens = [1000, 1500, 10, 2000, 64, 900]
    batch = make_batch(gpu_device, dtype, q_lens, ctx_lens, 16, 8, head_dim, 16)
    check_int8(int8_batch(batch), dtype, max_query_len=1000, float_batch=batch)


# OP_MMA ("mma_k" modes): q quantized to int8 per (token, head) row in the kernel, q @ K^T on
# int8 tensor cores. Two references: the same q quantization (tight: only float rounding and, on
# CUDA, the fp16 P@V differ) and the unquantized q (loose: `mma_q_bound`).
MMA_CVTS = sorted(c for c, (op_k, _) in CVT_MODES.items() if op_k == OP_MMA)


def mma_q_bound(q, kc, ks, vc, vs, scale):
    """Worst-case |output error| per (token, head) from rounding q to int8: each q element moves
    by at most amax/254, so each score by at most delta = scale * amax/254 * max ||k||_1; the
    softmax weights then move by factors within exp(+-2 delta), so the output (a weighted mean of
    V rows) by at most (exp(2 delta) - 1) * max |v|. Max norms over the whole cache (conservative)."""
    k = torch.nan_to_num(_dequantized(kc, ks).float())
    v = torch.nan_to_num(_dequantized(vc, vs).float())
    amax = q.float().abs().amax(dim=-1)
    delta = scale * amax / 254.0 * k.abs().sum(dim=-1).max()
    return (torch.exp(2 * delta) - 1) * v.abs().max()


def run_mma(kind, batch, scale, cvt, max_query_len, num_splits=None, block_n=None):
    q, kc, vc, ks, vs, block_tables, qsl, seq_lens = batch
    out = torch.full_like(q, float("nan"))
    if kind == "decode":
        cfg = dict(cvt=cvt) if block_n is None else dict(cvt=cvt, block_n=block_n)
        decode_attention(q, kc, vc, block_tables, qsl, seq_lens, scale, out,
                         num_splits=num_splits, config=cfg, k_scale=ks, v_scale=vs)
    else:
        attention_prefill_triton.prefill_attention(q, kc, vc, block_tables, qsl, seq_lens, scale,
                                                   max_query_len, out, k_scale=ks, v_scale=vs,
                                                   cvt=cvt, num_splits=num_splits)
    return out


def check_mma(kind, batch, dtype, max_query_len, scale, cvt="mma_k", **kw):
    q, kc, vc, ks, vs, block_tables, qsl, seq_lens = batch
    got = run_mma(kind, batch, scale, cvt, max_query_len, **kw)
    assert not torch.isnan(got).any(), "read KV past seq_lens (NaN trap)"
    ref_q8 = paged_attention_ref(quantized_q(q), kc, vc, block_tables, qsl, seq_lens, scale,
                                 k_scale=ks, v_scale=vs)
    atol, rtol = tol(dtype)
    torch.testing.assert_close(got.float(), ref_q8.float(), atol=atol, rtol=rtol)
    ref = paged_attention_ref(q, kc, vc, block_tables, qsl, seq_lens, scale, k_scale=ks,
                              v_scale=vs)
    err = (got.float() - ref.float()).abs()
    bound = mma_q_bound(q, kc, ks, vc, vs, scale)[..., None] + atol
    assert (err <= bound).all(), f"int8 q error {err.max():.3g} over its bound"
    # Typical (not worst-case) rounding error: independent uniform errors of +-amax/254 give
    # score errors of ~0.5% of a score's spread, so outputs of unit-variance V move ~1e-3.
    assert err.mean() < 5e-3, f"mean int8 q error {err.mean():.3g}"
    return got


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("group", [1, 2, 4])
def test_decode_int8_mma(device, dtype, group, block_size):
    # GQA groups 1/2/4, tiles across pages and masked tails, one split and three.
    ctx = [1, 37, 130, 9, 70]
    batch = make_batch(device, dtype, [1, 1, 1, 0, 1], ctx, 2 * group, 2, 64, block_size)
    for num_splits in (1, 3):
        check_mma("decode", int8_batch(batch), dtype, 1, 0.125, num_splits=num_splits,
                  block_n=32 if device == "cpu" else None)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("group", [1, 2, 4])
def test_prefill_int8_mma(device, dtype, group, block_size):
    # Fresh prompt, chunk over a cached prefix, empty row, decode row; split KV for short queries.
    q_lens, ctx_lens = [21, 9, 0, 1], [21, 40, 5, 37]
    batch = make_batch(device, dtype, q_lens, ctx_lens, 2 * group, 2, 64, block_size)
    for num_splits in (1, 2):
        check_mma("prefill", int8_batch(batch), dtype, max(q_lens), 0.125,
                  num_splits=num_splits)


@pytest.mark.parametrize("kind", ["decode", "prefill"])
@pytest.mark.parametrize("cvt", MMA_CVTS)
def test_int8_mma_fp16_path_on_interpreter(monkeypatch, kind, cvt):
    # The CUDA operand policy forced on the interpreter: int8 q @ K^T, then fp16 P@V with each
    # V method of the mma modes; head_dim 48 (not a whole tile) and 64.
    if not INTERPRET:
        pytest.skip("interpreter only (the GPU tests run this path for real)")
    fp16_dots = lambda q, kv_dtype=None: (True, tl.float16)  # noqa: E731
    monkeypatch.setattr(attention_decode_triton, "_dot_mode", fp16_dots)
    monkeypatch.setattr(attention_prefill_triton, "_dot_mode", fp16_dots)
    q_lens = [1, 1, 1] if kind == "decode" else [13, 1, 4]
    for dim in (48, 64):
        batch = make_batch("cpu", torch.bfloat16, q_lens, [50, 17, 33], 8, 2, dim, 16)
        check_mma(kind, int8_batch(batch), torch.bfloat16, max(q_lens), dim ** -0.5, cvt=cvt)


@triton.jit
def _quant_rows_kernel(x_ptr, codes_ptr, scale_ptr, D: tl.constexpr):
    rows = tl.arange(0, 16)
    offs = rows[:, None] * D + tl.arange(0, D)[None, :]
    codes, scale = _quant_rows(tl.load(x_ptr + offs))
    tl.store(codes_ptr + offs, codes)
    tl.store(scale_ptr + rows, scale)


def test_quant_rows_matches_append_rule(device):
    # The kernel's q quantization is `quantize_int8_ref` (the KV append rule): codes bit for bit
    # (halves included), scales, an all-zero row.
    x = torch.randn(16, 64) * torch.logspace(-3, 3, 16)[:, None]
    x[3] = 0.0
    x[5, :8] = torch.tensor([0.5, -0.5, 1.5, -1.5, 2.5, 126.5, -126.5, 127.0]) / 127.0
    x[5, 8] = 1.0  # amax 1: codes x * 127 with exact halves
    x = x.to(device)
    codes = torch.empty(16, 64, dtype=torch.int8, device=device)
    scale = torch.empty(16, device=device)
    _quant_rows_kernel[(1,)](x, codes, scale, D=64)
    ref_codes, ref_scale = quantize_int8_ref(x)
    assert torch.equal(codes, ref_codes)
    torch.testing.assert_close(scale, ref_scale, atol=0, rtol=0)


@pytest.mark.parametrize("kind", ["decode", "prefill"])
@pytest.mark.parametrize("cvt", MMA_CVTS)
@pytest.mark.parametrize("shape", [(16, 8, 128), (16, 16, 64), (32, 8, 128), (16, 4, 256)],
                         ids=lambda s: f"h{s[0]}/{s[1]}-d{s[2]}")
def test_gpu_int8_mma(gpu_device, kind, cvt, shape):
    # Real int8 MMAs at the project's shapes (Qwen3-0.6B 16/8 d128, GQA 1 and 4, d256 prefill
    # tiles), page 16, bf16 q, tails inside and across pages.
    heads, kv_heads, dim = shape
    if kind == "decode":
        q_lens, ctx = [1] * 8, [1, 17, 600, 611, 4097, 100, 2000, 129]
    else:
        q_lens, ctx = [700, 1, 0, 130, 64], [900, 1500, 10, 130, 64]
    batch = make_batch(gpu_device, torch.bfloat16, q_lens, ctx, heads, kv_heads, dim, 16)
    for num_splits in ((1, 5) if kind == "decode" else (None,)):
        check_mma(kind, int8_batch(batch), torch.bfloat16, max(q_lens), dim ** -0.5, cvt=cvt,
                  num_splits=num_splits)


@pytest.mark.parametrize("head_dim,mma", [(8, False), (16, False), (24, True), (32, True), (80, True)])
def test_mma_k_needs_a_reduction_of_32(head_dim, mma):
    # tl.dot on int8 needs K >= 32 after padding to a power of two; narrower heads convert K.
    from infer_cluster.kernels.attention_int8_triton import OP_MMA, OP_PRMT_LOAD, cvt_ops

    cache = torch.zeros(2, 16, 1, head_dim, dtype=torch.int8)
    assert cvt_ops("mma_k", cache, cache)[0] == (OP_MMA if mma else OP_PRMT_LOAD)
    assert cvt_ops("words_k", cache, cache)[0] != OP_MMA
