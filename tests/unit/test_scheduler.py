"""Scheduler driven directly with Requests and a fake "model": exact chunks, block ids, stops.

No model runs: a test "samples" by choosing a token id itself and calling
`update(out, {request_id: token})`. After every step the allocator's invariants are checked,
and once every request has ended every block must be free again.
"""

import random

import pytest
from hypothesis import given, settings, strategies as st

from protocol import OutOfMemoryError, RequestStatus, SamplingParams
from worker.block_allocator import BlockAllocator, hash_full_blocks
from worker.request import Request
from worker.scheduler import ScheduledRequest, Scheduler, SchedulerOutput

EOS = 0


class Harness:
    """A scheduler plus helpers that keep arrival numbers and check invariants."""

    def __init__(self, num_blocks=16, block_size=4, max_num_seqs=8, max_num_batched_tokens=64,
                 max_model_len=256, enable_prefix_caching=True):
        self.alloc = BlockAllocator(num_blocks, block_size, enable_prefix_caching)
        self.sched = Scheduler(self.alloc, max_num_seqs, max_num_batched_tokens, max_model_len)
        self.num_arrivals = 0

    def add(self, rid, prompt, priority=0, eos=(EOS,), **params) -> Request:
        req = Request(rid, list(prompt), SamplingParams(**params), self.num_arrivals, priority, eos)
        self.num_arrivals += 1
        self.sched.add(req)
        return req

    def schedule(self) -> SchedulerOutput:
        out = self.sched.schedule()
        self.alloc.check_invariants()
        return out

    def update(self, out, sampled):
        result = self.sched.update(out, sampled)
        self.alloc.check_invariants()
        return result

    def step(self, token=7):
        """Schedule, sample `token` for every request that needs a sample, update."""
        out = self.schedule()
        sampled = {s.request_id: token for s in out.requests if s.needs_sample}
        return out, self.update(out, sampled)

    def assert_all_free(self):
        assert not self.sched.has_unfinished()
        assert self.sched.requests == {}
        assert self.alloc.num_free_blocks == self.alloc.num_blocks
        assert self.alloc.ref_count == [0] * self.alloc.num_blocks
        self.alloc.check_invariants()


def summary(out: SchedulerOutput):
    """(id, start, number of tokens, block ids, needs_sample) of each scheduled request."""
    return [(s.request_id, s.start_position, len(s.token_ids), s.block_ids, s.needs_sample)
            for s in out.requests]


def prompt_of(n, start=100):
    return list(range(start, start + n))


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


# -- stop rules --------------------------------------------------------------------------------------

def run_one(h, rid, prompt, tokens, **params):
    """Feed `tokens` one per step to a single request until it finishes; return it."""
    req = h.add(rid, prompt, **params)
    feed = iter(tokens)
    while not req.is_finished:
        out = h.schedule()
        sampled = {s.request_id: next(feed) for s in out.requests if s.needs_sample}
        h.update(out, sampled)
    return req


def test_eos_stops_unless_ignore_eos():
    h = Harness()
    req = run_one(h, "a", [5, 6], [9, 8, EOS, 3], max_tokens=10)
    assert req.output_token_ids == [9, 8, EOS]
    assert req.finish_reason == "stop" and req.status is RequestStatus.FINISHED
    req = run_one(h, "b", [5, 6], [EOS, EOS, 4], max_tokens=3, ignore_eos=True)
    assert req.output_token_ids == [EOS, EOS, 4] and req.finish_reason == "length"
    h.assert_all_free()


def test_stop_token_ids_stop_even_with_ignore_eos():
    h = Harness()
    req = run_one(h, "a", [5], [9, 11, 3], max_tokens=10, stop_token_ids=[11], ignore_eos=True)
    assert req.output_token_ids == [9, 11] and req.finish_reason == "stop"
    h.assert_all_free()


def test_max_tokens_gives_length():
    h = Harness()
    req = run_one(h, "a", [5], [1, 2, 3, 4], max_tokens=3)
    assert req.output_token_ids == [1, 2, 3] and req.finish_reason == "length"
    h.assert_all_free()


