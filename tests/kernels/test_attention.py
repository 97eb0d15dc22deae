"""Triton paged attention (decode split-K and varlen prefill kernels) vs `paged_attention_ref`.

Every batch is built with traps: block-table padding and the unused tail of each sequence's last
block point at NaN-filled KV, so any read past seq_lens shows up as NaN in the output.
"""

import pytest
import torch

from infer_cluster.kernels.attention import paged_attention_ref
from infer_cluster.kernels.attention_triton import decode_attention, paged_attention_triton, plan_decode_splits
from tests.kernels.conftest import tol


def make_batch(device, dtype, q_lens, ctx_lens, num_heads, num_kv_heads, head_dim, block_size):
    """Random paged batch; block ids are shuffled so sequences' pages interleave in the cache."""
    assert all(q <= c for q, c in zip(q_lens, ctx_lens))
    blocks_per_seq = [(c + block_size - 1) // block_size for c in ctx_lens]
    num_blocks = sum(blocks_per_seq) + 2
    poison = num_blocks - 1
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    k_cache[poison] = float("nan")
    v_cache[poison] = float("nan")
    ids = torch.randperm(num_blocks - 1)
    width = max(blocks_per_seq + [1]) + 2
    block_tables = torch.full((len(ctx_lens), width), poison, dtype=torch.int32)
    used = 0
    for i, (ctx, n) in enumerate(zip(ctx_lens, blocks_per_seq)):
        block_tables[i, :n] = ids[used:used + n]
        used += n
        if ctx % block_size:
            last = block_tables[i, n - 1]
            k_cache[last, ctx % block_size:] = float("nan")
            v_cache[last, ctx % block_size:] = float("nan")
    starts = [0]
    for n in q_lens:
        starts.append(starts[-1] + n)
    q = torch.randn(starts[-1], num_heads, head_dim, dtype=dtype)
    as_int = dict(dtype=torch.int32, device=device)
    return (q.to(device), k_cache.to(device), v_cache.to(device), block_tables.to(device),
            torch.tensor(starts, **as_int), torch.tensor(ctx_lens, **as_int))


def check(batch, dtype, max_query_len=None, scale=None):
    q, k_cache, v_cache, block_tables, qsl, seq_lens = batch
    scale = scale if scale is not None else q.shape[-1] ** -0.5
    got = paged_attention_triton(q, k_cache, v_cache, block_tables, qsl, seq_lens, scale,
                                 max_query_len)
    ref = paged_attention_ref(q, k_cache, v_cache, block_tables, qsl, seq_lens, scale)
    assert got.shape == q.shape and got.dtype == q.dtype
    assert not torch.isnan(got).any(), "read KV past seq_lens (NaN trap)"
    atol, rtol = tol(dtype)
    torch.testing.assert_close(got, ref, atol=atol, rtol=rtol)
    return got


DTYPES = [torch.float32, torch.bfloat16]


# (q_lens, ctx_lens, num_heads, num_kv_heads, head_dim, block_size); one query row per sequence
# at most, so these take the decode kernel. GQA ratios 1/2/4/8, page sizes 16/32, empty rows.
DECODE_CASES = [
    ([1, 1, 1], [1, 7, 33], 2, 2, 32, 16),
    ([1, 0, 1], [40, 5, 17], 4, 2, 64, 32),
    ([1, 1], [16, 70], 4, 1, 128, 16),
    ([0, 1, 1], [3, 49, 32], 8, 1, 48, 16),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", DECODE_CASES, ids=lambda c: f"q{c[0]}-ctx{c[1]}-h{c[2]}/{c[3]}"
                         f"-d{c[4]}-bs{c[5]}")
def test_decode_matches_ref(device, dtype, case):
    q_lens, ctx_lens, heads, kv_heads, dim, block_size = case
    batch = make_batch(device, dtype, q_lens, ctx_lens, heads, kv_heads, dim, block_size)
    check(batch, dtype, max_query_len=1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_splits,heads,kv_heads,dim,block_size", [
    (3, 4, 2, 64, 16), (8, 4, 2, 64, 16), (5, 8, 2, 80, 32)])
