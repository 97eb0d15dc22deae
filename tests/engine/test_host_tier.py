"""The host KV tier (`kv_offload_gib`) through the offline `LLM` on `tiny-random`: prefixes
evicted from a tiny device pool come back from the host (counted per tier, fewer tokens
computed) and preempted requests are swapped out and resumed, with the same greedy tokens as
runs without the tier. The same tests run on CUDA (`-m gpu`): pinned pool, side copy stream,
CUDA graphs."""

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


@pytest.mark.parametrize("device", DEVICES)
def test_preemption_swaps_out_and_gives_the_same_tokens(device):
    shared = list(range(3, 67))
    prompts = [shared + [100 + i] * (5 + 7 * i) for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    with LLM("tiny-random", num_kv_blocks=256, enable_prefix_caching=False, **_options(device)) as llm:
        ref = llm.generate(prompts, params, use_tqdm=False)
    results = {}
    # 12 blocks: one request needs up to 7, so six at once must preempt.
    for gib in (0, TIER_GIB):
        with LLM("tiny-random", num_kv_blocks=12, max_num_batched_tokens=128,
                 kv_offload_gib=gib, **_options(device)) as llm:
            results[gib] = (llm.generate(prompts, params, use_tqdm=False), llm.stats())
    (recomputed, s0), (swapped, s1) = results[0], results[TIER_GIB]
    assert s0["num_preemptions"] > 0 and s0["num_swapped_out"] == 0
    assert s1["num_swapped_out"] > 0 and s1["host_swapped_in_blocks"] > 0
    assert s1["num_scheduled_tokens"] < s0["num_scheduled_tokens"]  # nothing recomputed
    for r, a, b in zip(ref, recomputed, swapped):
        assert a.token_ids == r.token_ids and b.token_ids == r.token_ids


def test_kv_offload_gib_is_validated():
    with pytest.raises(ConfigError, match="kv_offload_gib"):
        LLM("tiny-random", kv_offload_gib=-1)
    with pytest.raises(ConfigError, match="holds no KV block"):
        LLM("tiny-random", num_kv_blocks=8, kv_offload_gib=1e-9)


class LateLoads:
    """A readiness source whose loads land only after `polls` questions each (as CUDA events
    of copies still running would); a blocking wait lands one at once. On CPU the data itself
    is already copied, so what this exercises is the scheduler's waiting."""

    def __init__(self, polls):
        self.polls, self.asked, self.waited = polls, {}, 0

    def done(self, ids):
        for i in ids:
            self.asked[i] = self.asked.get(i, 0) + 1
        return [i for i in ids if self.asked[i] > self.polls]

    def wait(self, load_id):
        self.waited += 1
        self.asked[load_id] = self.polls + 1


@pytest.mark.parametrize("polls", [1, 3])
def test_loads_that_land_late_give_the_same_tokens(polls):
    """Prefix hits and swapped-out requests whose copies land several steps late (readiness
    injected into the real engine): the others keep running, and every output matches the run
    without the tier."""
    shared = list(range(3, 67))
    prompts = [shared + [100 + i] * (5 + 7 * i) for i in range(6)] + _prefixed(0) + _prefixed(1)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    with LLM("tiny-random", num_kv_blocks=256, **_options("cpu")) as llm:
        ref = llm.generate(prompts, params, use_tqdm=False)
    with LLM("tiny-random", num_kv_blocks=12, max_num_batched_tokens=128, kv_offload_gib=TIER_GIB,
             **_options("cpu")) as llm:
        late = LateLoads(polls)
        llm.engine.scheduler.loads.loads_done = late.done
        llm.engine.scheduler.loads.wait_load = late.wait
        got = llm.generate(prompts[:6], params, use_tqdm=False)
        got += llm.generate(prompts[6:], params, use_tqdm=False)
        stats = llm.stats()
        assert llm.engine.scheduler.loads.in_flight == []
        llm.engine.allocator.check_invariants()
        llm.engine.host_tier.check_invariants()
    assert [o.token_ids for o in got] == [o.token_ids for o in ref]
    # both kinds of load happened, several of them, each reported late
    assert stats["host_swapped_in_blocks"] > 0 and stats["host_hit_blocks"] > 0 and len(late.asked) > 2
    assert min(late.asked.values()) > polls
    assert stats["num_free_blocks"] == stats["num_total_blocks"]


def test_a_resize_waits_for_loads_in_flight_and_aborts_keep_their_blocks():
    """Loads that never land by themselves (readiness injected): an abort of a loading request
    holds its blocks until the load is waited for; `reset_cache` waits for every load before it
    moves blocks; every other output equals the run without the tier."""
    prompts = _prefixed(0) + _prefixed(1)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    with LLM("tiny-random", num_kv_blocks=256, **_options("cpu")) as llm:
        ref = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    with LLM("tiny-random", num_kv_blocks=12, max_num_batched_tokens=128, kv_offload_gib=TIER_GIB,
             max_model_len=128, **_options("cpu")) as llm:
        late = LateLoads(10**9)  # lands only when waited for
        llm.engine.scheduler.loads.loads_done = late.done
        llm.engine.scheduler.loads.wait_load = late.wait
        llm.generate(prompts[:4], params, use_tqdm=False)  # every prefix is on the host now
        sched = llm.engine.scheduler
        for i, p in enumerate(prompts[4:]):
            llm.engine.add_request(p, params, request_id=f"r{i}")
        tokens = {f"r{i}": [] for i in range(4)}
        resized = aborted = False
        while llm.engine.has_unfinished_requests():
            for d in llm.engine.step():
                tokens[d.request_id] += d.token_ids
            loading = [rid for rid in sched.requests if sched.loads.is_waiting(rid)]
            if loading and not aborted:
                req = sched.requests[loading[-1]]
                held = [b for b in req.block_ids if b in sched.loads.block_load]
                llm.engine.abort(req.request_id)
                assert held and all(llm.engine.allocator.ref_count[b] == 1 for b in held)
                aborted = req.request_id
            elif loading and not resized:
                waits = late.waited
                llm.engine.reset_cache(num_kv_blocks=16)
                assert sched.loads.in_flight == [] and late.waited > waits
                sched = llm.engine.scheduler
                resized = True
        assert aborted and resized
        llm.engine.allocator.check_invariants()
        llm.engine.host_tier.check_invariants()
    for i, want in enumerate(ref[4:]):
        if f"r{i}" != aborted:
            assert tokens[f"r{i}"] == want
