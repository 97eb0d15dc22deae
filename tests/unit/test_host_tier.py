"""Host KV tier bookkeeping (`HostTier`) and the scheduler's swap lists, with exact block ids."""

import pytest

from infer_cluster.protocol import RequestStatus
from infer_cluster.worker.sched.host_tier import HostTier

from .scheduler_harness import Harness


def test_store_hands_out_blocks_in_order_and_lookup_stops_at_first_miss():
    t = HostTier(4)
    assert [t.store(h) for h in (10, 11, 12)] == [0, 1, 2]
    assert t.lookup([10, 11, 12, 13]) == [0, 1, 2]
    assert t.lookup([11, 12]) == [1, 2]
    assert t.lookup([99, 10]) == []
    assert t.store(11) is None  # already here: no copy
    assert (t.num_used_blocks, t.num_cached_blocks, t.num_stored_blocks) == (3, 3, 3)
    t.check_invariants()


def test_lru_eviction_skips_blocks_pinned_for_the_step():
    t = HostTier(3)
    for h in (10, 11, 12):
        t.store(h)
    # stored this step: pinned, nothing can be evicted
    assert t.store(13) is None and t.num_available() == 0
    t.begin_step()
    t.store(10)             # touch: 10 becomes most recently used, order 11, 12, 10
    t.begin_step()
    assert t.store(13) == 1  # 11 was least recently used
    assert t.lookup([11]) == [] and t.lookup([13]) == [1]
    t.begin_step()
    t.pin_hits(t.lookup([12]))  # 12 is read this step: 10 goes next, then nothing
    assert t.store(14) == 0
    assert t.store(15) == 1   # 13, stored a step ago
    assert t.store(16) is None
    assert t.num_hit_blocks == 1 and t.num_evicted_blocks == 3
    t.check_invariants()


def test_num_available_counts_free_and_unpinned_cached_blocks():
    """The O(1) count equals a scan, through stores, hits, takes, releases and step ends."""
    import random
    rng = random.Random(0)
    t = HostTier(8)
    owned = []
    for _ in range(400):
        op = rng.randrange(5)
        if op == 0:
            t.store(rng.randrange(20))
        elif op == 1:
            t.pin_hits(t.lookup([rng.randrange(20)]))
        elif op == 2 and (blocks := t.take(rng.randrange(1, 3))) is not None:
            owned.append(blocks)
        elif op == 3 and owned:
            t.release(owned.pop(rng.randrange(len(owned))), in_flight=rng.random() < 0.5)
        elif op == 4:
            t.begin_step()
        scan = len(t._free) + sum(1 for b in t._lru.values() if b not in t.pinned)
        assert t.num_available() == scan
        t.check_invariants()


def test_take_evicts_cached_blocks_and_release_frees_them():
    t = HostTier(4)
    t.store(10)
    t.store(11)
    t.begin_step()
    assert t.take(5) is None and t.num_used_blocks == 2  # all or nothing
    assert t.take(3) == [2, 3, 0]  # free ones first, then the least recently used prefix
    assert t.lookup([10]) == [] and t.lookup([11]) == [1]
    assert t.num_available() == 1
    t.release([2, 3, 0], in_flight=True)  # its swap-in runs this step: free after the step
    assert t.num_used_blocks == 4
    t.check_invariants()
    t.begin_step()
    assert t.num_used_blocks == 1
    t.check_invariants()


def test_reset_forgets_cached_blocks_but_not_owned_ones():
    t = HostTier(3)
    t.store(10)
    t.begin_step()
    owned = t.take(1)
    t.reset_prefix_cache()
    assert t.lookup([10]) == [] and t.num_used_blocks == 1
    t.release(owned, in_flight=False)
    assert t.num_used_blocks == 0
    t.check_invariants()


def test_zero_blocks_is_refused():
    with pytest.raises(ValueError):
        HostTier(0)


# -- scheduler + host tier --------------------------------------------------------------------

def tier_harness(num_blocks, host_blocks, **kw):
    h = Harness(num_blocks=num_blocks, block_size=4, **kw)
    h.tier = HostTier(host_blocks)
    h.sched.host = h.tier
    h.alloc.evicted = []
    return h


