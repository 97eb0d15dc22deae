"""The Gluon build of the int8 decode kernel (kernels/attention_decode_gluon.py): its sm_90 build
(no GPU: ahead-of-time compile in a child), where `decode_attention` takes it, and on a GPU its
outputs against the reference and the Triton kernel it stands in for."""

import pytest
import torch

from infer_cluster.kernels.attention import decode_order, paged_attention_ref
from infer_cluster.kernels.attention_triton import decode_attention, decode_config
from tests.kernels.conftest import (INTERPRET, assert_decode_builds, assert_decode_outputs,
                                    decode_build_check)
from tests.kernels.test_attention import make_batch
from tests.kernels.test_attention_int8 import int8_batch, quantized_q

BUILD = decode_build_check("gluon_decode_build", "gluon_decode_variants")
BUILD_Q_SMEM = decode_build_check("gluon_decode_q_smem_build", "gluon_decode_q_smem_variants")


def test_sm90_build_fits_three_programs_a_sm_and_overlaps_its_copies(sm90_builds):
    assert_decode_builds(sm90_builds.get(BUILD), resident=3, early_tile=True)


def test_sm90_q_smem_build_fits_four_programs_a_sm(sm90_builds):
    # the build large grids take (`gluon_q_smem`): q's codes read back from shared memory
    assert_decode_builds(sm90_builds.get(BUILD_Q_SMEM), resident=4, early_tile=True)


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
@pytest.mark.parametrize("q_smem", [False, True])
def test_gpu_gluon_matches_reference_and_triton(gpu_device, dtype, num_splits, ordered, q_smem):
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
                         config=dict(gluon=gluon, q_smem=q_smem), k_scale=ks, v_scale=vs,
                         order=order)
        outs[gluon] = out
    ref = paged_attention_ref(quantized_q(q), kc, vc, bt, qsl, lens, 128 ** -0.5, k_scale=ks,
                              v_scale=vs).to(dtype)
    assert_decode_outputs(outs[True], ref, outs[False], qsl, 9, dtype)


def test_q_smem_build_rule():
    from infer_cluster.kernels.attention_decode_plan import DECODE_INT8, gluon_q_smem
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert gluon_q_smem(dict(q_smem=True), 8, cpu) and not gluon_q_smem(dict(q_smem=False), 10 ** 6, cuda)
    assert not gluon_q_smem(dict(q_smem_rounds=None), 10 ** 6, cuda)  # never: no device asked
    assert not gluon_q_smem(dict(DECODE_INT8), 10 ** 6, cpu)  # interpreter calls keep the Triton kernel
    if torch.cuda.is_available():
        from infer_cluster.kernels.attention_decode_plan import _sm_count
        edge = int(DECODE_INT8["q_smem_rounds"] * 4 * _sm_count(cuda))
        assert gluon_q_smem(dict(DECODE_INT8), edge, cuda) and not gluon_q_smem(dict(DECODE_INT8), edge - 1, cuda)
