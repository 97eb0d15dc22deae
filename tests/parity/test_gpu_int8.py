"""On a CUDA device, `kv_cache_dtype="int8"` through the engine: the Triton kernels inside CUDA
graphs (and eagerly) against the float KV cache on the tiny families, and against the int8
torch-reference path at the Qwen3-0.6B shape in bf16."""

import pytest
import torch

from infer_cluster.protocol import SamplingParams

from .conftest import FAMILIES
from .test_gpu import assert_triton_matches_torch_reference
from .test_hf_parity import make_prompts
from .test_int8_kv import (MAX_MEAN_LOGPROB_DIFF, MIN_STEP_AGREEMENT, PARAMS, TIE_NATS,
                           compare, force_int8_cvt)

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)


@pytest.fixture(scope="module")
def wide_head_checkpoints(tmp_path_factory):
    """The tiny families with 32-wide heads (2 query heads over 1 KV head; qwen3 sets head_dim),
    so the int8 q @ K^T MMA runs (it needs a reduction of at least 32; narrower heads fall back)."""
    from infer_cluster.worker.loading.embedded import build_checkpoint

    root = tmp_path_factory.mktemp("wide_heads")
    specs = {name: dict(spec, num_attention_heads=2, num_key_value_heads=1,
                        **({"head_dim": 32} if "head_dim" in spec else {}))
             for name, spec in FAMILIES.items()}
    return {name: str(build_checkpoint(root / name, spec, seed=1234)) for name, spec in specs.items()}


@pytest.mark.parametrize("enforce_eager", [True, False])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_int8_kv_on_gpu_matches_float_kv(checkpoints, family, enforce_eager):
    compare_int8_with_float_kv(checkpoints[family], family, enforce_eager)


def compare_int8_with_float_kv(checkpoint, family, enforce_eager):
    from infer_cluster.worker import LLM

    prompts = make_prompts()
    common = dict(device="cuda", dtype="float32", enforce_eager=enforce_eager, max_num_seqs=32,
                  block_size=16)
    with LLM(checkpoint, num_kv_blocks=512, **common) as llm:
        ref = llm.generate(prompts, PARAMS, use_tqdm=False)
    with LLM(checkpoint, num_kv_blocks=24, kv_cache_dtype="int8",
             max_num_batched_tokens=256, **common) as llm:
        assert (llm.engine.runner.graphs is None) == enforce_eager
        got = llm.generate(prompts, PARAMS, use_tqdm=False)
        assert llm.stats()["num_preemptions"] > 0
    r = compare(ref, got)
    print(f"\n{family} (cuda, eager={enforce_eager}): positional {r['positional']:.1%}, step "
          f"agreement {r['step_agreement']:.1%}, mean |logprob diff| {r['mean_logprob_diff']:.4f}")
    assert all(g < TIE_NATS for g in r["flip_gaps"])
    assert r["step_agreement"] >= MIN_STEP_AGREEMENT
    assert r["mean_logprob_diff"] < MAX_MEAN_LOGPROB_DIFF


@pytest.mark.parametrize("family", list(FAMILIES))
def test_int8_kv_mma_on_gpu_matches_float_kv(wide_head_checkpoints, family, monkeypatch):
    # The int8-MMA K method (the default, forced here in case defaults change) on heads wide
    # enough for it: same bounds, CUDA graphs. The kernels must really take OP_MMA.
    from infer_cluster.kernels.attention_int8_triton import OP_MMA, cvt_ops

    force_int8_cvt(monkeypatch, "mma_k")
    k = torch.zeros(1, 16, 1, 32, dtype=torch.int8)
    assert cvt_ops("mma_k", k, k)[0] == OP_MMA
    compare_int8_with_float_kv(wide_head_checkpoints[family], family, False)


def test_int8_bf16_triton_matches_torch_reference(monkeypatch):
    from infer_cluster.worker import LLM

    llm = LLM("qwen3-0.6b-shape", load_format="dummy", dtype="bfloat16", device="cuda",
              kv_cache_dtype="int8", num_kv_blocks=2048, enforce_eager=True, max_model_len=4096)
    assert_triton_matches_torch_reference(llm, monkeypatch, max_tokens=4)
    llm.close()


def test_int8_bf16_cuda_graphs_match_eager():
    """The first decode step replayed from a CUDA graph (graph-width block tables, fp16 operands
    from the int8 codes) against the same step run eagerly, both Triton, at the Qwen3-0.6B shape
    in bf16. The prefill is the same in both runs, so the first decode step has the same context;
    its top logprobs must agree."""
    from infer_cluster.worker import LLM

    prompts = [[(i * 37 + j * 11) % 5000 + 10 for j in range(n)]
               for i, n in enumerate([7, 100, 513, 1500, 33, 64])]
    params = SamplingParams(temperature=0, max_tokens=2, logprobs=5, ignore_eos=True)
    outs = {}
    for eager in (True, False):
        with LLM("qwen3-0.6b-shape", load_format="dummy", dtype="bfloat16", device="cuda",
                 kv_cache_dtype="int8", num_kv_blocks=1024, enforce_eager=eager,
                 max_model_len=4096, max_num_seqs=16) as llm:
            assert (llm.engine.runner.graphs is None) == eager
            outs[eager] = llm.generate(prompts, params, use_tqdm=False)
    for a, b in zip(outs[True], outs[False]):
        assert a.token_ids[0] == b.token_ids[0]  # same prefill
        top_a, top_b = a.logprobs[1][1], b.logprobs[1][1]
        shared = set(top_a) & set(top_b)
        assert len(shared) >= 3
        for t in shared:
            assert abs(top_a[t] - top_b[t]) <= 0.05 * max(1.0, abs(top_a[t]))
