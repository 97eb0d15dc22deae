"""Scheduler driven directly with Requests: token budget and chunked prefill, ordering, prefix
cache hits with exact block ids, and preemption by recompute. Lifecycle, stop rules and random
workloads are in test_scheduler_lifecycle.py.
"""



from infer_cluster.protocol import RequestStatus
from infer_cluster.worker.sched.block_allocator import hash_full_blocks
from infer_cluster.worker.sched.output import ScheduledRequest

from .scheduler_harness import Harness, prompt_of, summary


# -- token budget and chunked prefill ------------------------------------------------------------

def test_chunked_prefill_8_8_4_only_last_chunk_samples():
    h = Harness(num_blocks=16, block_size=4, max_num_batched_tokens=8)
    prompt = prompt_of(20)
    req = h.add("a", prompt, max_tokens=4)

    out = h.schedule()
    assert out.requests == [ScheduledRequest("a", prompt[0:8], 0, [0, 1], False)]
    assert out.num_batched_tokens == 8 and out.preempted_ids == []
    assert h.update(out, {}) == ([], [])
    assert req.num_computed_tokens == 8 and req.output_token_ids == []
    assert req.status is RequestStatus.RUNNING

    out = h.schedule()
    assert out.requests == [ScheduledRequest("a", prompt[8:16], 8, [0, 1, 2, 3], False)]
    assert out.num_batched_tokens == 8
    h.update(out, {})
    assert req.num_computed_tokens == 16

    out = h.schedule()
    assert out.requests == [ScheduledRequest("a", prompt[16:20], 16, [0, 1, 2, 3, 4], True)]
    assert out.num_batched_tokens == 4
    advanced, finished = h.update(out, {"a": 42})
    assert advanced == [req] and finished == []
    assert req.output_token_ids == [42] and req.num_computed_tokens == 20

    # Decode: the sampled token is computed next, at position 20, in a new sixth block.
    out = h.schedule()
    assert out.requests == [ScheduledRequest("a", [42], 20, [0, 1, 2, 3, 4, 5], True)]
    assert out.num_batched_tokens == 1
    h.update(out, {"a": 43})
    for tok in (44, 45):
        h.update(h.schedule(), {"a": tok})
    assert req.output_token_ids == [42, 43, 44, 45]
    assert req.status is RequestStatus.FINISHED and req.finish_reason == "length"
    h.assert_all_free()


def test_decodes_come_before_new_prefills_and_share_the_budget():
    h = Harness(num_blocks=16, block_size=4, max_num_batched_tokens=8)
    a = h.add("a", prompt_of(5), max_tokens=10)
    b = h.add("b", prompt_of(4, start=200), max_tokens=10)
    out = h.schedule()
    # a's whole prompt, then b's prompt fills the rest of the budget.
    assert summary(out) == [("a", 0, 5, [0, 1], True), ("b", 0, 3, [2], False)]
    assert out.num_batched_tokens == 8
    h.update(out, {"a": 7})

    c = h.add("c", prompt_of(20, start=300), max_tokens=10)
    out = h.schedule()
    # Running requests first (a decodes, b finishes its prefill), then c's first chunk.
    assert summary(out) == [("a", 5, 1, [0, 1], True), ("b", 3, 1, [2], True),
                            ("c", 0, 6, [3, 4], False)]
    assert out.num_batched_tokens == 8
    h.update(out, {"a": 7, "b": 7})
    assert c.num_computed_tokens == 6

    out = h.schedule()
    assert summary(out) == [("a", 6, 1, [0, 1], True), ("b", 4, 1, [2, 5], True),
                            ("c", 6, 6, [3, 4, 6], False)]
    h.update(out, {"a": 7, "b": 7})
    while h.sched.has_unfinished():
        out, _ = h.step()
        assert out.num_batched_tokens <= 8
    assert [len(r.output_token_ids) for r in (a, b, c)] == [10, 10, 10]
    h.assert_all_free()


