"""Speculative decoding with a draft model (`method: draft_model`) on tiny-random: outputs equal
speculation off token for token (greedy and seeded, every finish rule, stop strings, logprobs)
with chunked prefill, prefix-cache hits, preemption (recompute and the host tier), a failover
resume and a KV pool resize; a draft with the target's own weights has every greedy proposal
accepted, one with other weights few; unseeded sampling keeps its distribution (chi-square);
and a draft that cannot be used is refused in one line naming `speculative_config.model`."""

import pytest

from infer_cluster.protocol.errors import ConfigError
from infer_cluster.worker import LLM
from infer_cluster.worker.loading.embedded import EMBEDDED_MODELS, build_checkpoint

from tests.spec_decode.test_engine import (CHI2_CRIT_999, NUM_DRAWS, PROMPTS, SETTINGS, assert_same,
                                           greedy, outputs, reference_params, run_steps,
                                           two_sample_chi_square, unseeded_off, unseeded_on)

__all__ = ["reference_params", "unseeded_off"]  # fixtures shared with test_engine.py


def draft(model: str, k: int = 4) -> dict:
    return {"method": "draft_model", "model": model, "num_speculative_tokens": k, "adaptive": False}


@pytest.fixture(scope="module")
def other_seed_dir(tmp_path_factory) -> str:
    """tiny-random's shape and tokenizer with weights from another seed."""
    spec = {k: v for k, v in EMBEDDED_MODELS["tiny-random"].items() if k != "weights"}
    return str(build_checkpoint(tmp_path_factory.mktemp("draft") / "tiny-other", spec, seed=7))


def test_a_draft_with_the_targets_weights_has_every_greedy_proposal_accepted():
    kw = dict(block_size=8, num_kv_blocks=64, max_num_batched_tokens=24)  # chunked prefill
    params = greedy(30)
    want = [o.token_ids for o in LLM("tiny-random", **kw).generate(PROMPTS, params, use_tqdm=False)]
    llm = LLM("tiny-random", speculative_config=draft("tiny-random"), **kw)
    assert [o.token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)] == want
    stats = llm.stats()
    assert stats["num_spec_accepted_tokens"] == stats["num_spec_draft_tokens"] > 100
    assert stats["spec_acceptance_per_position"] == [1.0] * 4
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


@pytest.mark.parametrize("setting", ["defaults", "chunked_prefill", "preemption", "host_tier"])
def test_the_drafts_kv_follows_the_targets_blocks(setting):
    """With the target's own weights every greedy proposal is kept, so a single rejection means
    the draft read stale KV: after a preemption (recomputed or swapped), a prefix-cache hit (the
    second round), a chunked prompt."""
    kw = {**dict(block_size=8, num_kv_blocks=64), **SETTINGS[setting]}
    params = greedy(30)
    want = [o.token_ids for o in LLM("tiny-random", **kw).generate(PROMPTS, params, use_tqdm=False)]
    llm = LLM("tiny-random", speculative_config=draft("tiny-random"), **kw)
    for _ in range(2):
        assert [o.token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)] == want
    stats = llm.stats()
    assert stats["num_spec_accepted_tokens"] == stats["num_spec_draft_tokens"] > 100
    if setting in ("preemption", "host_tier"):
        assert stats["num_preemptions"] > 0
        assert (stats["num_swapped_out"] > 0) == (setting == "host_tier")
    else:
        assert stats["prefix_cache_hit_tokens"] > 0


@pytest.mark.parametrize("setting", ["defaults", "chunked_prefill", "preemption", "host_tier"])
@pytest.mark.parametrize("which", ["same", "other"])
def test_outputs_equal_speculation_off(reference_params, other_seed_dir, setting, which):
    kw = {**dict(block_size=8, num_kv_blocks=64), **SETTINGS[setting]}
    want = outputs(LLM("tiny-random", **kw), reference_params)
    model = "tiny-random" if which == "same" else other_seed_dir
    llm = LLM("tiny-random", speculative_config=draft(model), **kw)
    got = outputs(llm, reference_params)
    assert_same(got, want, f"{setting}, {which} weights")
    stats = llm.stats()
    proposed, accepted = stats["num_spec_draft_tokens"], stats["num_spec_accepted_tokens"]
    # the same weights: plain greedy rows keep every proposal, penalised and sampled rows
    # reject many; other weights: almost none is kept (tiny-random's argmax is its own)
    assert (accepted > 0.25 * proposed > 0) if which == "same" else (accepted < 0.02 * proposed)
    assert stats["num_free_blocks"] == stats["num_total_blocks"]
    if setting in ("preemption", "host_tier"):
        assert stats["num_preemptions"] > 0
        assert (stats["num_swapped_out"] > 0) == (setting == "host_tier")
    else:
        assert stats["prefix_cache_hit_tokens"] > 0


def test_seeded_requests_reproduce_alone_or_in_a_batch(reference_params):
    seeded = reference_params[3]
    want = LLM("tiny-random", block_size=8, num_kv_blocks=64).generate(
        [PROMPTS[3]], seeded, use_tqdm=False)[0].token_ids
    llm = LLM("tiny-random", block_size=8, num_kv_blocks=64, speculative_config=draft("tiny-random"))
    alone = llm.generate([PROMPTS[3]], seeded, use_tqdm=False)[0].token_ids
    batch = llm.generate(PROMPTS, [seeded] * len(PROMPTS), use_tqdm=False)
    assert alone == want and batch[3].token_ids == want
    assert llm.stats()["num_spec_accepted_tokens"] > 0


