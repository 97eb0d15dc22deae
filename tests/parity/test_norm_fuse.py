"""The decoder with each residual add + RMSNorm folded into the small-batch GEMV after it
(`INFER_CLUSTER_NORM_FUSE`, default on) against the same model with the norms as kernels of
their own: same greedy tokens, logprobs within float32 rounding, for every tiny family. On CPU
every kernel runs under the Triton interpreter (`INFER_CLUSTER_KERNELS=triton`); on a GPU the
decode steps replay CUDA graphs."""

import os

import pytest
import torch

from infer_cluster.protocol import SamplingParams

from .conftest import FAMILIES, assert_same_greedy, spied_outputs

HAS_CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
# Two rows per decode step: untuned shapes take the GEMV (and so the fused norm) up to 2 rows.
PROMPTS = [[5, 9, 200], [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]]
PARAMS = SamplingParams(temperature=0, max_tokens=4, logprobs=3, ignore_eos=True)


def _run(path, monkeypatch, fuse: bool, **kw):
    """Outputs of one engine built with the fusion on or off, and how often the fused kernel ran."""
    import infer_cluster.kernels.gemv_triton as gt
    return spied_outputs(path, monkeypatch, gt, "rms_norm_linear_small_triton", "INFER_CLUSTER_NORM_FUSE",
                         fuse, PROMPTS, PARAMS, **kw)


@pytest.mark.skipif(HAS_CUDA or not INTERPRET, reason="CPU case: needs TRITON_INTERPRET=1")
@pytest.mark.parametrize("family", list(FAMILIES))
def test_fused_norm_matches_unfused_interpreted(checkpoints, monkeypatch, family):
    monkeypatch.setenv("INFER_CLUSTER_KERNELS", "triton")
    _, want, unfused_calls = _run(checkpoints[family], monkeypatch, fuse=False, warmup=False)
    llm, got, fused_calls = _run(checkpoints[family], monkeypatch, fuse=True, warmup=False)
    assert unfused_calls == 0
    # Decode steps (<= 16 rows): both norms of both layers fused, every step.
    assert fused_calls >= 2 * 2 * (PARAMS.max_tokens - 1)
    assert_same_greedy(got, want)

    # The final norm folded into the LM head (`forward(final_norm=False)` then
    # `compute_logits(hidden, residual)`) gives the logits of the separately normed hidden.
    model = llm.engine.runner.model
    hidden, residual = torch.randn(2, model.spec.hidden_size), torch.randn(2, model.spec.hidden_size)
    normed, _ = model.norm(hidden, residual)
    torch.testing.assert_close(model.compute_logits(hidden, residual), model.compute_logits(normed),
                               atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("family", list(FAMILIES))
def test_fused_norm_matches_unfused_with_cuda_graphs(checkpoints, monkeypatch, family):
    kw = dict(device="cuda", enforce_eager=False)
    _, want, unfused_calls = _run(checkpoints[family], monkeypatch, fuse=False, **kw)
    llm, got, fused_calls = _run(checkpoints[family], monkeypatch, fuse=True, **kw)
    assert unfused_calls == 0 and fused_calls > 0  # (captured calls: graph replays are not counted)
    assert llm.engine.runner.graphs is None or llm.engine.runner.graphs.replays > 0
    assert_same_greedy(got, want)
