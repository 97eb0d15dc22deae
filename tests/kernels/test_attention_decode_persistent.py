"""The persistent decode kernel over float caches (kernels/attention_decode_persistent_gluon.py):
its sm_90 build (no GPU: ahead-of-time compile in a child), its grid, where `decode_attention`
takes it, and on a GPU its outputs against the reference and the Triton kernel it stands in for,
with the items spread over few programs (many rounds a program, items crossing within a
program's stream) as well as the engine's grid."""

import pytest
import torch

from infer_cluster.kernels.attention import decode_order, paged_attention_ref
from infer_cluster.kernels.attention_decode_persistent_gluon import MAX_ROUNDS, persistent_grid
from infer_cluster.kernels.attention_decode_plan import DECODE_PERSISTENT
from infer_cluster.kernels.attention_triton import decode_attention, decode_config
from tests.kernels.conftest import (INTERPRET, assert_decode_builds, assert_decode_outputs,
                                    decode_build_check, tol)
from tests.kernels.test_attention import make_batch

BUILD = decode_build_check("persistent_decode_build", "persistent_decode_variants")


def test_sm90_builds_fit_their_programs_a_sm_and_overlap_their_copies(sm90_builds):
    assert_decode_builds(sm90_builds.get(BUILD), resident=DECODE_PERSISTENT["resident"])


