"""The Gluon build of the int8 decode kernel (kernels/attention_decode_gluon.py): its sm_90 build
(no GPU: ahead-of-time compile in a child), where `decode_attention` takes it, and on a GPU its
outputs against the reference and the Triton kernel it stands in for."""

import pytest
import torch

from infer_cluster.kernels.attention import decode_order, paged_attention_ref
from infer_cluster.kernels.attention_triton import decode_attention, decode_config
from tests.kernels.conftest import INTERPRET, sm90_check, tol
from tests.kernels.test_attention import make_batch
from tests.kernels.test_attention_int8 import int8_batch, quantized_q

BUILD = sm90_check("gluon_decode_build", """
from bench.ptxas_check import gluon_decode_variants
from bench.sm90_build import compile_sm90, ptxas_info
for name, kernel, ptrs, ints, consts, opts, dns in gluon_decode_variants():
    c = compile_sm90(kernel, ptrs, ints, consts, opts, dns)
    regs, spills = ptxas_info(c.asm["ptx"])
    lines = [l.strip() for l in c.asm["ptx"].splitlines()]
    wait = next(i for i, l in enumerate(lines) if l.startswith("griddepcontrol.wait"))
    reads = [i for i, l in enumerate(lines) if "ld.global" in l or l.startswith("cp.async.c")]
    partial = sum(l.startswith("cp.async.wait_group") and l.rstrip(";").split()[-1] == "1" for l in lines)
    print(int(consts["SPLIT"]), regs, spills, c.metadata.shared, sum(i < wait for i in reads), partial)
""")


def test_sm90_build_fits_three_programs_a_sm_and_overlaps_its_copies(sm90_builds):
    rows = [tuple(map(int, line.split())) for line in sm90_builds.get(BUILD).splitlines()]
    assert sorted(r[0] for r in rows) == [0, 1]
    for split, regs, spills, shared, before_wait, partial_waits in rows:
        assert spills == 0, split
        # three 128-thread programs a SM: registers (65,536 a SM) and shared memory (228 KB)
        assert regs * 128 * 3 <= 65536 and 3 * (shared + 1024) <= 228 * 1024, (regs, shared)
        assert before_wait == 0  # PDL: nothing is read before the previous kernel is done
        # K(i) and V(i) each waited for with the other tile's copies still in flight
        assert partial_waits == 2, partial_waits


@pytest.mark.skipif(not INTERPRET, reason="Triton on CPU tensors needs TRITON_INTERPRET=1")
def test_cpu_calls_keep_the_triton_kernel():
    # The config asks for Gluon on CUDA int8 only; on the interpreter the Triton kernel runs and
    # matches the reference (the dispatch never picks a kernel the CPU cannot run).
    q, kc, vc, ks, vs, bt, qsl, lens = int8_batch(make_batch("cpu", torch.float32, [1] * 3,
                                                             [5, 40, 17], 4, 2, 32, 16))
    out = torch.full_like(q, float("nan"))
    decode_attention(q, kc, vc, bt, qsl, lens, 0.2, out, config=dict(gluon=True), k_scale=ks,
                     v_scale=vs)
    ref = paged_attention_ref(q, kc, vc, bt, qsl, lens, 0.2, k_scale=ks, v_scale=vs)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("num_splits", [None, 1, 5])
@pytest.mark.parametrize("ordered", [False, True])
def test_gpu_gluon_matches_reference_and_triton(gpu_device, dtype, num_splits, ordered):
    assert decode_config(torch.empty(1, 16, 128, device=gpu_device, dtype=dtype), torch.int8)["gluon"]
    # tails inside and across pages and tiles, one token, contexts past a split's share; one
    # sequence with a 3-row query (a mixed step's prompt: not this kernel's, left untouched)
    ctx = [1, 17, 128, 129, 600, 611, 4097, 100, 2000, 255, 40]
    q_lens = [1] * 9 + [3, 1]
    q, kc, vc, ks, vs, bt, qsl, lens = int8_batch(make_batch(gpu_device, dtype, q_lens, ctx, 16, 8,
                                                             128, 16))
    order = decode_order(lens) if ordered else None
    outs = {}
    for gluon in (True, False):
        out = torch.full_like(q, float("nan"))
        decode_attention(q, kc, vc, bt, qsl, lens, 128 ** -0.5, out, num_splits=num_splits,
                         config=dict(gluon=gluon), k_scale=ks, v_scale=vs, order=order)
        outs[gluon] = out
    ref = paged_attention_ref(quantized_q(q), kc, vc, bt, qsl, lens, 128 ** -0.5, k_scale=ks,
                              v_scale=vs).to(dtype)
    one = torch.ones(q.shape[0], dtype=torch.bool, device=q.device)
    one[int(qsl[9]):int(qsl[10])] = False
    got = outs[True]
    assert torch.isnan(got[~one]).all(), "wrote the rows of a multi-row query"
    assert not torch.isnan(got[one]).any(), "read KV past seq_lens (NaN trap) or left a row unwritten"
    atol, rtol = tol(dtype)
    torch.testing.assert_close(got[one], ref[one], atol=atol, rtol=rtol)
    torch.testing.assert_close(got[one], outs[False][one], atol=atol, rtol=rtol)
