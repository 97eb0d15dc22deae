"""Speculative decoding (prompt lookup) on a tensor-parallel rank group (CPU, gloo): greedy and
seeded outputs equal one rank without speculation, synchronous and async, with verify steps of
both shapes (decode-shaped, and mixed past `DECODE_SHAPED_MAX_ROWS` positions); a rank killed
while a verify step runs fails every request within 10 s, and close() still ends every rank.

Every rank runs the verify step as an ordinary step (the step codec carries its sampled rows);
rank 0 alone proposes, draws and accepts, so nothing about speculation crosses the ranks."""

import os
import signal
import time

import pytest

from infer_cluster.protocol import SamplingParams
from infer_cluster.worker import LLM

from .conftest import ENGINE

SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
        "prompt_lookup_max": 3, "adaptive": False}
# repeating prompts: the random model's output soon cycles too, so lookups find proposals
PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12] * 3, [13, 14, 15] * 6, [40] * 17, [50, 51, 52, 53] * 4,
           [8, 9, 10, 11] * 5, [60, 61]]
KV = dict(ENGINE, num_kv_blocks=160)


def params():
    return [SamplingParams(temperature=0, max_tokens=20 + 4 * i, ignore_eos=True) for i in range(4)] + [
        SamplingParams(temperature=0.8, seed=7, max_tokens=18, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("async_scheduling,decode_shaped", [(False, True), (True, True), (True, False)],
                         ids=["sync", "async", "mixed_verify_steps"])
def test_tensor_parallel_speculation_equals_one_rank_without(started, dist_checkpoints, monkeypatch,
                                                             async_scheduling, decode_shaped):
    from infer_cluster.worker.spec_decode import verify
    path = dist_checkpoints["llama"]
    with LLM(path, **KV) as single:
        want = [(o.token_ids, o.logprobs) for o in single.generate(PROMPTS, params(), use_tqdm=False)]
    if not decode_shaped:  # every verify step as the mixed step it is (k + 1 sampled rows a row)
        monkeypatch.setattr(verify, "decode_shaped", lambda out, max_rows=0: None)
    with LLM(path, tensor_parallel_size=2, speculative_config=SPEC, async_scheduling=async_scheduling,
             **KV) as llm:
        started.track(llm)
        got = [(o.token_ids, o.logprobs) for o in llm.generate(PROMPTS, params(), use_tqdm=False)]
        stats = llm.stats()
    assert [ids for ids, _ in got] == [ids for ids, _ in want]
    for (_, lp), (_, lp_want) in zip(got, want):  # T = 2 sums in another order: float noise
        if lp_want is None:
            assert lp is None
            continue
        for (value, top), (value_want, top_want) in zip(lp, lp_want):
            assert value == pytest.approx(value_want, abs=1e-4) and top.keys() == top_want.keys()
    assert stats["num_spec_accepted_tokens"] > 0 and stats["num_free_blocks"] == stats["num_total_blocks"]


@pytest.mark.timeout(60)
def test_a_rank_killed_while_speculating_fails_every_request_within_10s(started, dist_checkpoints):
    llm = started.track(LLM(dist_checkpoints["llama"], tensor_parallel_size=2, speculative_config=SPEC,
                            async_scheduling=True, **KV))
    long = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
    rids = [llm.add_request(p, long) for p in PROMPTS[:3]]
    for _ in range(40):  # until a verify step is in flight
        assert not any(d.finished for d in llm.step())
        if llm.engine._inflight.holds_verify:
            break
    assert llm.engine._inflight.holds_verify
    killed_at = time.monotonic()
    os.kill(llm.engine.runner.rank_pids[0], signal.SIGKILL)
    finals = {}
    while len(finals) < len(rids):
        assert time.monotonic() - killed_at < 10, "requests still running 10 s after the kill"
        finals.update({d.request_id: d for d in llm.step() if d.finished})
    for d in finals.values():
        assert d.finish_reason == "error" and "rank 1" in d.error["message"], d.error
    stats = llm.stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_a_draft_model_at_t2_runs_on_rank_0_and_equals_one_rank_without(started, dist_checkpoints,
                                                                        async_scheduling):
    """A draft model beside a T = 2 target: the draft whole on rank 0 (one runner in the engine's
    process, no rank of its own), its pool the target's agreed block count; greedy and seeded
    outputs equal one rank without speculation, and a draft with the target's weights has every
    greedy proposal accepted."""
    path = dist_checkpoints["llama"]
    greedy = [SamplingParams(temperature=0, max_tokens=20 + 4 * i, ignore_eos=True) for i in range(4)]
    seeded = SamplingParams(temperature=0.8, seed=7, max_tokens=18, ignore_eos=True)
    with LLM(path, **KV) as single:
        want = [o.token_ids for o in single.generate(PROMPTS[:5], greedy + [seeded], use_tqdm=False)]
    draft = {"method": "draft_model", "model": path, "num_speculative_tokens": 3, "adaptive": False}
    with LLM(path, tensor_parallel_size=2, speculative_config=draft, async_scheduling=async_scheduling,
             **KV) as llm:
        started.track(llm)
        engine = llm.engine
        assert len(engine.runner.rank_pids) == 1  # rank 1 only: the draft has no process
        assert engine.draft_runner.num_kv_blocks == engine.runner.num_kv_blocks
        got = [o.token_ids for o in llm.generate(PROMPTS[:4], greedy, use_tqdm=False)]
        stats = llm.stats()
        got += [o.token_ids for o in llm.generate(PROMPTS[4:5], [seeded], use_tqdm=False)]
    assert got == want
    assert stats["num_spec_accepted_tokens"] == stats["num_spec_draft_tokens"] > 20
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


@pytest.mark.timeout(180)
def test_structured_requests_speculate_at_t2_as_one_rank_without(started, dist_checkpoints):
    """Constrained requests with prompt lookup at T = 2: rank 0 cuts the proposals to the
    grammar and masks every position (the ranks only run the verify step); the outputs equal one
    rank without speculation, greedy and seeded."""
    path = dist_checkpoints["llama"]
    arr = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 8, "maxItems": 20}
    params = [SamplingParams(temperature=0, max_tokens=50, structured_outputs={"json": arr}),
              SamplingParams(temperature=0, max_tokens=40, structured_outputs={"regex": r"(ab, ){3,12}ab"}),
              SamplingParams(temperature=0.8, top_p=0.9, seed=5, max_tokens=50, structured_outputs={"json": arr})]
    with LLM(path, **KV) as single:
        want = [(o.token_ids, o.finish_reason) for o in single.generate(PROMPTS[:3], params, use_tqdm=False)]
    with LLM(path, tensor_parallel_size=2, speculative_config=SPEC, **KV) as llm:
        started.track(llm)
        got = [(o.token_ids, o.finish_reason) for o in llm.generate(PROMPTS[:3], params, use_tqdm=False)]
        stats = llm.stats()
    assert got == want
    assert stats["num_spec_accepted_tokens"] > 0 and stats["num_free_blocks"] == stats["num_total_blocks"]
