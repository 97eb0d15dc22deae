"""bench/spec_replay.py replays prompt lookup offline from greedy outputs: at batch 1 with
`adaptive` off it must count what the engine itself counts when it speculates (proposals made
and accepted, per position), for several settings, on prompts that repeat themselves."""

import pytest

from bench.spec_replay import replay, summarize
from infer_cluster.protocol import SamplingParams
from infer_cluster.worker import LLM

PROMPTS = [[7, 8, 9, 10] * 6, [4, 5, 6] * 8 + [11, 12], list(range(20, 40)) + list(range(20, 30))]
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def outputs():
    llm = LLM("tiny-random", num_kv_blocks=64)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return [o.token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]


@pytest.mark.parametrize("k,lo,hi", [(3, 1, 2), (4, 2, 4), (8, 1, 8)])
def test_replay_counts_what_the_engine_counts(outputs, k, lo, hi):
    spec = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": lo,
            "prompt_lookup_max": hi, "adaptive": False}
    llm = LLM("tiny-random", num_kv_blocks=64, speculative_config=spec)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    for prompt, want in zip(PROMPTS, outputs):  # one at a time: batch 1
        assert llm.generate([prompt], params, use_tqdm=False)[0].token_ids == want
    got = llm.stats()
    rows = [replay(p, o, k, lo, hi, MAX_TOKENS) for p, o in zip(PROMPTS, outputs)]
    s = summarize(rows, k, plain_ms=1.0, verify_ms=1.0)
    assert s["num_spec_draft_tokens"] > s["num_spec_accepted_tokens"] > 0
    assert (s["num_spec_draft_tokens"], s["num_spec_accepted_tokens"]) == (
        got["num_spec_draft_tokens"], got["num_spec_accepted_tokens"])
    assert s["acceptance_per_position"] == pytest.approx(got["spec_acceptance_per_position"])
    assert s["tokens"] == sum(len(o) - 1 for o in outputs)