def test_decode_split_k_matches_ref(device, dtype, num_splits, heads, kv_heads, dim, block_size):
    # Forced split counts: each sequence is cut evenly by its own length (whole tiles), so some
    # partitions of the short sequences are empty and must be skipped by the reduce.
    batch = make_batch(device, dtype, [1, 1, 0], [130, 20, 9], heads, kv_heads, dim, block_size)
    q, k_cache, v_cache, block_tables, qsl, seq_lens = batch
    out = torch.full_like(q, 7.0)
    decode_attention(q, k_cache, v_cache, block_tables, qsl, seq_lens, 0.1, out,
                     num_splits=num_splits)
    ref = paged_attention_ref(q, k_cache, v_cache, block_tables, qsl, seq_lens, 0.1)
    atol, rtol = tol(dtype)
    torch.testing.assert_close(out, ref, atol=atol, rtol=rtol)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_longest_first_matches_row_order(device, num_splits):
    # The launch order moves which program takes which sequence, never what it computes: the
    # output equals the row-order launch bit for bit, empty and padded rows included, for the
    # longest-first order and for a scrambled one.
    from infer_cluster.kernels.attention import decode_order
    batch = make_batch(device, torch.float32, [1, 1, 0, 1, 1], [130, 20, 9, 75, 1], 4, 2, 64, 16)
    q, k_cache, v_cache, block_tables, qsl, seq_lens = batch
    order = decode_order(seq_lens)
    assert order.tolist() == [0, 3, 1, 2, 4] and order.dtype == torch.int32
    want = torch.full_like(q, 7.0)
    decode_attention(q, k_cache, v_cache, block_tables, qsl, seq_lens, 0.1, want, num_splits=num_splits)
    for perm in (order, torch.tensor([4, 2, 0, 1, 3], dtype=torch.int32, device=device)):
        got = torch.full_like(q, 7.0)
        paged_attention_triton(q, k_cache, v_cache, block_tables, qsl, seq_lens, 0.1, 1, order=perm)
        decode_attention(q, k_cache, v_cache, block_tables, qsl, seq_lens, 0.1, got,
                         num_splits=num_splits, order=perm)
        assert torch.equal(got, want)
    if num_splits == 1:  # and it is read: an order naming sequence 0 only leaves the rest unwritten
        got = torch.full_like(q, 7.0)
        decode_attention(q, k_cache, v_cache, block_tables, qsl, seq_lens, 0.1, got,
                         num_splits=1, order=torch.zeros_like(order))
        assert torch.equal(got[0], want[0]) and (got[1:] == 7.0).all()
    with pytest.raises(ValueError, match="order must be int32"):
        paged_attention_triton(q, k_cache, v_cache, block_tables, qsl, seq_lens, 0.1, 1,
                               order=order.long())


def test_decode_long_context_plans_a_split(device):
    # Through the public entry: a few programs and a long context must split (flash-decoding).
    batch = make_batch(device, torch.float32, [1], [601], 4, 2, 32, 32)
    assert plan_decode_splits(1, 2, batch[3].shape[1] * 32, torch.device(device)) > 1
    check(batch, torch.float32, max_query_len=1)


def test_wave_splits_even_out_a_short_last_wave():
    """Two partitions only where one gives more than a wave and a last wave under the fill."""
    from infer_cluster.kernels.attention_decode_plan import wave_splits

    slots = 3 * 132
    assert wave_splits(384, slots, 0.6) == 1           # one wave (batch 48 x 8 KV heads)
    assert wave_splits(512, slots, 0.6) == 2           # 1.29 waves (batch 64)
    assert wave_splits(768, slots, 0.6) == 1           # 1.94 waves (batch 96)
    assert wave_splits(2048, slots, 0.6) == 2          # 5.17 waves (batch 256)
    assert wave_splits(2048, slots, 0.1) == 1          # a lower fill keeps one
    assert wave_splits(2048, 0, 0.6) == 1