def test_budget_exhausted_by_decodes_leaves_new_request_waiting():
    h = Harness(num_blocks=32, block_size=4, max_num_batched_tokens=2)
    h.add("a", [1], max_tokens=5)
    h.add("b", [2], max_tokens=5)
    h.step()
    c = h.add("c", [3], max_tokens=5)
    out, _ = h.step()
    assert summary(out) == [("a", 1, 1, [0], True), ("b", 1, 1, [1], True)]
    assert c.status is RequestStatus.WAITING and c.block_ids == []


def test_max_num_seqs_limits_running_requests():
    h = Harness(num_blocks=32, block_size=4, max_num_seqs=2, max_num_batched_tokens=64)
    a = h.add("a", prompt_of(3), max_tokens=2)
    b = h.add("b", prompt_of(3), max_tokens=3)
    c = h.add("c", prompt_of(3), max_tokens=1)
    out, _ = h.step()
    assert [s.request_id for s in out.requests] == ["a", "b"]
    assert c.status is RequestStatus.WAITING and h.sched.waiting == [c]
    out, (_, finished) = h.step()
    assert [s.request_id for s in out.requests] == ["a", "b"]
    assert finished == [a]
    out, _ = h.step()  # a's slot is free now
    assert [s.request_id for s in out.requests] == ["b", "c"]
    assert len(h.sched.running) <= 2
    h.assert_all_free()


# -- ordering ------------------------------------------------------------------------------------

def test_fcfs_admission_order():
    h = Harness(num_blocks=32, max_num_seqs=1)
    order = []
    for rid in ("x", "y", "z"):
        h.add(rid, prompt_of(2), max_tokens=1)
    while h.sched.has_unfinished():
        out, _ = h.step()
        order += [s.request_id for s in out.requests]
    assert order == ["x", "y", "z"]
    h.assert_all_free()


def test_priority_lower_value_first_then_arrival():
    h = Harness(num_blocks=32, max_num_seqs=1)
    h.add("late-low", prompt_of(2), priority=5, max_tokens=1)
    h.add("p1-first", prompt_of(2), priority=1, max_tokens=1)
    h.add("urgent", prompt_of(2), priority=0, max_tokens=1)
    h.add("p1-second", prompt_of(2), priority=1, max_tokens=1)
    assert [r.request_id for r in h.sched.waiting] == ["urgent", "p1-first", "p1-second", "late-low"]
    order = []
    while h.sched.has_unfinished():
        out, _ = h.step()
        order += [s.request_id for s in out.requests]
    assert order == ["urgent", "p1-first", "p1-second", "late-low"]
    h.assert_all_free()


def test_running_kept_sorted_by_priority():
    h = Harness(num_blocks=32, max_num_batched_tokens=64)
    h.add("a", prompt_of(2), priority=2, max_tokens=5)
    h.step()
    h.add("b", prompt_of(2), priority=1, max_tokens=5)
    out, _ = h.step()
    assert [s.request_id for s in out.requests] == ["a", "b"]  # a decodes, b is admitted
    assert [r.request_id for r in h.sched.running] == ["b", "a"]
    out, _ = h.step()
    assert [s.request_id for s in out.requests] == ["b", "a"]


# -- prefix cache ---------------------------------------------------------------------------------

def test_prefix_cache_hit_at_admission_gets_exact_blocks():
    h = Harness(num_blocks=16, block_size=4, max_num_batched_tokens=64)
    shared = prompt_of(8)
    a = h.add("a", shared + [1, 2], max_tokens=3)
    out, _ = h.step()
    assert summary(out) == [("a", 0, 10, [0, 1, 2], True)]
    assert a.num_cached_tokens == 0
    # a's two full blocks are registered under their chained hashes.
    hashes = hash_full_blocks(shared, 4)
    assert h.alloc.lookup_prefix(hashes) == [0, 1]

    b = h.add("b", shared + [3, 4, 5], max_tokens=3)
    out, _ = h.step()
    assert summary(out) == [("a", 10, 1, [0, 1, 2], True), ("b", 8, 3, [0, 1, 3], True)]
    assert out.requests[1].token_ids == [3, 4, 5]
    assert b.num_computed_tokens == 11 and b.num_cached_tokens == 8
    assert h.sched.prefix_cache_hit_tokens == 8
    assert h.alloc.ref_count[:4] == [2, 2, 1, 1]
    while h.sched.has_unfinished():
        h.step()
    h.assert_all_free()


