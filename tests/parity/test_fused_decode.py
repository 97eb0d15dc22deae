"""The decoder with batch-1 decode fused (each MLP as one launch, `INFER_CLUSTER_FUSED_MLP`,
kernels/mlp.py; the split merge with the o projection, `INFER_CLUSTER_FUSED_ATTN_O`,
kernels/attention_o.py; both on by default) against the same model with both off: same greedy
tokens, logprobs within float32 rounding, for every tiny family and each switch alone. One
request, so decode steps have the one row the rules take. On CPU the decode splits every
16 tokens (eager block tables are only as wide as the context), so the merge kernel runs there too. On CPU every kernel runs under the
Triton interpreter (`INFER_CLUSTER_KERNELS=triton`); on a GPU the decode steps replay CUDA graphs."""

import os

import pytest
import torch

from infer_cluster.protocol import SamplingParams

from infer_cluster.kernels import attention_decode_triton as adt
from infer_cluster.kernels import attention_o_triton as ao
from infer_cluster.kernels import mlp_triton as mt

from .conftest import FAMILIES

REAL = (mt.fused_mlp_small_triton, ao.decode_attention)  # before any test wraps them

HAS_CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
PROMPT = [3 + (i * 37) % 500 for i in range(40)]
PARAMS = SamplingParams(temperature=0, max_tokens=5, logprobs=3, ignore_eos=True)
SWITCHES = {"mlp": (True, False), "attn_o": (False, True), "both": (True, True)}


def _run(path, monkeypatch, mlp: bool, attn_o: bool, **kw):
    """One engine's output with the fusions set, and how often each fused kernel ran (the merge
    counted only when the decode handed it partials)."""
    from infer_cluster.worker import LLM

    calls = {"mlp": 0, "merge": 0}
    real_mlp, real_decode = REAL

    def mlp_spy(*a, **k):
        calls["mlp"] += 1
        return real_mlp(*a, **k)

    def decode_spy(*a, **k):
        out = real_decode(*a, **k)
        calls["merge"] += isinstance(out, ao.DecodePartials)
        return out

    monkeypatch.setattr(mt, "fused_mlp_small_triton", mlp_spy)
    monkeypatch.setattr(ao, "decode_attention", decode_spy)
    monkeypatch.setenv("INFER_CLUSTER_FUSED_MLP", "1" if mlp else "0")
    monkeypatch.setenv("INFER_CLUSTER_FUSED_ATTN_O", "1" if attn_o else "0")
    llm = LLM(path, dtype="float32", block_size=16, num_kv_blocks=32, max_num_seqs=4,
              max_num_batched_tokens=64, **kw)
    out = llm.generate([PROMPT], PARAMS, use_tqdm=False)[0]
    return llm, (out.token_ids, out.logprobs), calls


def _assert_same(got, want):
    assert got[0] == want[0]
    for step, ref_step in zip(got[1], want[1]):
        assert step[0] == pytest.approx(ref_step[0], abs=1e-4)


_BASELINES: dict = {}


def _interpreted_baseline(path):
    """Both fusions off (once per checkpoint: the interpreter is slow)."""
    if path not in _BASELINES:
        with pytest.MonkeyPatch.context() as mp:
            _interpreted(mp)
            _, want, off = _run(path, mp, False, False, warmup=False)
        assert off == {"mlp": 0, "merge": 0}
        _BASELINES[path] = want
    return _BASELINES[path]


def _interpreted(mp):
    mp.setenv("INFER_CLUSTER_KERNELS", "triton")
    mp.setattr(adt, "_MIN_PARTITION", 16)


# Both switches for every family, each alone for one (the interpreter is slow).
CPU_CASES = [(f, "both") for f in FAMILIES] + [("qwen3", "mlp"), ("qwen3", "attn_o")]


@pytest.mark.skipif(HAS_CUDA or not INTERPRET, reason="CPU case: needs TRITON_INTERPRET=1")
@pytest.mark.parametrize("family,switch", CPU_CASES)
def test_fused_decode_matches_unfused_interpreted(checkpoints, monkeypatch, family, switch):
    want = _interpreted_baseline(checkpoints[family])
    _interpreted(monkeypatch)
    mlp, attn_o = SWITCHES[switch]
    llm, got, on = _run(checkpoints[family], monkeypatch, mlp, attn_o, warmup=False)
    decode_layer_steps = llm.engine.runner.model.spec.num_layers * (PARAMS.max_tokens - 1)
    assert on["mlp"] == (decode_layer_steps if mlp else 0)  # every decode step, every layer
    assert on["merge"] == (decode_layer_steps if attn_o else 0)
    _assert_same(got, want)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("switch", list(SWITCHES))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_fused_decode_matches_unfused_with_cuda_graphs(checkpoints, monkeypatch, family, switch):
    kw = dict(device="cuda", enforce_eager=False)
    _, want, off = _run(checkpoints[family], monkeypatch, False, False, **kw)
    llm, got, on = _run(checkpoints[family], monkeypatch, *SWITCHES[switch], **kw)
    assert off == {"mlp": 0, "merge": 0}
    assert (on["mlp"] > 0) == SWITCHES[switch][0]  # (captured calls: replays are not counted)
    assert (on["merge"] > 0) == SWITCHES[switch][1]
    assert llm.engine.runner.graphs.replays > 0
    _assert_same(got, want)