def test_float_decode_splits_few_sequences_for_four_programs_a_sm(monkeypatch):
    """The float-cache config's small-batch rule (`DECODE_TUNED`'s small_per_sm / small_programs)
    on a 132-SM device: up to 128 (sequence, KV head) items aim at 4 programs a SM, more at 2."""
    from infer_cluster.kernels import attention_decode_plan as plan

    monkeypatch.setitem(plan._sm_counts, 0, 132)
    cuda = torch.device("cuda", 0)
    cfg = plan.DECODE_TUNED
    rule = dict(small_per_sm=cfg["small_per_sm"], small_programs=cfg["small_programs"])
    got = {b: plan.plan_decode_splits(b, 8, 4096, cuda, None, cfg["programs_per_sm"], 256, **rule)
           for b in (4, 8, 12, 16, 17, 32)}
    assert got == {4: 16, 8: 9, 12: 6, 16: 5, 17: 2, 32: 2}
    assert plan.plan_decode_splits(8, 8, 4096, cuda, None, 2, 256) == 5  # without the rule
    assert plan.plan_decode_splits(8, 8, 1024, cuda, None, 2, 256, **rule) == 4  # partitions of >= 256 tokens


def test_split_plan_applies_the_wave_rule(monkeypatch):
    """On a CUDA device of 132 SMs (its SM count cached, so no GPU is needed) the plan gives two
    partitions exactly where `wave_splits` does, only with the rule's keys, and not with
    `INFER_CLUSTER_DECODE_WAVES=0`."""
    from infer_cluster.kernels import attention_decode_plan as plan

    monkeypatch.setitem(plan._sm_counts, 0, 132)
    cuda = torch.device("cuda", 0)
    rule = dict(resident_per_sm=3, wave_fill=0.6)
    got = {b: plan.plan_decode_splits(b, 8, 4096, cuda, None, 2, 256, **rule) for b in (48, 64, 96, 256)}
    assert got == {48: 1, 64: 2, 96: 1, 256: 2}
    assert plan.plan_decode_splits(64, 8, 4096, cuda, None, 2, 256) == 1  # no rule keys (int8)
    assert plan.plan_decode_splits(64, 8, 200, cuda, None, 2, 256, **rule) == 1  # < 2 partitions of tokens
    monkeypatch.setenv("INFER_CLUSTER_DECODE_WAVES", "0")
    assert plan.plan_decode_splits(64, 8, 4096, cuda, None, 2, 256, **rule) == 1


def test_split_plan_uses_shapes_only():
    cpu = torch.device("cpu")
    assert plan_decode_splits(256, 8, 4096, cpu) == 1            # the batch fills the device
    assert 1 < plan_decode_splits(1, 1, 40960, cpu) <= 64
    assert plan_decode_splits(1, 1, 100, cpu) == 1               # < 2 x _MIN_PARTITION tokens
    assert plan_decode_splits(1, 1, 100, cpu, num_splits=50) == 50  # forced (empty ones are cheap)


# Decode launch variants (`decode_attention(config=...)`): tiles inside one page (one table
# lookup per tile) or across pages (one per token), with and without splits, page sizes 16/32.
# ctx 130/20/9/37: partial tiles, partial pages, empty partitions.
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("block_n", [16, 32, 64])
def test_decode_configs_match_ref(device, block_n, num_splits, block_size):
    dtype = torch.float32  # bf16 takes the same paths (test_gpu_decode_configs covers it on CUDA)
    batch = make_batch(device, dtype, [1, 1, 0, 1], [130, 20, 9, 37], 8, 4, 48, block_size)
    q, k_cache, v_cache, block_tables, qsl, seq_lens = batch
    out = torch.full_like(q, float("nan"))
    decode_attention(q, k_cache, v_cache, block_tables, qsl, seq_lens, 0.1, out,
                     num_splits=num_splits, config=dict(block_n=block_n))
    ref = paged_attention_ref(q, k_cache, v_cache, block_tables, qsl, seq_lens, 0.1)
    atol, rtol = tol(dtype)
    torch.testing.assert_close(out, ref, atol=atol, rtol=rtol)