def test_prefix_hit_never_covers_the_whole_prompt():
    h = Harness(num_blocks=16, block_size=4)
    shared = prompt_of(8)
    h.add("a", shared + [1], max_tokens=1)
    h.step()  # a finishes; its blocks 0, 1 stay cached while free
    assert h.alloc.lookup_prefix(hash_full_blocks(shared, 4)) == [0, 1]
    c = h.add("c", shared, max_tokens=1)
    out = h.schedule()
    # Only one of the two matching blocks is used: the last token must be computed.
    assert out.requests == [ScheduledRequest("c", shared[4:8], 4, [0, 3], True)]
    assert c.num_cached_tokens == 4
    h.update(out, {"c": 9})
    h.assert_all_free()


def test_freed_cached_blocks_are_revived():
    h = Harness(num_blocks=8, block_size=4)
    shared = prompt_of(8)
    h.add("a", shared + [1], max_tokens=1)
    h.step()
    assert h.alloc.ref_count == [0] * 8
    b = h.add("b", shared + [2, 3], max_tokens=2)
    out = h.schedule()
    assert summary(out) == [("b", 8, 2, [0, 1, 3], True)]
    assert h.alloc.ref_count[:4] == [1, 1, 0, 1]
    assert h.alloc.num_evictions == 0
    h.update(out, {"b": 4})
    assert b.num_cached_tokens == 8
    h.step()
    h.assert_all_free()


def test_no_prefix_hit_with_caching_disabled():
    h = Harness(num_blocks=16, block_size=4, enable_prefix_caching=False)
    shared = prompt_of(8)
    h.add("a", shared + [1], max_tokens=1)
    h.step()
    b = h.add("b", shared + [2], max_tokens=1)
    out, _ = h.step()
    assert summary(out) == [("b", 0, 9, [3, 4, 5], True)]  # never-used blocks first
    assert b.num_cached_tokens == 0 and h.sched.prefix_cache_hit_tokens == 0
    h.assert_all_free()


def test_decoded_tokens_fill_blocks_that_later_prompts_hit():
    h = Harness(num_blocks=16, block_size=4)
    a = h.add("a", [1, 2, 3], max_tokens=6)
    toks = iter([4, 5, 6, 7, 8, 9])
    while h.sched.has_unfinished():
        out = h.schedule()
        h.update(out, {s.request_id: next(toks) for s in out.requests if s.needs_sample})
    assert a.output_token_ids == [4, 5, 6, 7, 8, 9]
    # Computed: 1..8 (9 was sampled last and never computed), so two full blocks cached.
    b = h.add("b", [1, 2, 3, 4, 5, 6, 7, 8, 10], max_tokens=1)
    out = h.schedule()
    assert summary(out) == [("b", 8, 1, [0, 1, 2], True)]
    assert b.num_cached_tokens == 8
    h.update(out, {"b": 1})
    h.assert_all_free()


# -- preemption ------------------------------------------------------------------------------------

