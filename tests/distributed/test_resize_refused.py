"""A tensor-parallel replica refuses a KV resize with a clear error and keeps serving: rank
workers hold their own KV pools and graphs, and there is no resize op on the rank channel
(restart the replica with --num-kv-blocks instead)."""

import pytest

from infer_cluster.protocol import InvalidRequestError
from infer_cluster.worker import LLM

from .conftest import ENGINE, GREEDY, make_prompts


@pytest.mark.timeout(90)
def test_tensor_parallel_resize_is_refused_and_serving_goes_on(started, dist_checkpoints):
    llm = started.track(LLM(dist_checkpoints["llama"], tensor_parallel_size=2, **ENGINE))
    prompts = make_prompts()
    rid = llm.add_request(prompts[3], GREEDY)
    llm.step()
    with pytest.raises(InvalidRequestError, match="not supported with tensor/pipeline parallel "
                                                  r"\(2 ranks\); restart the replica"):
        llm.reset_cache(num_kv_blocks=64)
    assert llm.engine.capacity()["num_total_blocks"] == ENGINE["num_kv_blocks"]
    assert llm.engine.request_phase(rid) in ("prefilling", "generating")
    outs = llm.generate(prompts[:2], GREEDY, use_tqdm=False)
    assert all(len(o.token_ids) == GREEDY.max_tokens for o in outs)