# The first K/V tile loaded before the PDL wait (`preload`, on by default where PDL is): the same
# results, whatever the split, tile and page; ctx 1 (the appended row is the whole context),
# a context of whole tiles, empty partitions and a row with no query.
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_splits,block_n,block_size", [(1, 16, 16), (3, 16, 32), (8, 32, 16),
                                                           (2, 64, 16)])
def test_decode_preload_matches_ref(device, dtype, num_splits, block_n, block_size):
    batch = make_batch(device, dtype, [1, 1, 0, 1, 1], [130, 1, 9, 64, 37], 8, 2, 64, block_size)
    q, k_cache, v_cache, block_tables, qsl, seq_lens = batch
    ref = paged_attention_ref(q, k_cache, v_cache, block_tables, qsl, seq_lens, 0.1)
    atol, rtol = tol(dtype)
    for preload in (True, False):
        out = torch.full_like(q, float("nan"))
        decode_attention(q, k_cache, v_cache, block_tables, qsl, seq_lens, 0.1, out,
                         num_splits=num_splits, config=dict(block_n=block_n, preload=preload))
        assert not torch.isnan(out).any(), "read KV past seq_lens (NaN trap)"
        torch.testing.assert_close(out, ref, atol=atol, rtol=rtol)


# Prefill / chunked prefill / mixed: odd lengths, prefixes longer than the query, q_len 0 rows,
# decode rows mixed in, GQA, padded head dims (48, 80), page sizes 16/32.
PREFILL_CASES = [
    ([7, 1, 33], [7, 1, 33], 2, 2, 32, 16),            # plain prefill, odd lengths
    ([5, 0, 1, 17], [70, 4, 23, 17], 4, 2, 64, 16),    # cached prefixes, empty, decode row
    ([3, 20], [52, 40], 8, 1, 80, 32),                  # chunked prefill, GQA 8, padded dim
    ([1, 18], [1, 18], 4, 1, 48, 16),                   # GQA 4, padded dim
    ([2, 1, 9], [33, 64, 9], 2, 1, 128, 32),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", PREFILL_CASES, ids=lambda c: f"q{c[0]}-ctx{c[1]}-h{c[2]}/{c[3]}"
                         f"-d{c[4]}-bs{c[5]}")
def test_prefill_matches_ref(device, dtype, case):
    q_lens, ctx_lens, heads, kv_heads, dim, block_size = case
    batch = make_batch(device, dtype, q_lens, ctx_lens, heads, kv_heads, dim, block_size)
    check(batch, dtype, max_query_len=max(q_lens))


@pytest.mark.parametrize("num_splits", [1, 2, 8])
@pytest.mark.parametrize("case", [([3, 0, 10, 1], [200, 5, 150, 64], 4, 2, 64, 16),   # suffixes after long prefixes
                                  ([2, 40], [9, 40], 2, 1, 32, 16)],                  # a split past the context
                         ids=["suffixes", "short-ctx"])
def test_prefill_split_kv_matches_ref(device, num_splits, case):
    """Split KV (each query's keys in `num_splits` slices, merged by log-sum-exp) equals the
    reference, including slices that hold no key and empty queries."""
    from infer_cluster.kernels.attention_prefill_triton import prefill_attention, prefill_splits

    q_lens, ctx_lens, heads, kv_heads, dim, block_size = case
    q, k_cache, v_cache, block_tables, qsl, seq_lens = make_batch(
        device, torch.float32, q_lens, ctx_lens, heads, kv_heads, dim, block_size)
    out = torch.zeros_like(q)
    prefill_attention(q, k_cache, v_cache, block_tables, qsl, seq_lens, dim ** -0.5, max(q_lens), out,
                      num_splits=num_splits)
    ref = paged_attention_ref(q, k_cache, v_cache, block_tables, qsl, seq_lens, dim ** -0.5)
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)
    assert prefill_splits(10) > 1 and prefill_splits(4096) == 1
    with pytest.raises(ValueError, match="power of two"):
        prefill_attention(q, k_cache, v_cache, block_tables, qsl, seq_lens, 1.0, max(q_lens), out, num_splits=3)


