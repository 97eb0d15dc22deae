"""The public kernel functions reach the Triton versions when forced (`INFER_CLUSTER_KERNELS`)."""

import pytest
import torch

from infer_cluster import kernels
from tests.kernels.conftest import INTERPRET


@pytest.mark.skipif(not INTERPRET, reason="forcing Triton on CPU tensors needs the interpreter")
def test_forced_triton_dispatch_matches_refs(monkeypatch):
    monkeypatch.setenv("INFER_CLUSTER_KERNELS", "triton")
    calls = []
    import infer_cluster.kernels.attention_triton as at
    real = at.paged_attention_triton
    monkeypatch.setattr(at, "paged_attention_triton", lambda *a: calls.append(1) or real(*a))

    x = torch.randn(3, 32)
    torch.testing.assert_close(kernels.silu_and_mul(x), kernels.silu_and_mul_ref(x))
    w = torch.rand(32)
    torch.testing.assert_close(kernels.rms_norm(x, w, 1e-6), kernels.rms_norm_ref(x, w, 1e-6))

    q = torch.randn(2, 2, 16)
    k_cache, v_cache = torch.randn(2, 16, 1, 16), torch.randn(2, 16, 1, 16)
    block_tables = torch.tensor([[0], [1]], dtype=torch.int32)
    qsl = torch.tensor([0, 1, 2], dtype=torch.int32)
    lens = torch.tensor([5, 16], dtype=torch.int32)
    got = kernels.paged_attention(q, k_cache, v_cache, block_tables, qsl, lens, 0.25, 1)
    ref = kernels.paged_attention_ref(q, k_cache, v_cache, block_tables, qsl, lens, 0.25)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    assert calls == [1]


@pytest.mark.skipif(not INTERPRET, reason="forcing Triton on CPU tensors needs the interpreter")
@pytest.mark.parametrize("forced", ["triton", "torch"])
def test_int8_scales_pass_through_dispatch(monkeypatch, forced):
    # kv_append then paged_attention on an int8 cache through the public functions, forced to
    # either side, against the references run by hand.
    monkeypatch.setenv("INFER_CLUSTER_KERNELS", forced)
    key, value = torch.randn(20, 1, 16), torch.randn(20, 1, 16)
    slots = torch.arange(20, dtype=torch.int64)
    caches = [torch.zeros(2, 16, 1, 16, dtype=torch.int8) for _ in range(2)] + \
        [torch.zeros(2, 1, 16) for _ in range(2)]
    refs = [c.clone() for c in caches]
    kernels.kv_append(key, value, caches[0], caches[1], slots, caches[2], caches[3])
    kernels.kv_append_ref(key, value, refs[0], refs[1], slots, refs[2], refs[3])
    for got, ref in zip(caches, refs):
        assert torch.equal(got, ref)
    q = torch.randn(2, 2, 16)
    args = (torch.tensor([[0, 1]], dtype=torch.int32).repeat(2, 1),
            torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([7, 20], dtype=torch.int32),
            0.25)
    got = kernels.paged_attention(q, caches[0], caches[1], *args, 1, caches[2], caches[3])
    ref = kernels.paged_attention_ref(q, refs[0], refs[1], *args, k_scale=refs[2],
                                      v_scale=refs[3])
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