def test_max_model_len_gives_length():
    h = Harness(max_model_len=12)
    req = run_one(h, "a", prompt_of(10), [1, 2, 3], max_tokens=100)
    assert req.output_token_ids == [1, 2] and req.num_tokens == 12
    assert req.finish_reason == "length"
    h.assert_all_free()


def test_min_tokens_defers_eos_and_stop_tokens():
    h = Harness()
    req = run_one(h, "a", [5], [EOS, 11, EOS, 3], max_tokens=10, min_tokens=3, stop_token_ids=[11])
    assert req.output_token_ids == [EOS, 11, EOS] and req.finish_reason == "stop"
    req = run_one(h, "b", [5], [EOS, EOS], max_tokens=10, min_tokens=2)
    assert req.output_token_ids == [EOS, EOS] and req.finish_reason == "stop"
    h.assert_all_free()


def test_finished_list_and_queues_after_stop():
    h = Harness()
    a = h.add("a", [1, 2], max_tokens=1)
    b = h.add("b", [3, 4], max_tokens=2)
    out = h.schedule()
    advanced, finished = h.update(out, {"a": 9, "b": 9})
    assert advanced == [a, b] and finished == [a]
    assert h.sched.running == [b] and "a" not in h.sched.requests
    assert a.block_ids == []


# -- abort, errors, lifecycle -------------------------------------------------------------------------

def test_abort_running_and_waiting_frees_blocks():
    h = Harness(num_blocks=16, max_num_seqs=1)
    a = h.add("a", prompt_of(9), max_tokens=5)
    b = h.add("b", prompt_of(3), max_tokens=5)
    h.step()
    assert a.block_ids == [0, 1, 2] and h.alloc.num_free_blocks == 13
    assert h.sched.abort("a") is a
    h.alloc.check_invariants()
    assert a.status is RequestStatus.ABORTED and a.finish_reason == "abort"
    assert a.block_ids == [] and h.alloc.num_free_blocks == 16
    assert h.sched.abort("b") is b
    assert b.status is RequestStatus.ABORTED
    assert h.sched.abort("b") is None and h.sched.abort("nope") is None
    h.assert_all_free()


def test_abort_between_schedule_and_update_is_skipped():
    h = Harness()
    a = h.add("a", prompt_of(5), max_tokens=5)
    b = h.add("b", prompt_of(5), max_tokens=5)
    out = h.schedule()
    h.sched.abort("a")
    advanced, finished = h.update(out, {"a": 1, "b": 1})
    assert advanced == [b] and finished == []
    assert a.output_token_ids == [] and a.status is RequestStatus.ABORTED
    h.sched.abort("b")
    h.assert_all_free()


def test_abort_preempted_request():
    h = Harness(num_blocks=4, block_size=4, max_num_batched_tokens=16)
    h.add("a", prompt_of(6), max_tokens=2)
    b = h.add("b", prompt_of(8, 40), max_tokens=4)
    h.step()
    out = h.schedule()
    assert out.preempted_ids == ["b"]
    h.sched.abort("b")
    assert b.status is RequestStatus.ABORTED and h.sched.waiting == []
    h.update(out, {"a": 1})
    h.assert_all_free()


def test_add_rejects_request_that_never_fits():
    h = Harness(num_blocks=4, block_size=4, max_model_len=64)
    with pytest.raises(OutOfMemoryError, match=r"needs up to 5 KV blocks .*pool has 4"):
        h.add("big", prompt_of(10), max_tokens=10)
    assert h.sched.requests == {} and h.sched.waiting == []
    with pytest.raises(OutOfMemoryError, match="needs up to 5 KV blocks"):
        h.add("long-prompt", prompt_of(17), max_tokens=1)
    # Exactly the pool fits (prompt 10 + 6 tokens = 16 tokens = 4 blocks).
    req = h.add("fits", prompt_of(10), max_tokens=6)
    while h.sched.has_unfinished():
        h.step()
    assert len(req.output_token_ids) == 6
    h.assert_all_free()


