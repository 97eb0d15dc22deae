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

from .conftest import FAMILIES

HAS_CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
PROMPT = [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]
PARAMS = SamplingParams(temperature=0, max_tokens=5, logprobs=3, ignore_eos=True)
REAL = mt.fused_mlp_small_triton  # before any test wraps it


def _run(path, monkeypatch, fused: bool, **kw):
    """One engine's output with the fused MLP on or off, and how often its kernel ran."""
    from infer_cluster.worker import LLM

    calls = []
    monkeypatch.setattr(mt, "fused_mlp_small_triton", lambda *a, **k: calls.append(1) or REAL(*a, **k))
    monkeypatch.setenv("INFER_CLUSTER_FUSED_MLP", "1" if fused else "0")
    llm = LLM(path, dtype="float32", block_size=16, num_kv_blocks=32, max_num_seqs=4,
              max_num_batched_tokens=64, **kw)
    out = llm.generate([PROMPT], PARAMS, use_tqdm=False)[0]
    return llm, (out.token_ids, out.logprobs), len(calls)


def _assert_same(got, want):
    assert got[0] == want[0]
    for step, ref_step in zip(got[1], want[1]):
        assert step[0] == pytest.approx(ref_step[0], abs=1e-4)


@pytest.mark.skipif(HAS_CUDA or not INTERPRET, reason="CPU case: needs TRITON_INTERPRET=1")
@pytest.mark.parametrize("family", list(FAMILIES))
def test_fused_mlp_matches_unfused_interpreted(checkpoints, monkeypatch, family):
    monkeypatch.setenv("INFER_CLUSTER_KERNELS", "triton")
    _, want, unfused_calls = _run(checkpoints[family], monkeypatch, fused=False, warmup=False)
    llm, got, fused_calls = _run(checkpoints[family], monkeypatch, fused=True, warmup=False)
    assert unfused_calls == 0
    layers = llm.engine.runner.model.spec.num_layers
    assert fused_calls == layers * (PARAMS.max_tokens - 1)  # every decode step, every layer
    _assert_same(got, want)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("family", list(FAMILIES))
def test_fused_mlp_matches_unfused_with_cuda_graphs(checkpoints, monkeypatch, family):
    kw = dict(device="cuda", enforce_eager=False)
    _, want, unfused_calls = _run(checkpoints[family], monkeypatch, fused=False, **kw)
    llm, got, fused_calls = _run(checkpoints[family], monkeypatch, fused=True, **kw)
    assert unfused_calls == 0 and fused_calls > 0  # (captured calls: replays are not counted)
    assert llm.engine.runner.graphs.replays > 0
    _assert_same(got, want)
