"""The decoder with the attention input prep folded into the decode attention kernel
(`INFER_CLUSTER_DECODE_PREP`, default on; kernels/decode_prep.py) against the same model with
`qkv_prep` and the attention as two launches: same greedy tokens, logprobs within float32
rounding, for every tiny family. On CPU every kernel runs under the Triton interpreter
(`INFER_CLUSTER_KERNELS=triton`); on a GPU the decode steps replay CUDA graphs."""

import os

import pytest
import torch

from infer_cluster.protocol import SamplingParams

from .conftest import FAMILIES

HAS_CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
PROMPTS = [[5, 9, 200], [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]]
PARAMS = SamplingParams(temperature=0, max_tokens=4, logprobs=3, ignore_eos=True)


def _run(path, monkeypatch, fuse: bool, **kw):
    """Outputs of one engine built with the fusion on or off, and how often the fused kernel ran."""
    import infer_cluster.kernels.decode_prep_triton as dpt

    from infer_cluster.worker import LLM

    calls = []
    real = dpt.decode_prep_attention_triton
    monkeypatch.setattr(dpt, "decode_prep_attention_triton",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setenv("INFER_CLUSTER_DECODE_PREP", "1" if fuse else "0")
    llm = LLM(path, dtype="float32", block_size=16, num_kv_blocks=32, max_num_seqs=4,
              max_num_batched_tokens=64, **kw)
    outs = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    return llm, [(o.token_ids, o.logprobs) for o in outs], len(calls)


def _assert_same(got, want):
    for (tokens, lps), (ref_tokens, ref_lps) in zip(got, want):
        assert tokens == ref_tokens
        for step, ref_step in zip(lps, ref_lps):
            assert step[0] == pytest.approx(ref_step[0], abs=1e-4)


@pytest.mark.skipif(HAS_CUDA or not INTERPRET, reason="CPU case: needs TRITON_INTERPRET=1")
@pytest.mark.parametrize("family", list(FAMILIES))
def test_fused_prep_matches_two_launches_interpreted(checkpoints, monkeypatch, family):
    monkeypatch.setenv("INFER_CLUSTER_KERNELS", "triton")
    _, want, unfused_calls = _run(checkpoints[family], monkeypatch, fuse=False, warmup=False)
    _, got, fused_calls = _run(checkpoints[family], monkeypatch, fuse=True, warmup=False)
    assert unfused_calls == 0
    # Every decode step (both prompts decoding together) runs it once per layer.
    assert fused_calls >= 2 * (PARAMS.max_tokens - 1)
    _assert_same(got, want)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("family", list(FAMILIES))
def test_fused_prep_matches_two_launches_with_cuda_graphs(checkpoints, monkeypatch, family):
    kw = dict(device="cuda", enforce_eager=False)
    _, want, unfused_calls = _run(checkpoints[family], monkeypatch, fuse=False, **kw)
    llm, got, fused_calls = _run(checkpoints[family], monkeypatch, fuse=True, **kw)
    assert unfused_calls == 0 and fused_calls > 0  # (captured calls: graph replays are not counted)
    assert llm.engine.runner.graphs is None or llm.engine.runner.graphs.replays > 0
    _assert_same(got, want)
