"""Speculative decoding on real weights: SmolLM2-135M-Instruct asked to repeat passages of
English copies its input, so most n-gram proposals are accepted; the greedy output (tokens,
text, logprobs, a stop string inside a burst) is the same as with speculation off, with chunked
prefill, prefix-cache hits and preemption. And SmolLM2 as its own draft model: the same greedy
output, nearly every proposal kept."""

from pathlib import Path

import pytest

from infer_cluster.protocol import SamplingParams
from infer_cluster.worker import LLM

TEXT = Path(__file__).parent.parent / "data" / "pride_and_prejudice_ch1-2.txt"
SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4,
        "adaptive": False}
SYSTEM = {"role": "system", "content": "You copy text faithfully."}


def passages() -> list[str]:
    body = TEXT.read_text().split("\n", 2)[2]
    return [p.strip()[:400] for p in body.split("\n\n") if len(p.strip()) > 200][:3]


def conversations() -> list[list[dict]]:
    return [[SYSTEM, {"role": "user", "content": f"Repeat this passage exactly, word for word:\n\n{p}"}]
            for p in passages()]


def params() -> list[SamplingParams]:
    greedy = SamplingParams(temperature=0, max_tokens=32)
    return [greedy, SamplingParams(temperature=0, max_tokens=32, logprobs=2),
            SamplingParams(temperature=0, max_tokens=32, stop=["the girls"])]


def run(llm):
    return [(o.token_ids, o.text, o.finish_reason, o.logprobs)
            for o in llm.chat(conversations(), params(), use_tqdm=False)]


@pytest.mark.slow  # about 2 minutes on a loaded 2-core CPU, most of it speculation off
def test_greedy_output_equals_speculation_off(smollm2_dir):
    # 16-token blocks, 20 of them (3 requests need ~10 each): preemption; 64-token steps:
    # chunked prefill; the shared system turn: prefix-cache hits
    kw = dict(block_size=16, num_kv_blocks=20, max_num_batched_tokens=64)
    want = run(LLM(smollm2_dir, **kw))
    llm = LLM(smollm2_dir, speculative_config=SPEC, **kw)
    got = run(llm)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a[:3] == b[:3], f"request {i}"
        if b[3] is not None:
            assert [lp[0] for lp in a[3]] == pytest.approx([lp[0] for lp in b[3]], abs=1e-4)
            assert [list(lp[1]) for lp in a[3]] == [list(lp[1]) for lp in b[3]]
    assert got[2][2] == "stop"  # the stop string, inside the copied passage
    stats = llm.stats()
    assert stats["num_preemptions"] > 0 and stats["prefix_cache_hit_tokens"] > 0
    # the model copies its input: most proposals are kept
    assert stats["num_spec_accepted_tokens"] > 0.6 * stats["num_spec_draft_tokens"] > 0
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


def test_smollm2_as_its_own_draft_model(smollm2_dir):
    """A draft model (`method: draft_model`) with the target's own weights, on one short
    input-grounded prompt: the greedy output is the same and nearly every proposal is kept."""
    conversation = [SYSTEM, {"role": "user", "content": "Repeat this passage exactly, word for "
                                                       f"word:\n\n{passages()[0][:160]}"}]
    greedy = SamplingParams(temperature=0, max_tokens=16)
    kw = dict(block_size=16, num_kv_blocks=16)
    want = LLM(smollm2_dir, **kw).chat([conversation], greedy, use_tqdm=False)[0]
    draft = {"method": "draft_model", "model": smollm2_dir, "num_speculative_tokens": 4,
             "adaptive": False}
    llm = LLM(smollm2_dir, speculative_config=draft, **kw)
    got = llm.chat([conversation], greedy, use_tqdm=False)[0]
    assert (got.token_ids, got.text) == (want.token_ids, want.text)
    stats = llm.stats()
    assert stats["num_spec_accepted_tokens"] >= 0.9 * stats["num_spec_draft_tokens"] > 0
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


def test_json_output_speculates_within_its_schema(smollm2_dir):
    """Structured output on real weights: asked for a JSON object quoting its input, SmolLM2
    copies the passage inside the schema's string, prompt lookup proposes the copy, the grammar
    masks every proposed position, and the greedy output is speculation off's, with nearly
    every proposal kept."""
    import json

    schema = {"type": "object", "properties": {"quote": {"type": "string"}}, "required": ["quote"]}
    conversation = [SYSTEM, {"role": "user", "content": 'Return a JSON object whose "quote" field is the '
                                                       "first sentence of this passage, copied exactly:\n\n"
                                                       f"{passages()[0][:300]}"}]
    params = SamplingParams(temperature=0, max_tokens=72, structured_outputs={"json": schema})
    kw = dict(block_size=16, num_kv_blocks=32)
    want = LLM(smollm2_dir, **kw).chat([conversation], params, use_tqdm=False)[0]
    llm = LLM(smollm2_dir, speculative_config=SPEC, **kw)
    got = llm.chat([conversation], params, use_tqdm=False)[0]
    assert (got.token_ids, got.text, got.finish_reason) == (want.token_ids, want.text, want.finish_reason)
    assert got.text.startswith('{"quote": "However little known the feelings')
    if got.finish_reason == "stop":
        assert json.loads(got.text)["quote"]
    stats = llm.stats()
    assert stats["num_spec_accepted_tokens"] >= 0.8 * stats["num_spec_draft_tokens"] > 10
    assert stats["num_free_blocks"] == stats["num_total_blocks"]