def test_a_stop_string_inside_an_accepted_burst(reference_params):
    params = reference_params[2]
    off = run_steps(LLM("tiny-random", block_size=8, num_kv_blocks=64), PROMPTS[2], params)
    past = []
    for k in (3, 4, 5):  # where bursts end depends on k: some k's burst passes the stop string
        llm = LLM("tiny-random", block_size=8, num_kv_blocks=64,
                  speculative_config=draft("tiny-random", k))
        on = run_steps(llm, PROMPTS[2], params)
        assert on[:3] == off[:3] and on[2] == "stop", f"k={k}"
        assert max(on[3]) > 1  # tokens came in bursts
        past.append(llm.stats()["num_generated_tokens"] > len(on[0]))
    assert any(past)  # a burst had tokens after the stop string: the text stage dropped them


def test_unseeded_sampling_keeps_its_distribution(unseeded_off):
    on, stats = unseeded_on(draft("tiny-random", k=3))
    assert stats["num_spec_accepted_tokens"] > NUM_DRAWS // 5
    assert stats["num_spec_accepted_tokens"] < 0.9 * stats["num_spec_draft_tokens"]
    for t, (a, b) in enumerate(zip(on, unseeded_off), start=1):
        stat, df = two_sample_chi_square(a, b)
        assert 1 <= df <= 30 and stat < CHI2_CRIT_999[df], f"token {t}: chi2 {stat:.1f}, df {df}"


def test_a_resumed_request_and_a_kv_pool_resize():
    params = greedy(30)
    kw = dict(block_size=8, num_kv_blocks=64, max_model_len=128)
    want = [o.token_ids for o in LLM("tiny-random", **kw).generate(PROMPTS, params, use_tqdm=False)]
    llm = LLM("tiny-random", speculative_config=draft("tiny-random"), **kw)
    # a failover resume: the first 7 tokens come from the lost replica; the draft starts at 0
    resumed = llm.engine.add_request(PROMPTS[0], params, request_id="resumed",
                                     resume_token_ids=want[0][:7])
    ids = [llm.add_request(p, params, request_id=f"r{i}") for i, p in enumerate(PROMPTS)]
    tokens = {rid: [] for rid in [resumed, *ids]}
    for n in range(400):
        if not llm.has_unfinished_requests():
            break
        for d in llm.step():
            tokens[d.request_id] += d.token_ids
        if n == 2:  # early: every proposal is kept, so requests end within a few steps
            llm.reset_cache(num_kv_blocks=24)  # some keep their KV, the rest are recomputed
        if n == 4:
            llm.reset_cache(num_kv_blocks=96)
    assert [tokens[rid] for rid in ids] == want
    assert want[0][:7] + tokens[resumed] == want[0]
    stats = llm.stats()
    assert stats["num_preemptions"] > 0
    assert stats["num_spec_accepted_tokens"] == stats["num_spec_draft_tokens"] > 0
    assert stats["num_free_blocks"] == stats["num_total_blocks"] == 96
    assert llm.engine.draft_runner.num_kv_blocks == 96


def test_a_draft_that_cannot_be_used_is_refused_naming_the_field(tmp_path):
    spec = {k: v for k, v in EMBEDDED_MODELS["tiny-random"].items() if k != "weights"}
    other_vocab = build_checkpoint(tmp_path / "vocab", dict(spec, vocab_size=1024), weights=False)
    cases = [(str(other_vocab), "vocabulary of 1024 tokens; the target's has 512"),
             (str(tmp_path / "missing"), "cannot be loaded")]
    for model, message in cases:
        with pytest.raises(ConfigError, match=message) as info:
            LLM("tiny-random", num_kv_blocks=16, speculative_config=draft(model))
        text = str(info.value)
        assert text.startswith("speculative_config.model") and "\n" not in text


def test_a_resize_counts_the_drafts_new_pool():
    """The draft's pool is reallocated after the target's, at the same block count: a resize
    that fits the target alone but not both pools is refused (OutOfMemoryError, nothing changes),
    and the same size is accepted without a draft."""
    import os

    from infer_cluster.protocol import OutOfMemoryError

    kw = dict(block_size=8, num_kv_blocks=64)
    plain = LLM("tiny-random", **kw)
    spec = LLM("tiny-random", speculative_config=draft("tiny-random"), **kw)
    runner = spec.engine.runner
    per_block = runner.bytes_per_block
    assert runner.kv_companion is spec.engine.draft_runner
    assert runner.kv_companion.kv_block_bytes("auto") == per_block  # the same model as draft
    free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    blocks = int(0.7 * free) // per_block  # the target alone: 0.7 of free; with the draft: 1.4
    plain.engine.runner.prepare_kv_resize(blocks, "auto")
    with pytest.raises(OutOfMemoryError, match="with the draft model's pool"):
        runner.prepare_kv_resize(blocks, "auto")
    assert spec.engine.capacity()["num_total_blocks"] == 64
