"""int8 KV cache under tensor x pipeline parallelism: each rank quantizes its own KV heads per
token and head, the same rows the single-process engine quantizes, so greedy output at T=2 x
P=2 equals the single-process int8 engine's (prefix-cache hits on a second round included)."""

import pytest
import torch

from infer_cluster.worker import LLM

from .conftest import ENGINE, GREEDY, check_parallel_greedy, make_prompts


@pytest.mark.timeout(90)
@pytest.mark.parametrize("family,tp,pp", [("llama", 2, 2), ("qwen2", 2, 1)])
def test_int8_kv_parallel_matches_single_process(started, dist_checkpoints, family, tp, pp):
    # qwen2 has 1 KV head: at T=2 both ranks hold (and quantize) a replica of it.
    options = dict(ENGINE, kv_cache_dtype="int8")
    with LLM(dist_checkpoints[family], **options) as llm:
        assert llm.engine.runner.context.kv_caches[0].k.dtype == torch.int8
        ref = [o.token_ids for o in llm.generate(make_prompts(), GREEDY, use_tqdm=False)]
    llm = check_parallel_greedy(started, dist_checkpoints[family], tp, pp, options, [ref])
    assert llm.engine.runner._shard.runner.context.kv_caches[0].k.dtype == torch.int8