def test_add_bounds_blocks_by_max_model_len():
    h = Harness(num_blocks=4, block_size=4, max_model_len=16)
    req = h.add("a", prompt_of(10), max_tokens=100)
    while h.sched.has_unfinished():
        h.step()
    assert req.num_tokens == 16 and req.finish_reason == "length"
    h.assert_all_free()


@pytest.mark.parametrize("start,new", [
    (RequestStatus.WAITING, RequestStatus.FINISHED),
    (RequestStatus.WAITING, RequestStatus.PREEMPTED),
    (RequestStatus.PREEMPTED, RequestStatus.WAITING),
    (RequestStatus.PREEMPTED, RequestStatus.FINISHED),
    (RequestStatus.RUNNING, RequestStatus.WAITING),
    (RequestStatus.FINISHED, RequestStatus.RUNNING),
    (RequestStatus.ABORTED, RequestStatus.FINISHED),
    (RequestStatus.FAILED, RequestStatus.WAITING),
])
def test_illegal_transitions_raise(start, new):
    req = Request("r", [1], SamplingParams(), 0)
    req.status = start
    with pytest.raises(RuntimeError, match=f"request r: illegal transition {start.name} -> {new.name}"):
        req.transition(new)
    assert req.status is start


def test_legal_lifecycle():
    req = Request("r", [1], SamplingParams(), 0)
    assert req.status is RequestStatus.WAITING
    for s in (RequestStatus.RUNNING, RequestStatus.PREEMPTED, RequestStatus.RUNNING,
              RequestStatus.FINISHED):
        req.transition(s)
        assert req.status is s
    assert req.is_finished


def test_finish_twice_is_a_no_op():
    h = Harness()
    a = run_one(h, "a", [1], [2], max_tokens=1)
    h.sched.finish(a, RequestStatus.ABORTED, "abort")
    assert a.status is RequestStatus.FINISHED and a.finish_reason == "length"
    h.assert_all_free()


def test_resume_tokens_count_toward_max_tokens():
    h = Harness()
    req = Request("r", [1, 2], SamplingParams(max_tokens=3), 0, eos_token_ids=(EOS,),
                  resume_token_ids=[5, 6])
    assert req.num_emitted_tokens == 2 and req.num_tokens == 4
    h.sched.add(req)
    out = h.schedule()
    assert summary(out) == [("r", 0, 4, [0], True)]
    assert out.requests[0].token_ids == [1, 2, 5, 6]
    h.update(out, {"r": 7})
    assert req.output_token_ids == [5, 6, 7] and req.finish_reason == "length"
    h.assert_all_free()


# -- random workloads against a simulated KV cache ---------------------------------------------------

def fake_model(tokens: list[int]) -> int:
    """A deterministic "model": the next token is a function of the whole sequence."""
    acc = len(tokens)
    for t in tokens:
        acc = (acc * 31 + t) % 1000003
    return 1 + acc % 97  # never EOS (0)


def expected_output(prompt, max_tokens, max_model_len, stop_token):
    seq, out = list(prompt), []
    while True:
        tok = fake_model(seq)
        seq.append(tok)
        out.append(tok)
        if tok == stop_token or len(out) >= max_tokens or len(seq) >= max_model_len:
            return out


def run_with_fake_model(h, prompts, max_tokens):
    reqs = [h.add(f"r{i}", p, max_tokens=max_tokens) for i, p in enumerate(prompts)]
    for _ in range(500):
        if not h.sched.has_unfinished():
            break
        out = h.schedule()
        sampled = {}
        for s in out.requests:
            if s.needs_sample:
                sampled[s.request_id] = fake_model(h.sched.requests[s.request_id].all_token_ids)
        h.update(out, sampled)
    h.assert_all_free()
    return [r.output_token_ids for r in reqs]


