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