@pytest.mark.parametrize("items, resident, sms, programs, want", [
    (2048, 3, 132, None, 396),       # batch 256 x 8 KV heads: every slot, ~5 rounds
    (100, 4, 132, None, 100),        # fewer items than slots: one each
    (100_000, 4, 132, None, -(-100_000 // MAX_ROUNDS.value)),  # no program past MAX_ROUNDS
    (2048, 4, 132, 7, 2048 // MAX_ROUNDS.value),   # a forced grid still respects MAX_ROUNDS
    (60, 4, 132, 7, 7),
    (0, 4, 132, None, 1),
])
def test_persistent_grid(items, resident, sms, programs, want):
    assert persistent_grid(items, resident, sms, programs) == want


@pytest.mark.parametrize("num_seqs, kv_heads, sms, applies", [
    (256, 8, 132, True), (75, 8, 132, True), (74, 8, 132, False), (64, 8, 132, False),
    (50, 8, 132, False), (49, 8, 132, True), (38, 8, 132, True), (37, 8, 132, False),
    (256, 1, 132, False), (594, 1, 132, True)])
def test_persistent_applies_from_a_round_and_a_half_or_to_most_of_one(num_seqs, kv_heads, sms, applies,
                                                                      monkeypatch):
    # three programs a SM: 1.5 rounds of whole contexts and more, or 0.75-1 round of them (one
    # a program); in between and below, the Triton kernel splits contexts instead
    from infer_cluster.kernels import attention_decode_plan as plan
    from infer_cluster.kernels.attention_decode_plan import persistent_applies
    monkeypatch.setattr(plan, "_sm_count", lambda device: sms)
    cfg = {f"persistent_{k}": v for k, v in DECODE_PERSISTENT.items()}
    assert persistent_applies(num_seqs, kv_heads, torch.device("cuda"), cfg) == applies


@pytest.mark.parametrize("num_seqs, applies", [(24, False), (25, True), (49, True), (50, False),
                                               (74, False), (75, True)])
def test_persistent_applies_to_one_round_and_from_a_rounds_share(num_seqs, applies, monkeypatch):
    # one_round_from 0.5: 198-396 items take one whole context a program; min_rounds 1.5 from 594
    from infer_cluster.kernels import attention_decode_plan as plan
    from infer_cluster.kernels.attention_decode_plan import persistent_applies
    monkeypatch.setattr(plan, "_sm_count", lambda device: 132)
    cfg = {**{f"persistent_{k}": v for k, v in DECODE_PERSISTENT.items()},
           "persistent_one_round_from": 0.5, "persistent_min_rounds": 1.5}
    assert persistent_applies(num_seqs, 8, torch.device("cuda"), cfg) == applies


@pytest.mark.skipif(not INTERPRET, reason="Triton on CPU tensors needs TRITON_INTERPRET=1")
def test_cpu_calls_keep_the_triton_kernel():
    # The config asks for the persistent kernel on CUDA only; on the interpreter the Triton
    # kernel runs and matches the reference.
    q, kc, vc, bt, qsl, lens = make_batch("cpu", torch.float32, [1] * 3, [5, 40, 17], 4, 2, 32, 16)
    out = torch.full_like(q, float("nan"))
    decode_attention(q, kc, vc, bt, qsl, lens, 0.2, out, config=dict(persistent=True))
    ref = paged_attention_ref(q, kc, vc, bt, qsl, lens, 0.2)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("num_splits", [None, 1, 3])
@pytest.mark.parametrize("ordered", [False, True])
@pytest.mark.parametrize("programs", [None, 5])
@pytest.mark.parametrize("heads", [(16, 8), (16, 2), (3, 1)])
def test_gpu_persistent_matches_reference_and_triton(gpu_device, dtype, num_splits, ordered,
                                                     programs, heads):
    num_heads, num_kv_heads = heads
    assert decode_config(torch.empty(1, 16, 128, device=gpu_device, dtype=dtype), dtype)["persistent"]
    # tails inside and across pages and tiles, one token, contexts shorter than a split's share
    # (empty partitions); one sequence with a 3-row query (a mixed step's prompt: not this
    # kernel's, left untouched); with `programs` = 5 each program walks many items in a row
    ctx = [1, 17, 64, 65, 600, 611, 4097, 100, 2000, 255, 40, 3]
    q_lens = [1] * 9 + [3, 1, 1]
    q, kc, vc, bt, qsl, lens = make_batch(gpu_device, dtype, q_lens, ctx, num_heads, num_kv_heads,
                                          128, 16)
    order = decode_order(lens) if ordered else None
    outs = {}
    for persistent in (True, False):
        out = torch.full_like(q, float("nan"))
        # min_rounds 0: the persistent kernel takes even these few sequences
        decode_attention(q, kc, vc, bt, qsl, lens, 128 ** -0.5, out, num_splits=num_splits,
                         config=dict(persistent=persistent, persistent_programs=programs,
                                     persistent_min_rounds=0), order=order)
        outs[persistent] = out
    ref = paged_attention_ref(q, kc, vc, bt, qsl, lens, 128 ** -0.5).to(dtype)
    assert_decode_outputs(outs[True], ref, outs[False], qsl, 9, dtype)


def test_gpu_persistent_in_a_cuda_graph_follows_new_lengths(gpu_device):
    # A captured launch replays with other contexts (the engine's decode graphs): the grid
    # comes from shapes only, the items' ranges from seq_lens at replay. 128 sequences of 8 KV
    # heads take the persistent kernel by default on a GPU of up to 170 SMs.
    dtype = torch.bfloat16
    q, kc, vc, bt, qsl, lens = make_batch(gpu_device, dtype, [1] * 128, [700] * 128, 16, 8, 128, 16)
    out = torch.zeros_like(q)
    order = decode_order(lens)
    decode_attention(q, kc, vc, bt, qsl, lens, 0.1, out, order=order)  # compile outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode_attention(q, kc, vc, bt, qsl, lens, 0.1, out, order=order)
    new = torch.randint(1, 701, (128,), dtype=torch.int32, device=gpu_device)
    lens.copy_(new)
    order.copy_(decode_order(new))
    graph.replay()
    torch.cuda.synchronize()
    ref = paged_attention_ref(q, kc, vc, bt, qsl, lens, 0.1).to(dtype)
    atol, rtol = tol(dtype)
    torch.testing.assert_close(out, ref, atol=atol, rtol=rtol)