@pytest.mark.parametrize("pack_gqa", [True, False])
@pytest.mark.parametrize("num_splits", [1, 4])
@pytest.mark.parametrize("case", [([6, 1, 11, 0], [40, 17, 11, 3], 6, 2, 32, 16),   # GROUP 3: a group straddles tiles
                                  ([9, 1], [100, 33], 16, 2, 32, 16)],              # GROUP 8: half a tile's rows
                         ids=["group3", "group8"])
def test_prefill_gqa_packing_matches_ref(device, pack_gqa, num_splits, case):
    """GQA packing (a tile's rows are the query heads of one KV head, position-major) equals the
    reference with and without split KV, for groups that do not divide the tile's rows."""
    from infer_cluster.kernels.attention_prefill_triton import prefill_attention

    q_lens, ctx_lens, heads, kv_heads, dim, block_size = case
    q, k_cache, v_cache, block_tables, qsl, seq_lens = make_batch(
        device, torch.float32, q_lens, ctx_lens, heads, kv_heads, dim, block_size)
    out = torch.full_like(q, float("nan"))
    prefill_attention(q, k_cache, v_cache, block_tables, qsl, seq_lens, dim ** -0.5, max(q_lens), out,
                      num_splits=num_splits, pack_gqa=pack_gqa)
    ref = paged_attention_ref(q, k_cache, v_cache, block_tables, qsl, seq_lens, dim ** -0.5)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("mixed_decode", [True, False])
@pytest.mark.parametrize("q_lens", [[1, 5, 1, 0, 12], [1, 70, 1, 1]], ids=["split-kv", "long-query"])
def test_mixed_step_decode_rows(device, monkeypatch, mixed_decode, q_lens):
    """A mixed step: one-row sequences (decode rows) go to the decode kernel after the prefill
    kernel, whose merge of split KV (queries of at most 64 rows) writes every row; the result
    equals the reference either way, and the NaN traps stay unread."""
    import infer_cluster.kernels.attention_triton as at

    monkeypatch.setattr(at, "MIXED_DECODE", mixed_decode)
    ctx_lens = [40 + 3 * q + 17 * i for i, q in enumerate(q_lens)]
    batch = make_batch(device, torch.float32, q_lens, ctx_lens, 4, 2, 32, 16)
    check(batch, torch.float32, max_query_len=max(q_lens))


@pytest.mark.parametrize("longest_first", [True, False])
@pytest.mark.parametrize("num_splits", [1, 2])
def test_prefill_longest_first_covers_every_tile(device, longest_first, num_splits):
    """A dense grid (two chunks over cached prefixes, two head groups, several query blocks)
    dealt out last block first: every row is written once and equals the reference."""
    from infer_cluster.kernels.attention_prefill_plan import _tiles, prefill_tiles
    from infer_cluster.kernels.attention_prefill_triton import prefill_attention

    q_lens, ctx_lens = [20, 37], [50, 60]
    q, k_cache, v_cache, block_tables, qsl, seq_lens = make_batch(
        device, torch.float32, q_lens, ctx_lens, 4, 2, 32, 16)
    block_m = _tiles(q, 32)[0]
    assert prefill_tiles(2, q.shape[0], max(q_lens), 2, block_m)[1] > 1  # dense, several blocks
    out = torch.full_like(q, float("nan"))
    prefill_attention(q, k_cache, v_cache, block_tables, qsl, seq_lens, 32 ** -0.5, max(q_lens), out,
                      num_splits=num_splits, longest_first=longest_first)
    ref = paged_attention_ref(q, k_cache, v_cache, block_tables, qsl, seq_lens, 32 ** -0.5)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("num_splits", [1, 4])
