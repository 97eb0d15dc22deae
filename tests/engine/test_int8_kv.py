"""`kv_cache_dtype="int8"` through the offline `LLM` on `tiny-random`: the pool holds int8 codes
plus float32 scales, is sized from the smaller bytes per block, and prefix caching and
preemption under a small pool give the same tokens as an int8 run without pressure."""

import torch

from infer_cluster.protocol import SamplingParams
from infer_cluster.worker import LLM
from infer_cluster.worker.runner.context import DynamicContext

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


def _prompts():
    shared = list(range(3, 67))  # 4 full blocks of 16 shared by every prompt
    return [shared + [100 + i] * (5 + 7 * i) for i in range(6)]


def test_int8_pool_layout_and_size():
    # tiny-random: 2 layers, 2 KV heads of dim 32; float32 on CPU.
    assert DynamicContext.bytes_per_block(2, 16, 2, 32, torch.float32) == 2 * 2 * 16 * 2 * 32 * 4
    assert DynamicContext.bytes_per_block(2, 16, 2, 32, torch.int8) == 2 * 2 * 16 * 2 * (32 + 4)
    sizes = {}
    for kv in ("auto", "int8"):
        with LLM("tiny-random", kv_cache_dtype=kv, cpu_kv_cache_gib=0.001) as llm:
            sizes[kv] = llm.stats()["num_total_blocks"]
            layer = llm.engine.runner.context.kv_caches[0]
            if kv == "int8":
                assert layer.k.dtype == layer.v.dtype == torch.int8
                assert layer.k.shape == (sizes[kv], 16, 2, 32)
                assert layer.k_scale.shape == layer.v_scale.shape == (sizes[kv], 2, 16)
                assert layer.k_scale.dtype == torch.float32
            else:
                assert layer.k.dtype == torch.float32 and layer.k_scale is None
    assert sizes == {"auto": 2**30 // 1000 // 16384, "int8": 2**30 // 1000 // 4608}


def test_int8_prefix_cache_and_preemption_keep_outputs():
    prompts = _prompts()
    with LLM("tiny-random", kv_cache_dtype="int8", num_kv_blocks=256,
             enable_prefix_caching=False) as llm:
        ref = llm.generate(prompts, GREEDY, use_tqdm=False)
    # 12 blocks: one request needs up to 7, so six at once must preempt; all share a prefix.
    with LLM("tiny-random", kv_cache_dtype="int8", num_kv_blocks=12, block_size=16,
             max_num_batched_tokens=128) as llm:
        first = llm.generate(prompts, GREEDY, use_tqdm=False)
        again = llm.generate(prompts[:2], GREEDY, use_tqdm=False)
        stats = llm.stats()
    assert stats["num_preemptions"] > 0
    assert stats["prefix_cache_hit_tokens"] > 0 and again[0].num_cached_tokens >= 64
    assert stats["num_free_blocks"] == stats["num_total_blocks"]
    for r, a in zip(ref, first):
        assert a.finish_reason == "length" and len(a.token_ids) == 8
        assert a.token_ids == r.token_ids
    assert [o.token_ids for o in again] == [r.token_ids for r in ref[:2]]
    # And int8 really is a different cache from float32 (not silently ignored).
    lp = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=1)
    with LLM("tiny-random", num_kv_blocks=64) as llm:
        f32 = llm.generate(prompts[0], lp, use_tqdm=False)[0]
    with LLM("tiny-random", num_kv_blocks=64, kv_cache_dtype="int8") as llm:
        i8 = llm.generate(prompts[0], lp, use_tqdm=False)[0]
    assert f32.logprobs[0][0] != i8.logprobs[0][0]
    assert abs(f32.logprobs[0][0] - i8.logprobs[0][0]) < 0.05
