"""`DynamicEngine.reset_cache` / `LLM.reset_cache` between steps: shrinking preempts what does
not fit (recompute), growing and retyping go on, and no request is lost, doubled or changed
(greedy outputs equal the reference run's); bad targets change nothing. Also the request
phases (`request_phase`, `stats()` prefilling / generating counts) and metrics on every final."""

from __future__ import annotations

import pytest

from infer_cluster.protocol import SamplingParams
from infer_cluster.worker import LLM

pytestmark = pytest.mark.timeout(180)

# max_model_len 256 with 16-token blocks: the smallest legal pool is 16 blocks.
ENGINE = dict(num_kv_blocks=64, max_num_seqs=6, max_model_len=256, max_num_batched_tokens=64)
PROMPTS = [[(7 * i + j) % 400 + 10 for j in range(30 + 5 * i)] for i in range(6)]
PARAMS = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)


@pytest.fixture(scope="module")
def shared():
    """One engine for the tests that leave its pool as they found it."""
    with LLM("tiny-random", **ENGINE) as llm:
        yield llm


@pytest.fixture(scope="module")
def reference(shared):
    return [o.token_ids for o in shared.generate(PROMPTS, PARAMS, use_tqdm=False)]


def _run(llm, actions):
    """Step to the end; `actions[n]` runs after step n. Returns (outputs, finals per id, deltas)."""
    ids = [llm.add_request(p, PARAMS, request_id=f"r{i}") for i, p in enumerate(PROMPTS)]
    tokens = {rid: [] for rid in ids}
    finals = {}
    n = 0
    while llm.has_unfinished_requests():
        for d in llm.step():
            tokens[d.request_id] += d.token_ids
            if d.finished:
                finals[d.request_id] = finals.get(d.request_id, 0) + 1
                assert d.metrics is not None and d.metrics.finish_time is not None
        n += 1
        if n in actions:
            actions[n](llm)
        assert n < 500, "engine did not finish"
    return [tokens[rid] for rid in ids], finals


def test_shrink_then_grow_keeps_every_request_and_its_output(reference):
    seen = {}

    def shrink(llm):
        before = llm.stats()["num_preemptions"]
        before_running = llm.stats()["num_running"]
        cap = llm.reset_cache(num_kv_blocks=16)
        assert cap["num_total_blocks"] == 16
        st = llm.stats()
        seen["preempted"] = st["num_preemptions"] - before
        seen["running"] = st["num_running"]
        seen["before_running"] = before_running
        # survivors' blocks were moved into the new, smaller pool
        assert all(b < 16 for r in llm.engine.scheduler.running for b in r.block_ids)
        llm.engine.allocator.check_invariants()

    def grow(llm):
        assert llm.reset_cache(num_kv_blocks=96)["num_total_blocks"] == 96
        assert llm.stats()["num_free_blocks"] <= 96

    with LLM("tiny-random", **ENGINE) as llm:
        outputs, finals = _run(llm, {6: shrink, 10: grow})
        assert outputs == reference
        assert finals == {f"r{i}": 1 for i in range(len(PROMPTS))}
        assert seen["preempted"] >= 1 and seen["running"] >= 1  # some kept KV, some recompute
        st = llm.stats()
        assert st["num_total_blocks"] == st["num_free_blocks"] == 96


