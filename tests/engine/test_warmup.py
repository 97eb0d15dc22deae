"""Start-up warm-up runs every sampling path and leaves nothing behind."""

import pytest

from infer_cluster.protocol import SamplingParams
from infer_cluster.worker import LLM

pytestmark = pytest.mark.timeout(300)

OPTS = dict(max_num_batched_tokens=64, max_num_seqs=8, num_kv_blocks=96, max_model_len=256)


def test_warmup_leaves_a_fresh_engine_with_identical_outputs():
    prompts = ["Hello there", [5, 6, 7, 8, 9], "The quick brown fox"]
    params = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
              SamplingParams(temperature=0.8, top_p=0.9, seed=3, max_tokens=12, ignore_eos=True),
              SamplingParams(temperature=0.7, repetition_penalty=1.2, seed=4, max_tokens=12, ignore_eos=True)]
    cold = LLM("tiny-random", warmup=False, **OPTS)
    want = cold.generate(prompts, params, use_tqdm=False)
    warm = LLM("tiny-random", warmup=True, **OPTS)
    info = warm.engine.warmup_stats
    assert info["num_steps"] > 0 and info["batch"] == 8 and info["num_long"] >= 2
    assert info["long_prompt"] > OPTS["max_num_batched_tokens"]  # chunked prefill was reached
    stats = warm.stats()
    assert stats["num_generated_tokens"] == 0 and stats["prefix_cache_hit_tokens"] == 0
    assert stats["num_free_blocks"] == stats["num_total_blocks"] and stats["step_seconds"] == {}
    got = warm.generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert [o.text for o in got] == [o.text for o in want]
    assert warm.stats()["prefix_cache_hit_tokens"] == 0  # no warm-up block was left in the cache