def test_prefill_over_a_padded_graph_bucket(device, num_splits):
    """A CUDA-graph bucket's shapes: more sequences than one scan chunk of `_tile_owner` (128),
    most of them empty (query length 0), the real ones at both ends, a max_query_len far above
    any query, and padding tokens after the last query that belong to no sequence. The real rows
    equal the reference; the grid has one program per query tile, not per (sequence, block)."""
    from infer_cluster.kernels.attention_prefill_plan import prefill_tiles
    from infer_cluster.kernels.attention_prefill_triton import prefill_attention

    q_lens = [5, 0, 1] + [0] * 140 + [12, 1, 0]
    ctx_lens = [9, 0, 20] + [0] * 140 + [12, 33, 0]
    q, k_cache, v_cache, block_tables, qsl, seq_lens = make_batch(
        device, torch.float32, q_lens, ctx_lens, 4, 2, 32, 16)
    real = q.shape[0]
    padded = torch.cat([q, torch.randn(21, 4, 32, device=q.device)])  # the bucket's tail
    out = torch.full_like(padded, float("nan"))
    prefill_attention(padded, k_cache, v_cache, block_tables, qsl, seq_lens, 32 ** -0.5, 64, out,
                      num_splits=num_splits)
    ref = paged_attention_ref(q, k_cache, v_cache, block_tables, qsl, seq_lens, 32 ** -0.5)
    torch.testing.assert_close(out[:real], ref, atol=2e-5, rtol=2e-5)
    if num_splits == 1:  # no sequence owns the padding tokens (split KV's merge writes every row)
        assert torch.isnan(out[real:]).all()
    # 146 sequences, 40 tokens, GQA packing 2, 16-row tiles: 5 + 146 programs, not 146 x 8;
    # one 40-token prompt keeps the (sequence, query block) grid: 5 programs, no scan
    assert prefill_tiles(146, 40, 64, 2, 16) == (151, 0) and prefill_tiles(1, 40, 40, 2, 16) == (5, 5)


def test_max_query_len_fallback_and_strided_q(device):
    # No max_query_len (host fallback), and q as a slice of a fused qkv tensor.
    q, k_cache, v_cache, block_tables, qsl, seq_lens = make_batch(
        device, torch.float32, [4, 1], [10, 30], 4, 2, 32, 16)
    qkv = torch.randn(q.shape[0], 8 * 32, device=device)
    qkv[:, :4 * 32] = q.reshape(q.shape[0], -1)
    q_view = qkv[:, :4 * 32].view(q.shape[0], 4, 32)
    assert not q_view.is_contiguous()
    check((q_view, k_cache, v_cache, block_tables, qsl, seq_lens), torch.float32)


def test_all_empty_and_bad_shapes():
    q, k_cache, v_cache, block_tables, qsl, seq_lens = make_batch(
        "cpu", torch.float32, [0, 0], [3, 5], 2, 1, 32, 16)
    assert paged_attention_triton(q, k_cache, v_cache, block_tables, qsl, seq_lens, 1.0).shape \
        == (0, 2, 32)
    with pytest.raises(ValueError, match="do not fit"):
        wide = k_cache.expand(-1, -1, 2, -1)
        paged_attention_triton(torch.zeros(1, 3, 32), wide, wide, block_tables, qsl, seq_lens, 1.0)


