"""`LLM.generate` pauses the cyclic garbage collector while it runs. That is only safe if a
generate call makes no reference cycles per token or per request (everything it drops is freed
by reference counting); these tests check that, and that the collector's state is restored."""

import gc

import pytest

from infer_cluster.protocol import SamplingParams
from infer_cluster.worker import LLM


@pytest.fixture(scope="module")
def llm():
    with LLM("tiny-random", num_kv_blocks=128, block_size=16, max_model_len=256) as engine:
        yield engine


def _params(**kw):
    return SamplingParams(max_tokens=24, ignore_eos=True, **kw)


def test_generate_leaves_no_cycles_per_token(llm):
    kinds = [dict(temperature=0.0, logprobs=3), dict(temperature=0.8, top_p=0.9, seed=3),
             dict(temperature=0.7, repetition_penalty=1.2, stop=["zz"])]
    prompts = [[5 + i, 9, 11 + i] for i in range(24)]
    params = [_params(**kinds[i % 3]) for i in range(24)]
    llm.generate(prompts[:3], params[:3], use_tqdm=False)  # one-time lazy state first
    gc.collect()
    was = gc.isenabled()
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert gc.isenabled() == was
    assert sum(len(o.token_ids) for o in outs) == 24 * 24
    del outs
    garbage = gc.collect()
    # 576 tokens and 24 requests: any per-token or per-request cycle would leave hundreds.
    assert garbage < 24, f"generate left {garbage} objects only the cyclic collector could free"


def test_generate_restores_a_disabled_collector(llm):
    gc.disable()
    try:
        llm.generate([[3, 4, 5]], _params(temperature=0.0), use_tqdm=False)
        assert not gc.isenabled()
    finally:
        gc.enable()
    llm.generate([[3, 4, 5]], _params(temperature=0.0), use_tqdm=False)
    assert gc.isenabled()


def test_the_sampler_keeps_nothing_of_ended_requests(llm):
    """Every request's sampler rows (the plan table, the penalty state) are released when it
    ends, aborted ones included: nothing grows with the number of requests served."""
    kinds = [dict(temperature=0.8, top_k=20, seed=1), dict(temperature=0.7, presence_penalty=0.5),
             dict(temperature=0.9, top_p=0.8), dict(temperature=0.0, logprobs=2)]
    llm.generate([[7 + i, 8, 9] for i in range(12)], [_params(**kinds[i % 4]) for i in range(12)],
                 use_tqdm=False)
    engine = llm.engine
    rid = engine.add_request([4, 5, 6], SamplingParams(temperature=0.7, repetition_penalty=1.3,
                                                       max_tokens=50, ignore_eos=True))
    engine.step()
    engine.step()
    assert len(engine.sampler.plans) == 1
    assert engine.abort(rid)
    while engine.has_unfinished_requests():
        engine.step()
    assert len(engine.sampler.plans) == 0
    assert engine.sampler.state is None or len(engine.sampler.state) == 0
