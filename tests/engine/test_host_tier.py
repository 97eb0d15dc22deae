"""The host KV tier (`kv_offload_gib`) through the offline `LLM` on `tiny-random`: prefixes
evicted from a tiny device pool come back from the host (counted per tier, fewer tokens
computed) and preempted requests are swapped out and resumed (also with async scheduling), and
many requests at once over interleaved prefixes load while other requests' steps are in flight,
with the same greedy tokens as runs without the tier. The same tests run on CUDA (`-m gpu`):
pinned pool, side copy streams, CUDA graphs."""

import pytest
import torch

from infer_cluster.protocol import SamplingParams
from infer_cluster.protocol.errors import ConfigError
from infer_cluster.worker import LLM

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
TIER_GIB = 0.001  # tiny-random float32: 16 KiB per block, so 65 host blocks
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device")])]


def _options(device):
    return dict(device=device, dtype="float32", warmup=False)


def _prefixed(round_):
    """Four distinct 64-token prefixes (4 blocks of 16), each with a short suffix per round."""
    return [[3 + p] + list(range(10 + 70 * p, 73 + 70 * p)) + [400 + round_] * (3 + p) for p in range(4)]


def _run_one_by_one(kv_offload_gib, kv_cache_dtype, device):
    outs = []
    # 12 blocks: two prompts' prefixes fit, so the third evicts the first (least recently freed).
    with LLM("tiny-random", num_kv_blocks=12, kv_offload_gib=kv_offload_gib,
             kv_cache_dtype=kv_cache_dtype, **_options(device)) as llm:
        for round_ in range(2):
            for prompt in _prefixed(round_):
                outs += llm.generate([prompt], GREEDY, use_tqdm=False)
        stats = llm.stats()
        if kv_offload_gib:
            llm.engine.host_tier.begin_step()
            llm.engine.host_tier.check_invariants()
        llm.engine.allocator.check_invariants()
    return outs, stats


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8"])
def test_evicted_prefixes_come_back_from_the_host(kv_cache_dtype, device):
    ref, ref_stats = _run_one_by_one(0, kv_cache_dtype, device)
    got, stats = _run_one_by_one(TIER_GIB, kv_cache_dtype, device)
    assert [o.token_ids for o in got] == [o.token_ids for o in ref]
    # sized from the bytes per block: 16 KiB (float32), 4.5 KiB (int8 + scales)
    assert ref_stats["num_host_blocks"] == 0
    assert stats["num_host_blocks"] == {"auto": 65, "int8": 233}[kv_cache_dtype]
    second = got[4:]
    assert all(o.num_cached_tokens_host == 64 and o.num_cached_tokens == 0 for o in second[:2])
    assert sum(o.num_cached_tokens_host for o in got[:4]) == 0
    assert stats["prefix_cache_hit_tokens_host"] >= 128 and stats["host_hit_blocks"] >= 8
    assert stats["host_stored_blocks"] > 0
    assert stats["num_scheduled_tokens"] <= ref_stats["num_scheduled_tokens"] - 128
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_preemption_swaps_out_and_gives_the_same_tokens(device, async_scheduling):
    shared = list(range(3, 67))
    prompts = [shared + [100 + i] * (5 + 7 * i) for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    with LLM("tiny-random", num_kv_blocks=256, enable_prefix_caching=False, **_options(device)) as llm:
        ref = llm.generate(prompts, params, use_tqdm=False)
    results = {}
    # 12 blocks: one request needs up to 7, so six at once must preempt.
    for gib in (0, TIER_GIB):
        with LLM("tiny-random", num_kv_blocks=12, max_num_batched_tokens=128,
                 kv_offload_gib=gib, async_scheduling=async_scheduling, **_options(device)) as llm:
            results[gib] = (llm.generate(prompts, params, use_tqdm=False), llm.stats())
            assert llm.stats()["num_free_blocks"] == llm.stats()["num_total_blocks"]
    (recomputed, s0), (swapped, s1) = results[0], results[TIER_GIB]
    assert s0["num_preemptions"] > 0 and s0["num_swapped_out"] == 0
    assert s1["num_swapped_out"] > 0 and s1["host_swapped_in_blocks"] > 0
    assert s1["num_scheduled_tokens"] < s0["num_scheduled_tokens"]  # nothing recomputed
    for r, a, b in zip(ref, recomputed, swapped):
        assert a.token_ids == r.token_ids and b.token_ids == r.token_ids


@pytest.mark.parametrize("device", DEVICES)
def test_interleaved_prefixes_load_beside_steps_in_flight(device):
    """The bench's workload in small: 48 requests over 8 prefixes of 64 tokens, interleaved, with
    a device pool for 3 requests, async scheduling on. Loads and swap-outs are issued while a
    step is in flight (no settling before copies); every token equals the run without the tier."""
    prefixes = [[5 + p] + [(11 * p + 3 * t) % 390 + 2 for t in range(63)] for p in range(8)]
    prompts = [prefixes[i % 8] + [400 + i, 450 + i] for i in range(48)]
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    results = {}
    for gib in (0, TIER_GIB):
        # a request: 66 prompt + 5 output tokens = 5 blocks of 16; 15 blocks hold three
        with LLM("tiny-random", num_kv_blocks=15, kv_offload_gib=gib, async_scheduling=True,
                 **_options(device)) as llm:
            outs = llm.generate(prompts, params, use_tqdm=False)
            stats = llm.stats()
            assert stats["num_free_blocks"] == stats["num_total_blocks"]
            if gib:
                llm.engine.host_tier.begin_step()
                llm.engine.host_tier.check_invariants()
            llm.engine.allocator.check_invariants()
        results[gib] = ([o.token_ids for o in outs], stats)
    (ref, s0), (got, s1) = results[0], results[TIER_GIB]
    assert got == ref
    assert s1["host_hit_blocks"] >= 8 * 4 and s1["host_stored_blocks"] > 0
    assert s1["num_scheduled_tokens"] < s0["num_scheduled_tokens"]


def test_kv_offload_gib_is_validated():
    with pytest.raises(ConfigError, match="kv_offload_gib"):
        LLM("tiny-random", kv_offload_gib=-1)
    with pytest.raises(ConfigError, match="holds no KV block"):
        LLM("tiny-random", num_kv_blocks=8, kv_offload_gib=1e-9)
