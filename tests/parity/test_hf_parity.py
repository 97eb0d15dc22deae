"""Greedy output must be token-identical to HF transformers' `generate` (each prompt alone,
float32) for every model family, under default settings, chunked prefill, KV-pool pressure
that forces preemption, and prefix caching; logprobs must match HF's log-softmax."""

import random

import pytest
import torch

from infer_cluster.protocol import SamplingParams
from infer_cluster.worker import LLM

from .conftest import FAMILIES

MAX_TOKENS = 10


def make_prompts(vocab: int = 512, n: int = 16, seed: int = 7) -> list[list[int]]:
    """16 prompts with lengths 1..300; several share long prefixes."""
    rng = random.Random(seed)
    base = [rng.randrange(2, vocab) for _ in range(300)]
    other = [rng.randrange(2, vocab) for _ in range(200)]
    lengths = [1, 2, 5, 15, 16, 17, 31, 33, 64, 100, 129, 150, 200, 255, 299, 300]
    prompts = []
    for i, n_tok in enumerate(lengths[:n]):
        src = base if i % 2 == 0 else other + base
        prompts.append(src[:n_tok] if i % 3 else [rng.randrange(2, vocab) for _ in range(n_tok)])
    return prompts


@pytest.fixture(scope="module")
def hf_reference(checkpoints):
    """HF greedy tokens and per-step log-softmax for every (family, prompt)."""
    from transformers import AutoModelForCausalLM

    ref = {}
    prompts = make_prompts()
    for family, path in checkpoints.items():
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        rows = []
        for p in prompts:
            with torch.no_grad():
                g = model.generate(torch.tensor([p]), max_new_tokens=MAX_TOKENS, do_sample=False,
                                   eos_token_id=None, pad_token_id=1, output_logits=True,
                                   return_dict_in_generate=True)
            tokens = g.sequences[0, len(p):].tolist()
            logprobs = [torch.log_softmax(l[0].float(), -1) for l in g.logits]
            rows.append((tokens, logprobs))
        ref[family] = rows
    return ref


GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
# The reference's device and dtype: on a CUDA host, device "auto" would pick the GPU in bf16,
# which cannot be token-identical to a float32 reference (test_gpu.py checks the GPU in float32).
CPU = dict(device="cpu", dtype="float32")

SETTINGS = {
    "defaults": dict(),
    "chunked_prefill": dict(block_size=16, max_num_batched_tokens=64),
    # 24 blocks of 16 tokens: any one request fits (300 + 10 tokens = 20 blocks), 16 at once do not.
    "preemption": dict(block_size=16, num_kv_blocks=24, max_num_batched_tokens=256),
    "block32_no_prefix_cache": dict(block_size=32, enable_prefix_caching=False),
    # async scheduling (step n+1 launched before step n's ids are on the host), with chunked
    # prefill and a pool small enough to preempt
    "async_preemption": dict(async_scheduling=True, block_size=16, num_kv_blocks=24,
                             max_num_batched_tokens=64),
}


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_greedy_matches_hf(checkpoints, hf_reference, family, setting):
    llm = LLM(checkpoints[family], **CPU, **SETTINGS[setting])
    prompts = make_prompts()
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    for i, (out, (ref_tokens, _)) in enumerate(zip(outs, hf_reference[family])):
        assert out.prompt_token_ids == prompts[i]
        assert out.token_ids == ref_tokens, f"{family}/{setting}: prompt {i} (len {len(prompts[i])}) differs"
        assert out.finish_reason == "length"
    stats = llm.stats()
    if "preemption" in setting:
        assert stats["num_preemptions"] > 0
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_prefix_cache_repeated_prompts(checkpoints, hf_reference, family):
    llm = LLM(checkpoints[family], block_size=16, **CPU)
    prompts = make_prompts()
    first = llm.generate(prompts, GREEDY, use_tqdm=False)
    second = llm.generate(prompts, GREEDY, use_tqdm=False)
    for i, (a, b, (ref_tokens, _)) in enumerate(zip(first, second, hf_reference[family])):
        assert a.token_ids == ref_tokens and b.token_ids == ref_tokens, f"prompt {i}"
        if len(prompts[i]) > 16:  # at least one full block could be served from the cache
            assert b.num_cached_tokens > 0, f"prompt {i} got no cache hit on repeat"
            assert b.num_cached_tokens % 16 == 0 and b.num_cached_tokens < len(prompts[i])
    assert llm.stats()["prefix_cache_hit_tokens"] > 0


@pytest.mark.parametrize("family", list(FAMILIES))
def test_logprobs_match_hf(checkpoints, hf_reference, family):
    llm = LLM(checkpoints[family], **CPU)
    prompts = make_prompts()[:6]
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=3)
    outs = llm.generate(prompts, params, use_tqdm=False)
    for out, (ref_tokens, ref_lp) in zip(outs, hf_reference[family]):
        assert out.token_ids == ref_tokens
        assert len(out.logprobs) == MAX_TOKENS
        for tok, entry, lp in zip(out.token_ids, out.logprobs, ref_lp):
            sampled_lp, top = entry
            assert abs(sampled_lp - lp[tok].item()) < 1e-4
            ref_top = torch.topk(lp, 3)
            assert sorted(top) == sorted(ref_top.indices.tolist())
            for t, v in top.items():
                assert abs(v - lp[t].item()) < 1e-4
