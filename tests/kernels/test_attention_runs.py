"""Decode attention over runs (`row_span`): a verify step's positions laid out as decode rows,
each run of rows one request's positions over its one block table, read once per program chunk.

The batch is `make_batch`'s (NaN traps past each request's longest context), each request then
expanded into `run` rows with contexts c - run + 1 .. c: a row that read a position past its own
context would see a real (not NaN) value and differ from the reference, which knows nothing of
runs.
"""

import pytest
import torch

from infer_cluster.kernels.attention import paged_attention_ref
from infer_cluster.kernels.attention_triton import decode_attention, paged_attention_triton
from tests.kernels.conftest import tol
from tests.kernels.test_attention import make_batch
from tests.kernels.test_attention_int8 import int8_batch, quantized_q


def spans(runs):
    """The `row_span` encoding of runs of these lengths."""
    out = []
    for n in runs:
        out += [n] + [-j for j in range(1, n)]
    return out


def run_batch(device, dtype, runs, ctx_lens, heads, kv_heads, dim, block_size):
    """(q, k, v, block tables, query starts, seq_lens, row_span): request i as `runs[i]` rows
    whose contexts end at ctx_lens[i]."""
    q, k, v, tables, _, _ = make_batch(device, dtype, [1] * len(runs), ctx_lens, heads, kv_heads,
                                       dim, block_size)
    owner = torch.tensor([i for i, n in enumerate(runs) for _ in range(n)], device=device)
    lens = [c - n + 1 + j for n, c in zip(runs, ctx_lens) for j in range(n)]
    rows = len(lens)
    q = torch.randn(rows, heads, dim, dtype=dtype).to(device)
    as_int = dict(dtype=torch.int32, device=device)
    return (q, k, v, tables[owner].contiguous(), torch.arange(rows + 1, **as_int),
            torch.tensor(lens, **as_int), torch.tensor(spans(runs), **as_int))


def _against_ref(batch, dtype, num_splits, config=None):
    q, k, v, tables, qsl, lens, span = batch
    out = torch.full_like(q, float("nan"))
    decode_attention(q, k, v, tables, qsl, lens, 0.125, out, num_splits=num_splits,
                     config=config, row_span=span)
    ref = paged_attention_ref(q, k, v, tables, qsl, lens, 0.125)
    assert not torch.isnan(out).any(), "a row was left unwritten or read past its context"
    atol, rtol = tol(dtype)
    torch.testing.assert_close(out, ref, atol=atol, rtol=rtol)


# GROUP 3 (SmolLM2's: 5 rows a program, a run of 6 in chunks of 3, 16 in four of 4), GROUP 2 and
# 1; runs of 1 between; contexts that end inside a tile, on a tile edge and under one tile.
RUN_CASES = [
    ([1, 6, 16, 2], [40, 77, 70, 18], 6, 2, 32, 16),
    ([3, 1, 9], [64, 5, 33], 4, 2, 64, 32),
    ([5, 5], [20, 49], 2, 2, 32, 16),
]


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("case", RUN_CASES, ids=lambda c: f"runs{c[0]}-h{c[2]}/{c[3]}")
def test_runs_match_ref(device, num_splits, case):
    runs, ctx, heads, kv_heads, dim, block_size = case
    batch = run_batch(device, torch.float32, runs, ctx, heads, kv_heads, dim, block_size)
    _against_ref(batch, torch.float32, num_splits)


def test_runs_of_one_and_wider_program(device):
    # Every row its own run (a plain decode step under a graph captured with spans), and 32
    # query rows a program (10 rows of GROUP 3).
    batch = run_batch(device, torch.float32, [1, 1, 1], [9, 40, 17], 6, 2, 32, 16)
    _against_ref(batch, torch.float32, 2)
    batch = run_batch(device, torch.float32, [12, 1], [50, 30], 6, 2, 32, 16)
    _against_ref(batch, torch.float32, 2, config=dict(run_block_g=32))
    _against_ref(batch, torch.float32, None, config=dict(runs_split="rows"))  # planned per row


def test_public_entry_checks_row_span(device):
    q, k, v, tables, qsl, lens, span = run_batch(device, torch.float32, [4], [21], 4, 2, 32, 16)
    got = paged_attention_triton(q, k, v, tables, qsl, lens, 0.2, 1, row_span=span)
    torch.testing.assert_close(got, paged_attention_ref(q, k, v, tables, qsl, lens, 0.2),
                               atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="row_span"):
        paged_attention_triton(q, k, v, tables, qsl, lens, 0.2, 1, row_span=span.long())


def test_int8_runs_match_ref(device):
    batch = run_batch(device, torch.float32, [6, 1, 4], [45, 12, 30], 6, 2, 32, 16)
    q, kc, vc, ks, vs, tables, qsl, lens = int8_batch(batch[:6])
    for cvt in ("add", "mma_k"):
        out = torch.full_like(q, float("nan"))
        decode_attention(q, kc, vc, tables, qsl, lens, 0.125, out, num_splits=2,
                         config=dict(cvt=cvt), k_scale=ks, v_scale=vs, row_span=batch[6])
        q_ref = quantized_q(q) if cvt == "mma_k" else q
        ref = paged_attention_ref(q_ref, kc, vc, tables, qsl, lens, 0.125, k_scale=ks, v_scale=vs)
        torch.testing.assert_close(out, ref, atol=2e-3, rtol=2e-3)


# The shapes a verify step has on the GPU: SmolLM2 (9 / 3 heads of 64) and the Qwen3-0.6B shape
# (16 / 8 of 128), batch 1 at k = 15 and batch 8 at k = 5, ~1.3k-token contexts, bf16 and int8.
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (16, 8, 128)])
@pytest.mark.parametrize("runs", [[16], [6] * 8])
def test_gpu_runs_match_ref(gpu_device, dtype, heads, kv_heads, dim, runs):
    ctx = [1300 + 37 * i for i in range(len(runs))]
    batch = run_batch(gpu_device, dtype, runs, ctx, heads, kv_heads, dim, 16)
    q, k, v, tables, qsl, lens, span = batch
    got = paged_attention_triton(q, k, v, tables, qsl, lens, dim ** -0.5, 1, row_span=span)
    ref = paged_attention_triton(q, k, v, tables, qsl, lens, dim ** -0.5, 1)
    atol, rtol = tol(dtype)
    torch.testing.assert_close(got, ref, atol=atol, rtol=rtol)
    torch.testing.assert_close(got.float(), paged_attention_ref(q, k, v, tables, qsl, lens, dim ** -0.5).float(),
                               atol=atol, rtol=rtol)
    q8, kc, vc, ks, vs = int8_batch(batch[:6])[:5]
    got8 = paged_attention_triton(q8, kc, vc, tables, qsl, lens, dim ** -0.5, 1, k_scale=ks,
                                  v_scale=vs, row_span=span)
    ref8 = paged_attention_triton(q8, kc, vc, tables, qsl, lens, dim ** -0.5, 1, k_scale=ks,
                                  v_scale=vs)
    torch.testing.assert_close(got8, ref8, atol=atol, rtol=rtol)