def test_int8_retype_while_serving_finishes_every_request(reference):
    def retype(llm):
        cap = llm.reset_cache(kv_cache_dtype="int8")
        assert cap["kv_cache_dtype"] == "int8" and cap["num_total_blocks"] > 64  # same bytes
        assert llm.stats()["num_running"] == 0  # a new dtype: everything recomputes

    with LLM("tiny-random", **ENGINE) as llm:
        outputs, finals = _run(llm, {4: retype})
        assert finals == {f"r{i}": 1 for i in range(len(PROMPTS))}
        assert [len(o) for o in outputs] == [len(r) for r in reference]
        # int8 KV may flip a near-tie of the tiny random model; garbage would match nothing
        same = sum(a == b for o, r in zip(outputs, reference) for a, b in zip(o, r))
        assert same >= 0.5 * sum(len(r) for r in reference)
        back = llm.reset_cache(num_kv_blocks=64, kv_cache_dtype="auto")
        assert back["kv_cache_dtype"] == "auto" and back["num_total_blocks"] == 64
        assert [o.token_ids for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)] == reference


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_kv_blocks=15), "too small"),
    (dict(kv_cache_dtype="fp8"), "kv_cache_dtype must be one of"),
    (dict(), "needs num_kv_blocks"),
    (dict(num_kv_blocks=1 << 40), "GiB"),
])
def test_bad_targets_change_nothing(shared, kwargs, match):
    llm = shared
    rid = llm.add_request(PROMPTS[0], PARAMS)
    llm.step()
    before = (llm.engine.capacity(), list(llm.engine.scheduler.running[0].block_ids),
              llm.stats()["num_free_blocks"])
    with pytest.raises(Exception, match=match):
        llm.reset_cache(**kwargs)
    after = (llm.engine.capacity(), list(llm.engine.scheduler.running[0].block_ids),
             llm.stats()["num_free_blocks"])
    assert after == before
    assert llm.engine.request_phase(rid) in ("prefilling", "generating")
    while llm.has_unfinished_requests():
        llm.step()


def test_request_phase_tells_prefilling_from_generating(shared):
    llm = shared
    rid = llm.add_request(list(range(20, 170)), PARAMS)  # 150 tokens: three 64-token chunks
    assert llm.engine.request_phase(rid) == "waiting"
    llm.step()
    assert llm.engine.request_phase(rid) == "prefilling"
    assert (llm.stats()["num_prefilling"], llm.stats()["num_generating"]) == (1, 0)
    llm.step()
    llm.step()  # the last chunk samples the first token
    assert llm.engine.request_phase(rid) == "generating"
    assert (llm.stats()["num_prefilling"], llm.stats()["num_generating"]) == (0, 1)
    while llm.has_unfinished_requests():
        llm.step()
    assert llm.engine.request_phase(rid) == "finished"


def test_generate_outputs_carry_metrics(shared):
    outs = shared.generate(PROMPTS[:3], [PARAMS, PARAMS, SamplingParams(max_tokens=1)], use_tqdm=False)
    for o in outs:
        m = o.metrics
        assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finish_time
        assert m.queue_time >= 0 and m.prefill_time >= 0


def test_with_a_host_tier_victims_swap_out_and_come_back(reference):
    """With `kv_offload_gib`, requests a shrink pushes out keep their KV on the host tier
    (copied from the old pool before it goes) and resume from it; a dtype change empties the
    tier (rebuilt in the new layout) and those requests recompute. Outputs stay the same."""
    seen = {}

    def shrink(llm):
        before = llm.stats()["num_swapped_out"]
        llm.reset_cache(num_kv_blocks=16)
        seen["swapped"] = llm.stats()["num_swapped_out"] - before
        llm.engine.allocator.check_invariants()

    def grow(llm):
        llm.reset_cache(num_kv_blocks=96)
        tier = llm.engine.host_tier
        tier.begin_step()
        tier.check_invariants()

    with LLM("tiny-random", kv_offload_gib=0.004, **ENGINE) as llm:
        outputs, finals = _run(llm, {6: shrink, 10: grow})
        assert outputs == reference
        assert finals == {f"r{i}": 1 for i in range(len(PROMPTS))}
        assert seen["swapped"] >= 1, seen
        host_blocks = llm.engine.host_tier.num_blocks

        def retype(llm):
            llm.reset_cache(kv_cache_dtype="int8")
            assert llm.engine.host_tier.num_blocks > host_blocks  # smaller blocks, same GiB
            assert all(r.host_block_ids is None for r in llm.engine.scheduler.waiting)

        outputs, finals = _run(llm, {3: shrink, 6: retype})
        assert finals == {f"r{i}": 1 for i in range(len(PROMPTS))}
        assert [len(o) for o in outputs] == [len(r) for r in reference]