def test_preemption_of_newest_by_recompute_keeps_tokens():
    h = Harness(num_blocks=4, block_size=4, max_num_seqs=2, max_num_batched_tokens=16)
    a = h.add("a", prompt_of(7, 10), max_tokens=4)
    b = h.add("b", prompt_of(7, 30), max_tokens=9)
    c = h.add("c", prompt_of(3, 50), max_tokens=1)
    out, _ = h.step(token=1)
    assert summary(out) == [("a", 0, 7, [0, 1], True), ("b", 0, 7, [2, 3], True)]
    out, _ = h.step(token=2)
    assert summary(out) == [("a", 7, 1, [0, 1], True), ("b", 7, 1, [2, 3], True)]

    # a needs a third block and none is free: b, the newest, is preempted.
    out = h.schedule()
    assert summary(out) == [("a", 8, 1, [0, 1, 3], True)]
    assert out.preempted_ids == ["b"]
    assert b.status is RequestStatus.PREEMPTED
    assert b.block_ids == [] and b.num_computed_tokens == 0 and b.num_preemptions == 1
    assert h.sched.num_preemptions == 1
    assert b.output_token_ids == [1, 2]
    assert h.sched.waiting == [b, c]  # back at the front, by arrival order
    assert h.sched.running == [a]
    assert h.alloc.num_evictions == 1  # b's second block was cached, now it is a's
    h.update(out, {"a": 3})

    out, (_, finished) = h.step(token=4)
    # b still does not fit (needs 3 blocks, 1 free): it waits, and c waits behind it.
    assert summary(out) == [("a", 9, 1, [0, 1, 3], True)]
    assert finished == [a] and a.output_token_ids == [1, 2, 3, 4]
    assert a.finish_reason == "length"

    # b is recomputed: prompt + its 2 tokens; its first block is still cached (block 2).
    # a's blocks were freed tail first, so b takes 3 then 1, and c gets the last one.
    out = h.schedule()
    assert summary(out) == [("b", 4, 5, [2, 3, 1], True), ("c", 0, 3, [0], True)]
    assert out.requests[0].token_ids == prompt_of(3, 34) + [1, 2]
    assert b.num_cached_tokens == 0  # the hit after preemption is not a cache hit for the user
    assert h.alloc.ref_count == [1, 1, 1, 1]
    h.update(out, {"b": 5, "c": 6})
    while h.sched.has_unfinished():
        h.step(token=6)
    assert b.output_token_ids == [1, 2, 5, 6, 6, 6, 6, 6, 6]
    assert b.finish_reason == "length"
    assert c.output_token_ids == [6] and c.status is RequestStatus.FINISHED
    h.assert_all_free()


def test_no_admission_in_a_step_that_preempted():
    h = Harness(num_blocks=4, block_size=4, max_num_batched_tokens=16)
    a = h.add("a", prompt_of(7), max_tokens=3)
    b = h.add("b", prompt_of(5, 40), max_tokens=3)
    h.step()
    h.step()
    c = h.add("c", [1, 2], priority=-1, max_tokens=1)  # ahead of b in the waiting queue
    out = h.schedule()
    assert summary(out) == [("a", 8, 1, [0, 1, 3], True)]
    assert out.preempted_ids == ["b"]
    # Block 2 is free and would hold c, but a step that had to preempt admits nothing.
    assert h.alloc.num_free_blocks == 1
    assert h.sched.waiting == [c, b] and c.status is RequestStatus.WAITING
    h.update(out, {"a": 7})
    assert a.is_finished
    while h.sched.has_unfinished():
        h.step()
    assert b.output_token_ids == [7, 7, 7] and c.output_token_ids == [7]
    h.assert_all_free()


def test_tail_request_preempts_itself():
    h = Harness(num_blocks=4, block_size=4, max_num_batched_tokens=16)
    a = h.add("a", prompt_of(6), max_tokens=2)
    b = h.add("b", prompt_of(8, 40), max_tokens=4)
    out, _ = h.step()
    assert summary(out) == [("a", 0, 6, [0, 1], True), ("b", 0, 8, [2, 3], True)]
    out = h.schedule()
    # a fits in its blocks; b (the tail) needs a third block and can only preempt itself.
    assert summary(out) == [("a", 6, 1, [0, 1], True)]
    assert out.preempted_ids == ["b"]
    assert b.status is RequestStatus.PREEMPTED and h.sched.waiting == [b]
    h.update(out, {"a": 7})
    assert a.is_finished
    out = h.schedule()
    # Block 2 (b's first 4 prompt tokens) and block 3 (the next 4) are still cached.
    assert summary(out) == [("b", 8, 1, [2, 3, 1], True)]
    h.update(out, {"b": 7})
    while h.sched.has_unfinished():
        h.step()
    assert b.output_token_ids == [7, 7, 7, 7]
    h.assert_all_free()


