"""bench/spec_replay.py replays prompt lookup offline from greedy outputs: at batch 1 with
`adaptive` off it must count what the engine itself counts when it speculates (proposals made
and accepted, per position), for several settings, on prompts that repeat themselves."""

import pytest

from bench.spec_replay import replay_all
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
    s = replay_all([{"prompt": p, "output": o} for p, o in zip(PROMPTS, outputs)], k, lo, hi,
                   MAX_TOKENS, plain_ms=1.0, verify_ms=1.0)
    assert s["num_spec_draft_tokens"] > s["num_spec_accepted_tokens"] > 0
    assert (s["num_spec_draft_tokens"], s["num_spec_accepted_tokens"]) == (
        got["num_spec_draft_tokens"], got["num_spec_accepted_tokens"])
    assert s["spec_acceptance_per_position"] == pytest.approx(got["spec_acceptance_per_position"])
    assert s["tokens"] == sum(len(o) - 1 for o in outputs)


def test_replay_command_reads_saved_outputs(tmp_path, outputs):
    """`bench/spec_replay.py --outputs FILE` replays saved outputs without a model and writes
    one row per (k, window), its estimate from the step costs given."""
    import json

    from bench.spec_replay import main

    saved = tmp_path / "outputs.json"
    saved.write_text(json.dumps([{"prompt": p, "output": o} for p, o in zip(PROMPTS, outputs)]))
    result = main(["--outputs", str(saved), "--output-len", str(MAX_TOKENS), "--k", "2", "4",
                   "--lookup", "1-2", "2-4", "--plain-ms", "1", "--verify-ms", "1",
                   "--out", str(tmp_path / "replay.json")])
    rows = {(r["k"], r["prompt_lookup_min"], r["prompt_lookup_max"]): r for r in result["results"]}
    assert set(rows) == {(2, 1, 2), (2, 2, 4), (4, 1, 2), (4, 2, 4)}
    for r in rows.values():  # equal step costs: the estimate is tokens per step
        steps = r["plain_steps"] + r["verify_steps"]
        assert r["estimated_speedup"] == pytest.approx(r["tokens"] / steps) and r["tokens"] > steps
    assert json.loads((tmp_path / "replay.json").read_text())["results"] == result["results"]


def test_batch_replay_at_batch_1_counts_what_the_batch_1_replay_counts(outputs):
    """bench/spec_replay_batch.py speculating in every step at batch 1 takes the same steps as
    the batch-1 replay (which the test above ties to the engine), and every mode emits every
    token of every output once."""
    from bench.spec_replay_batch import MODES, replay_batches

    data = [{"prompt": p, "output": o} for p, o in zip(PROMPTS, outputs)]
    want = replay_all(data, 4, 2, 4, MAX_TOKENS, plain_ms=1.0, verify_ms=1.0)
    got = replay_batches(data, 1, 4, 2, 4, plain_ms={1: 1.0}, verify_ms={1: 1.0}, switch_ms=0.0)
    assert (got["fixed"]["plain_steps"], got["fixed"]["verify_steps"]) == (
        want["plain_steps"], want["verify_steps"])
    for mode in MODES:
        assert got[mode]["tokens"] == want["tokens"] == sum(len(o) - 1 for o in outputs)
    assert got["off"]["verify_steps"] == 0 and got["fixed"]["speedup"] > 1.0


def test_batch_replay_runs_the_governor(outputs):
    """At batch 3 under the engine's governor: a verify step costing 10 plain ones never pays,
    so after its tries the governor decodes plainly and ends near off; at equal costs it
    speculates and gains like speculating every step."""
    from bench.spec_replay_batch import replay_batches

    data = [{"prompt": p, "output": o} for p, o in zip(PROMPTS, outputs)]
    costly = replay_batches(data, 3, 4, 2, 4, plain_ms={1: 1.0}, verify_ms={1: 10.0}, switch_ms=0.0)
    assert costly["fixed"]["speedup"] < 0.5 < costly["governor"]["speedup"]
    assert costly["governor"]["verify_steps"] < costly["governor"]["plain_steps"]
    cheap = replay_batches(data, 3, 4, 2, 4, plain_ms={1: 1.0}, verify_ms={1: 1.0}, switch_ms=0.0)
    assert cheap["governor"]["speedup"] > 1.0 and cheap["governor"]["verify_steps"] > 0
