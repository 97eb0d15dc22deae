"""The Gluon prefill kernels (`_prefill_gluon_kernel` over float caches,
`_prefill_int8_gluon_kernel` over int8 ones) against `paged_attention_ref` and the Triton
prefill kernel they stand in for: dense and scanned grids, longest first or not, chunks over
cached prefixes, fresh prompts, a mixed step's decode rows left to the decode kernel, a padded
CUDA-graph bucket, tile variants, and the NaN traps past every context (in the scales for int8).
Their sm_90 builds (no spills, warpgroup MMAs, two programs a SM) are checked on any machine."""

import pytest
import torch

from infer_cluster.kernels.attention import paged_attention_ref
from infer_cluster.kernels.attention_prefill_gluon import GLUON_TILES, prefill_gluon_fits
from infer_cluster.kernels.attention_prefill_int8_gluon import prefill_int8_gluon_fits
from infer_cluster.kernels.attention_prefill_triton import prefill_attention
from tests.kernels.conftest import sm90_check, tol
from tests.kernels.test_attention import make_batch
from tests.kernels.test_attention_int8 import int8_batch

BUILD = sm90_check("prefill_gluon_build", """
from bench.ptxas_gluon import prefill_gluon_variants
from bench.sm90_build import compile_sm90, ptxas_report, sass_counts
for name, kernel, ptrs, ints, consts, opts, dns in prefill_gluon_variants():
    c = compile_sm90(kernel, ptrs, ints, consts, opts, dns)
    r = ptxas_report(c.asm["ptx"])
    ptx = c.asm["ptx"]
    print(r["regs"], r["spills"], c.metadata.shared, ptx.count("wgmma.mma_async"),
          ptx.count("wgmma.wait_group"), int(r["wgmma_serialized"]), sass_counts(c.asm["cubin"])["LDG"])
""")