def test_evicted_prefix_blocks_go_to_the_host_and_come_back_on_a_hit():
    h = tier_harness(num_blocks=4, host_blocks=8)
    a_prompt = list(range(1, 10))            # 9 tokens: 2 full blocks + 1
    h.add("a", a_prompt, max_tokens=1)
    out, _ = h.step()
    assert out.requests[0].block_ids == [0, 1, 2] and not out.has_swaps
    # a's blocks are freed tail first: free list 3, 2, 1, 0; blocks 0 and 1 hold its prefix.
    h.add("b", list(range(50, 63)), max_tokens=1)  # 13 tokens, 4 blocks: evicts 1 then 0
    out, _ = h.step()
    assert out.requests[0].block_ids == [3, 2, 1, 0]
    assert out.swap_out == [(1, 0), (0, 1)] and out.swap_in == []
    # a's prompt again: not on the device any more, both full blocks on the host (1, 0)
    h.add("c", a_prompt, max_tokens=1)
    h.add("d", a_prompt + [5, 5], max_tokens=1)  # shares the blocks c is loading
    out = h.schedule()
    assert out.requests == []  # both compute from the next step, once the copies landed
    assert out.swap_out == [(1, 2), (2, 3), (3, 4)]  # b's cached blocks, evicted in turn
    assert out.swap_in == [(1, 0), (0, 1)]    # once: d shares c's blocks on the device
    c, d = h.sched.requests["c"], h.sched.requests["d"]
    assert c.block_ids == [0, 1, 2] and d.block_ids == [0, 1, 3]
    assert (c.num_cached_tokens, c.num_cached_tokens_host) == (0, 8)
    assert (d.num_cached_tokens, d.num_cached_tokens_host) == (8, 0)
    h.update(out, {})
    out = h.schedule()
    s, t = out.requests
    assert (s.request_id, s.start_position, s.token_ids) == ("c", 8, [9])
    assert (t.request_id, t.start_position, t.token_ids) == ("d", 8, [9, 5, 5])
    assert not out.has_swaps
    h.update(out, {"c": 7, "d": 7})
    assert h.sched.prefix_cache_hit_tokens_host == 8 and h.tier.num_hit_blocks == 2
    h.tier.check_invariants()
    h.assert_all_free()


def test_preempted_request_is_swapped_out_and_resumed_without_recompute():
    h = tier_harness(num_blocks=4, host_blocks=8, enable_prefix_caching=False)
    h.add("a", [1, 2, 3, 4, 5, 6], max_tokens=8, ignore_eos=True)
    h.add("b", [9, 8, 7, 6, 5, 4], max_tokens=8, ignore_eos=True)
    h.step()  # both prefilled: a [0, 1], b [2, 3]
    h.step()  # 7 tokens each, all fit
    h.step()  # 8 tokens each
    out = h.schedule()  # a needs a third block: b (the tail) goes to the host
    assert out.preempted_ids == ["b"]
    assert out.swap_out == [(2, 0), (3, 1)]
    b = h.sched.requests["b"]
    assert b.host_block_ids == [0, 1] and b.num_computed_tokens == 8 and b.block_ids == []
    assert h.sched.num_swapped_out == 1
    h.update(out, {"a": 7})
    for _ in range(20):  # a runs alone to the end, then b comes back
        out, _ = h.step()
        if out.swap_in:
            break
    assert "a" not in h.sched.requests
    assert out.requests == []
    assert out.swap_in == list(zip([0, 1], h.sched.requests["b"].block_ids[:2]))
    out, _ = h.step()
    (s,) = out.requests
    assert s.start_position == 8 and s.token_ids == [7]  # only the pending token is computed
    h.tier.check_invariants()
    while h.sched.has_unfinished():
        h.step()
    h.tier.begin_step()
    assert h.tier.num_used_blocks == 0
    h.assert_all_free()


def test_preemption_recomputes_when_the_host_has_no_room():
    h = tier_harness(num_blocks=4, host_blocks=1, enable_prefix_caching=False)
    h.add("a", [1, 2, 3, 4, 5, 6], max_tokens=8, ignore_eos=True)
    h.add("b", [9, 8, 7, 6, 5, 4], max_tokens=8, ignore_eos=True)
    for _ in range(3):
        h.step()
    out = h.schedule()
    assert out.preempted_ids == ["b"] and out.swap_out == []
    b = h.sched.requests["b"]
    assert b.host_block_ids is None and b.num_computed_tokens == 0
    assert b.status is RequestStatus.PREEMPTED


def test_aborting_a_swapped_out_request_frees_its_host_blocks():
    h = tier_harness(num_blocks=4, host_blocks=8, enable_prefix_caching=False)
    h.add("a", [1, 2, 3, 4, 5, 6], max_tokens=8, ignore_eos=True)
    h.add("b", [9, 8, 7, 6, 5, 4], max_tokens=8, ignore_eos=True)
    for _ in range(3):
        h.step()
    out = h.schedule()
    assert out.preempted_ids == ["b"]
    h.sched.abort("b")
    assert h.tier.num_used_blocks == 0 and not h.tier.owned
    h.tier.check_invariants()
