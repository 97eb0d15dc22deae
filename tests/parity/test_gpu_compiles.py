"""On a CUDA device: once an engine has started (its warm-up included), serving compiles no
Triton kernel. A kernel compiled mid-run stalls the step that needs it for 0.3-2 s: with an
empty Triton cache the first workload-A run after start-up ran at 0.65 (int8 KV) and 0.75 (bf16)
of the warm runs at 3d998ae (bench/RESULTS.md, "Cold start with an empty Triton cache").
Triton's `jit_cache_hook` (`bench.cold_start.CompileLog`) sees every specialization compiled in
the process, cached on disk or not, so this test needs no cold cache. The traffic varies what specializations depend on: odd
and even token and sequence counts, 1 to 40 sequences, every sampling kind, prefix-cache hits,
chunked prefills and block tables of every width class."""

import random

import pytest
import torch

from infer_cluster.protocol import SamplingParams

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)


def _params(rng: random.Random, i: int) -> SamplingParams:
    n = rng.randint(1, 40)
    kind = i % 4
    if kind == 0:
        return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    if kind == 1:
        return SamplingParams(temperature=0.8, top_p=0.9, top_k=20, seed=i, max_tokens=n, ignore_eos=True)
    if kind == 2:
        return SamplingParams(temperature=0.7, repetition_penalty=1.2, presence_penalty=0.3, seed=i,
                              max_tokens=n, ignore_eos=True)
    return SamplingParams(temperature=0, logprobs=3, max_tokens=n, ignore_eos=True)


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8"])
def test_no_kernel_compiles_after_start_up(checkpoints, kv_cache_dtype):
    import triton

    from bench.cold_start import CompileLog
    from infer_cluster.worker import LLM

    if not hasattr(triton, "knobs"):
        pytest.skip("this Triton has no jit_cache_hook")
    llm = LLM(checkpoints["qwen3"], device="cuda", dtype="bfloat16", kv_cache_dtype=kv_cache_dtype,
              max_num_seqs=64, max_num_batched_tokens=512, num_kv_blocks=2048, warmup=True)
    vocab = llm.engine.spec.vocab_size
    rng = random.Random(11)
    shared = [rng.randrange(2, vocab) for _ in range(700)]
    try:
        with CompileLog() as log:
            for batch in (1, 2, 3, 11, 16, 17, 40):
                prompts = []
                for j in range(batch):
                    n = rng.randint(1, 700)
                    prompts.append(shared[:n] if j % 3 == 0 else [rng.randrange(2, vocab) for _ in range(n)])
                llm.generate(prompts, [_params(rng, j) for j in range(batch)], use_tqdm=False)
    finally:
        llm.close()
    compiled = log.take()
    assert compiled == [], f"{len(compiled)} kernels compiled after start-up: {compiled}"
