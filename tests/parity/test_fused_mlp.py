"""The decoder with each batch-1 MLP as one launch (`INFER_CLUSTER_FUSED_MLP`, default on;
kernels/mlp.py) against the same model with the gate_up and down GEMVs: same greedy tokens,
logprobs within float32 rounding, for every tiny family. One request, so decode steps have the
one row the rule takes. On CPU every kernel runs under the Triton interpreter
(`INFER_CLUSTER_KERNELS=triton`); on a GPU the decode steps replay CUDA graphs."""

import os

import pytest
import torch

from infer_cluster.kernels import mlp_triton as mt
from infer_cluster.protocol import SamplingParams

from .conftest import FAMILIES, assert_same_greedy, spied_outputs

HAS_CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
PROMPT = [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]
PARAMS = SamplingParams(temperature=0, max_tokens=5, logprobs=3, ignore_eos=True)


def _run(path, monkeypatch, fused: bool, **kw):
    """One engine's output with the fused MLP on or off, and how often its kernel ran."""
    return spied_outputs(path, monkeypatch, mt, "fused_mlp_small_triton", "INFER_CLUSTER_FUSED_MLP",
                         fused, [PROMPT], PARAMS, **kw)


@pytest.mark.skipif(HAS_CUDA or not INTERPRET, reason="CPU case: needs TRITON_INTERPRET=1")
@pytest.mark.parametrize("family", list(FAMILIES))
def test_fused_mlp_matches_unfused_interpreted(checkpoints, monkeypatch, family):
    monkeypatch.setenv("INFER_CLUSTER_KERNELS", "triton")
    _, want, unfused_calls = _run(checkpoints[family], monkeypatch, fused=False, warmup=False)
    llm, got, fused_calls = _run(checkpoints[family], monkeypatch, fused=True, warmup=False)
    assert unfused_calls == 0
    layers = llm.engine.runner.model.spec.num_layers
    assert fused_calls == layers * (PARAMS.max_tokens - 1)  # every decode step, every layer
    assert_same_greedy(got, want)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("family", list(FAMILIES))
def test_fused_mlp_matches_unfused_with_cuda_graphs(checkpoints, monkeypatch, family):
    kw = dict(device="cuda", enforce_eager=False)
    _, want, unfused_calls = _run(checkpoints[family], monkeypatch, fused=False, **kw)
    llm, got, fused_calls = _run(checkpoints[family], monkeypatch, fused=True, **kw)
    assert unfused_calls == 0 and fused_calls > 0  # (captured calls: replays are not counted)
    assert llm.engine.runner.graphs.replays > 0
    assert_same_greedy(got, want)