def test_sm90_build_fits_without_spills(sm90_builds):
    """Float and int8 caches, dense and scanned grids: no spills, two programs' registers and
    shared memory fit a SM
    (what its tiles were chosen for), and the MMAs are warpgroup MMAs waited for three times
    (the scores, the values in the loop, the last tile's values) that ptxas keeps asynchronous:
    the int8 kernel once wrote P's next fp16 registers before the wait for the P @ V reading
    them, and ptxas serialized every wgmma of it (C7513) without failing the build. The int8
    kernel's global loads stay as few as the float kernel's (its scales ride in the tiles'
    copies): loading each score column's scales had taken 117 LDG against 21."""
    rows = [tuple(map(int, line.split())) for line in sm90_builds.get(BUILD).splitlines()]
    assert len(rows) == 4  # float and int8 caches, dense and scanned grids
    warps = GLUON_TILES[2]
    float_ldg = max(row[-1] for row in rows[:2])
    for regs, spills, shared, mmas, waits, serialized, ldg in rows:
        assert ldg <= float_ldg + 8, (ldg, float_ldg)
        assert spills == 0
        assert 2 * (-(-regs // 8) * 8) * 32 * warps <= 65536, regs  # allocated 8 at a time
        assert 2 * (shared + 1024) <= 228 * 1024, shared
        assert mmas > 0 and waits == 3, (mmas, waits)
        assert not serialized, "ptxas serialized the warpgroup MMAs"


def _run(batch, max_query_len, gluon, **kw):
    """One prefill call, unsplit (short queries would otherwise take split KV, which the Gluon
    kernel leaves to the Triton one), on an output of NaN."""
    q, k_cache, v_cache, block_tables, qsl, seq_lens = batch
    out = torch.full_like(q, float("nan"))
    prefill_attention(q, k_cache, v_cache, block_tables, qsl, seq_lens, 0.088, max_query_len, out,
                      num_splits=1, gluon=gluon, **kw)
    return out


def _assert_rows(got, ref, other, rows, dtype):
    atol, rtol = tol(dtype)
    assert not torch.isnan(got[rows]).any(), "read KV past a context (NaN trap) or left a row"
    torch.testing.assert_close(got[rows], ref[rows], atol=atol, rtol=rtol)
    torch.testing.assert_close(got[rows], other[rows], atol=atol, rtol=rtol)


CASES = {
    "chunks-over-prefix": ([1024, 700], [3072, 2000]),  # a dense grid, several query blocks
    "fresh-prompts": ([100, 1024, 333, 65, 2, 17], [100, 1024, 333, 65, 2, 17]),
    "short-context": ([3, 40], [9, 40]),  # contexts inside the first key tile
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("longest_first", [True, False])
def test_gpu_matches_reference_and_triton(gpu_device, dtype, case, longest_first):
    q_lens, ctx_lens = CASES[case]
    batch = make_batch(gpu_device, dtype, q_lens, ctx_lens, 16, 8, 128, 16)
    q, k_cache, v_cache = batch[:3]
    assert prefill_gluon_fits(q, k_cache, v_cache, q, 1, 2)
    got = _run(batch, max(q_lens), True, longest_first=longest_first)
    other = _run(batch, max(q_lens), False, longest_first=longest_first)
    ref = paged_attention_ref(*batch, 0.088)
    _assert_rows(got, ref, other, slice(None), dtype)


@pytest.mark.parametrize("tiles", [(128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 3),
                                   (64, 64, 4, 3)], ids=lambda t: "x".join(map(str, t)))
def test_gpu_tile_variants(gpu_device, tiles):
    """The tiles the bench sweeps (`bench/int8_prefill.py --gluon`), at GQA 2 and 4."""
    for heads, kv_heads in ((16, 8), (16, 4)):
        batch = make_batch(gpu_device, torch.bfloat16, [513, 64, 2], [1500, 64, 90], heads,
                           kv_heads, 128, 16)
        got = _run(batch, 513, True, tiles=tiles)
        ref = paged_attention_ref(*batch, 0.088)
        _assert_rows(got, ref, _run(batch, 513, False), slice(None), torch.bfloat16)


def test_gpu_mixed_step_and_padded_bucket(gpu_device):
    """A mixed step's shapes as a CUDA-graph bucket gives them: decode rows (left to the decode
    kernel: their rows stay unwritten here), empty sequences past one scan chunk, prompts at
    both ends, and padding tokens owned by no sequence (never written)."""
    q_lens = [300, 1, 0, 1] + [0] * 130 + [1, 77, 1]
    ctx_lens = [300, 900, 0, 40] + [0] * 130 + [1200, 500, 3]
    batch = make_batch(gpu_device, torch.bfloat16, q_lens, ctx_lens, 16, 8, 128, 16)
    q = batch[0]
    real = q.shape[0]
    padded = torch.cat([q, torch.randn(40, 16, 128, device=q.device, dtype=q.dtype)])
    bucket = (padded, *batch[1:])
    got = _run(bucket, 512, True, skip_single=True)
    other = _run(bucket, 512, False, skip_single=True)
    ref = paged_attention_ref(*batch, 0.088)
    qsl = batch[4].tolist()
    prompt = torch.zeros(padded.shape[0], dtype=torch.bool, device=q.device)
    for i, n in enumerate(q_lens):
        if n > 1:
            prompt[qsl[i]:qsl[i + 1]] = True
    _assert_rows(got[:real], ref, other[:real], prompt[:real], torch.bfloat16)
    assert torch.isnan(got[~prompt]).all(), "wrote a decode row or a padding token"


def test_gpu_entry_point_takes_it(gpu_device):
    """`paged_attention_triton` on a mixed step: prompts through the Gluon kernel, decode rows
    through the decode kernel, the whole output equal to the reference."""
    from infer_cluster.kernels.attention_triton import paged_attention_triton
    batch = make_batch(gpu_device, torch.bfloat16, [1, 600, 1, 257], [700, 600, 33, 1000], 16, 8,
                       128, 16)
    got = paged_attention_triton(*batch, 0.088, 600)
    ref = paged_attention_ref(*batch, 0.088)
    atol, rtol = tol(torch.bfloat16)
    torch.testing.assert_close(got, ref, atol=atol, rtol=rtol)


def test_fits_only_what_it_was_written_for():
    """CPU tensors, float32, int8 caches, other head dims and split KV keep the Triton kernel."""
    q = torch.zeros(4, 16, 128, dtype=torch.bfloat16)
    cache = torch.zeros(2, 16, 8, 128, dtype=torch.bfloat16)
    assert not prefill_gluon_fits(q, cache, cache, q, 1, 2)  # not CUDA
    if torch.cuda.is_available():
        qc, cc = q.cuda(), cache.cuda()
        sm90 = torch.cuda.get_device_capability()[0] == 9
        assert prefill_gluon_fits(qc, cc, cc, qc, 1, 2) == sm90
        assert not prefill_gluon_fits(qc, cc, cc, qc, 8, 2)
        assert not prefill_gluon_fits(qc.float(), cc.float(), cc.float(), qc.float(), 1, 2)
        i8 = cc.to(torch.int8)
        assert not prefill_gluon_fits(qc, i8, i8, qc, 1, 2)
        assert prefill_int8_gluon_fits(qc, i8, i8, None, None, qc, 1, 2) == sm90
        assert not prefill_int8_gluon_fits(qc, cc, cc, None, None, qc, 1, 2)
        assert not prefill_gluon_fits(qc[..., :64], cc[..., :64], cc[..., :64], qc[..., :64], 1, 2)


def _run_int8(batch, max_query_len, gluon, **kw):
    """`_run` over the int8 cache of `batch` (`int8_batch`); the Triton side with "mma_k" (q as
    int8 codes), as the Gluon kernel computes."""
    q, kc, vc, ks, vs, block_tables, qsl, seq_lens = batch
    out = torch.full_like(q, float("nan"))
    prefill_attention(q, kc, vc, block_tables, qsl, seq_lens, 0.088, max_query_len, out,
                      k_scale=ks, v_scale=vs, num_splits=1, gluon=gluon,
                      cvt=None if gluon else "mma_k", **kw)
    return out


def _int8_ref(batch):
    """The reference on the int8 cache with q's int8 codes dequantized (the "mma_k" method)."""
    from tests.kernels.test_attention_int8 import quantized_q
    q, kc, vc, ks, vs, block_tables, qsl, seq_lens = batch
    return paged_attention_ref(quantized_q(q), kc, vc, block_tables, qsl, seq_lens, 0.088, k_scale=ks,
                               v_scale=vs).to(q.dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("longest_first", [True, False])
def test_gpu_int8_matches_reference_and_triton(gpu_device, dtype, case, longest_first):
    """Over an int8 cache (NaN scales past every context): the reference on the same codes with
    q's codes, and the Triton kernel's "mma_k" method."""
    q_lens, ctx_lens = CASES[case]
    batch = int8_batch(make_batch(gpu_device, dtype, q_lens, ctx_lens, 16, 8, 128, 16))
    q, kc, vc, ks, vs = batch[:5]
    assert prefill_int8_gluon_fits(q, kc, vc, ks, vs, q, 1, 2)
    got = _run_int8(batch, max(q_lens), True, longest_first=longest_first)
    other = _run_int8(batch, max(q_lens), False, longest_first=longest_first)
    _assert_rows(got, _int8_ref(batch), other, slice(None), dtype)


def test_gpu_int8_mixed_step_and_entry_point(gpu_device):
    """A mixed step over an int8 cache: prompts through the Gluon kernel (decode rows and a
    graph bucket's padding left unwritten), then the whole step through
    `paged_attention_triton`, equal to the reference with q's codes (`int8_quantizes_q` holds
    for prompts and decode rows alike)."""
    from infer_cluster.kernels.attention_triton import int8_quantizes_q, paged_attention_triton
    q_lens = [300, 1, 0, 1] + [0] * 130 + [1, 77, 1]
    ctx_lens = [300, 900, 0, 40] + [0] * 130 + [1200, 500, 3]
    batch = int8_batch(make_batch(gpu_device, torch.bfloat16, q_lens, ctx_lens, 16, 8, 128, 16))
    q, kc, vc, ks, vs, block_tables, qsl, seq_lens = batch
    got = _run_int8(batch, 512, True, skip_single=True)
    other = _run_int8(batch, 512, False, skip_single=True)
    starts = qsl.tolist()
    prompt = torch.zeros(q.shape[0], dtype=torch.bool, device=q.device)
    for i, n in enumerate(q_lens):
        if n > 1:
            prompt[starts[i]:starts[i + 1]] = True
    _assert_rows(got, _int8_ref(batch), other, prompt, torch.bfloat16)
    assert torch.isnan(got[~prompt]).all(), "wrote a decode row"
    assert int8_quantizes_q(q, kc, 512) and int8_quantizes_q(q, kc, 1)
    whole = paged_attention_triton(q, kc, vc, block_tables, qsl, seq_lens, 0.088, 512,
                                   k_scale=ks, v_scale=vs)
    atol, rtol = tol(torch.bfloat16)
    torch.testing.assert_close(whole, _int8_ref(batch), atol=atol, rtol=rtol)