def test_preempted_requests_finish_with_the_same_tokens():
    prompts = [prompt_of(6, 10 * i) for i in range(4)]
    roomy = Harness(num_blocks=64, block_size=4, max_num_batched_tokens=32)
    tight = Harness(num_blocks=8, block_size=4, max_num_batched_tokens=32)
    expected = run_with_fake_model(roomy, prompts, max_tokens=20)
    assert roomy.sched.num_preemptions == 0
    assert run_with_fake_model(tight, prompts, max_tokens=20) == expected
    assert tight.sched.num_preemptions >= 3
    assert expected == [expected_output(p, 20, 256, -1) for p in prompts]


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), num_blocks=st.integers(6, 24),
       block_size=st.sampled_from([1, 2, 4]), max_num_seqs=st.integers(1, 5),
       budget=st.integers(1, 24), prefix_caching=st.booleans(), max_model_len=st.integers(8, 40))
def test_random_workload_matches_reference(seed, num_blocks, block_size, max_num_seqs, budget,
                                           prefix_caching, max_model_len):
    """Every chunk reads back exactly the KV its request wrote (so prefix hits and preemptions
    are correct), outputs equal an unbatched reference, and every block ends free."""
    rng = random.Random(seed)
    h = Harness(num_blocks, block_size, max_num_seqs, budget, max_model_len, prefix_caching)
    capacity = num_blocks * block_size
    stems = [[rng.randrange(1, 50) for _ in range(rng.randrange(1, 12))] for _ in range(3)]
    kv: dict[tuple[int, int], int] = {}  # (block, slot) -> token whose KV is stored there
    expected, reqs, aborted = {}, {}, set()
    pending = list(range(rng.randrange(1, 10)))

    for _ in range(2000):
        if pending and rng.random() < 0.5:
            i = pending.pop(0)
            prompt = rng.choice(stems) + [rng.randrange(1, 50) for _ in range(rng.randrange(0, 6))]
            max_tokens = rng.randrange(1, 10)
            stop = rng.randrange(1, 98)
            rid = f"r{i}"
            if len(prompt) >= max_model_len:
                continue  # the engine rejects it before the scheduler sees it
            if min(len(prompt) + max_tokens, max_model_len) > capacity:
                with pytest.raises(OutOfMemoryError):
                    h.add(rid, prompt, max_tokens=max_tokens)
                continue
            reqs[rid] = h.add(rid, prompt, priority=rng.randrange(2), max_tokens=max_tokens,
                              stop_token_ids=[stop])
            expected[rid] = expected_output(prompt, max_tokens, max_model_len, stop)
        if not h.sched.has_unfinished():
            if not pending:
                break
            continue
        out = h.schedule()
        assert out.num_batched_tokens == sum(len(s.token_ids) for s in out.requests) <= budget
        assert len(h.sched.running) <= max_num_seqs
        assert len({s.request_id for s in out.requests}) == len(out.requests)
        owners = {}
        for s in out.requests:
            for b in s.block_ids:
                owners.setdefault(b, set()).add(s.request_id)
        sampled = {}
        for s in out.requests:
            req = reqs[s.request_id]
            end = s.start_position + len(s.token_ids)
            assert s.token_ids == req.all_token_ids[s.start_position:end]
            assert len(s.block_ids) == -(-end // block_size)
            # Cached / previously computed positions must hold this request's tokens.
            for pos in range(s.start_position):
                assert kv[(s.block_ids[pos // block_size], pos % block_size)] == req.all_token_ids[pos]
            for pos in range(s.start_position, end):
                block = s.block_ids[pos // block_size]
                # A block written this step belongs to this request alone.
                assert owners[block] == {s.request_id}
                kv[(block, pos % block_size)] = req.all_token_ids[pos]
            if s.needs_sample:
                assert end == req.num_tokens
                seq = [kv[(s.block_ids[p // block_size], p % block_size)] for p in range(end)]
                sampled[s.request_id] = fake_model(seq)
        if rng.random() < 0.03 and h.sched.requests:
            victim = rng.choice(sorted(h.sched.requests))
            h.sched.abort(victim)
            aborted.add(victim)
        h.update(out, sampled)
    assert not pending and not h.sched.has_unfinished()
    for rid, req in reqs.items():
        if rid in aborted and req.status is RequestStatus.ABORTED:
            continue
        assert req.status is RequestStatus.FINISHED
        assert req.output_token_ids == expected[rid]
    h.assert_all_free()