# Bigger shapes run on the GPU only (the interpreter would take minutes).
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_gpu_decode_large(gpu_device, dtype):
    ctx = [1, 17, 600, 611, 4097, 100, 32768 // 4]
    batch = make_batch(gpu_device, dtype, [1] * len(ctx), ctx, 16, 8, 128, 16)
    check(batch, dtype, max_query_len=1)
    check(make_batch(gpu_device, dtype, [1] * 64, [613] * 64, 32, 4, 64, 32), dtype, 1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("head_dim,heads,kv_heads", [(80, 16, 8), (256, 8, 2), (128, 8, 8)])
def test_gpu_decode_default_shapes(gpu_device, dtype, head_dim, heads, kv_heads):
    ctx = [1, 17, 600, 611, 4097, 100, 1500]
    check(make_batch(gpu_device, dtype, [1] * len(ctx), ctx, heads, kv_heads, head_dim, 16),
          dtype, max_query_len=1)


GPU_DECODE_CONFIGS = [dict(block_n=b, num_warps=w, num_stages=st)
                      for b, w, st in [(16, 4, 4), (32, 4, 3), (64, 4, 2), (64, 4, 3), (128, 8, 2)]]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("num_splits", [1, 4, 33])
@pytest.mark.parametrize("config", GPU_DECODE_CONFIGS, ids=lambda c: "-".join(
    f"{k}{v}" for k, v in c.items()))
def test_gpu_decode_configs(gpu_device, dtype, num_splits, config):
    # Launch variants the tuner tries, at the Qwen3-0.6B head shape with traps.
    batch = make_batch(gpu_device, dtype, [1] * 6, [1, 15, 16, 333, 2049, 700], 16, 8, 128, 16)
    q, k_cache, v_cache, block_tables, qsl, seq_lens = batch
    out = torch.full_like(q, float("nan"))
    decode_attention(q, k_cache, v_cache, block_tables, qsl, seq_lens, 0.088, out,
                     num_splits=num_splits, config=config)
    ref = paged_attention_ref(q, k_cache, v_cache, block_tables, qsl, seq_lens, 0.088)
    atol, rtol = tol(dtype)
    torch.testing.assert_close(out, ref, atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("head_dim", [64, 80, 128, 256])
def test_gpu_prefill_large(gpu_device, dtype, head_dim):
    q_lens = [1000, 1, 0, 257, 64, 1]
    ctx_lens = [1000, 1500, 10, 2000, 64, 900]
    batch = make_batch(gpu_device, dtype, q_lens, ctx_lens, 16, 8, head_dim, 16)
    check(batch, dtype, max_query_len=1000)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_prefill_wide_tiles(gpu_device, dtype):
    """Steps of long queries (a mean of `WIDE_MIN_QUERY` tokens a sequence or more) take the wide
    tiles: chunks over cached prefixes, a fresh prompt, a one-token row, odd lengths."""
    from infer_cluster.kernels.attention_prefill_plan import WIDE_MIN_QUERY, _tiles
    q_lens = [1000, 1, 300, 257, 700]
    ctx_lens = [3000, 1500, 300, 2000, 701]
    assert sum(q_lens) // len(q_lens) >= WIDE_MIN_QUERY
    batch = make_batch(gpu_device, dtype, q_lens, ctx_lens, 16, 8, 128, 16)
    assert _tiles(batch[0], 128, False, sum(q_lens) // len(q_lens))[0] == 128
    check(batch, dtype, max_query_len=1000)


def test_prefill_tiles_follow_the_mean_query():
    """The wide tiles only for 16-bit queries at head_dim 128, a float cache, and a step whose
    sequences average `WIDE_MIN_QUERY` tokens or more; 64 x 64 otherwise."""
    import types

    from infer_cluster.kernels.attention_prefill_plan import WIDE_MIN_QUERY, _tiles
    bf16 = types.SimpleNamespace(is_cuda=True, dtype=torch.bfloat16)
    assert _tiles(bf16, 128, False, WIDE_MIN_QUERY) == (128, 64, 8, 4)
    assert _tiles(bf16, 128, False, WIDE_MIN_QUERY - 1) == (64, 64, 4, 3)
    assert _tiles(bf16, 128, True, 4096) == (64, 64, 4, 3)
    assert _tiles(bf16, 64, False, 4096) == (64, 64, 4, 3)
    fp32 = types.SimpleNamespace(is_cuda=True, dtype=torch.float32)
    assert _tiles(fp32, 128, False, 4096) == (32, 16, 8, 2)
