"""Swap-ins that land late: the real `Scheduler` + `HostTier` + `LoadTracker`, with a readiness
source that reports a load done only when the test lets it land (on the GPU: a CUDA event still
running). A loading request is not computed; the others run; nothing a load writes or reads is
reused while it is in flight; nothing hangs."""

import random

import pytest

from infer_cluster.worker.block_allocator import hash_full_blocks
from infer_cluster.worker.host_tier import HostTier
from infer_cluster.worker.kv_loads import LoadTracker

from .scheduler_harness import Harness

P = list(range(1, 10))  # 9 tokens: 2 full blocks of 4 + 1
P_HASHES = hash_full_blocks(P, 4)


class Delayed:
    """Loads land only when `land` says so; `wait` (blocking) lands the one asked for."""

    def __init__(self):
        self.landed: set[int] = set()
        self.polls = 0
        self.waited: list[int] = []

    def done(self, ids):
        self.polls += 1
        return [i for i in ids if i in self.landed]

    def wait(self, load_id):
        self.waited.append(load_id)
        self.landed.add(load_id)

    def land(self, *ids):
        self.landed.update(ids)


def delayed_harness(num_blocks, host_blocks, **kw):
    h = Harness(num_blocks=num_blocks, block_size=4, **kw)
    h.delayed = Delayed()
    h.tier = HostTier(host_blocks)
    h.sched.host = h.tier
    h.sched.loads = LoadTracker(h.delayed.done, h.delayed.wait)
    h.alloc.evicted = []
    return h


def put_p_on_host(h):
    """Run P, then a request as large as the pool, which evicts P's two cached blocks to the
    host (and leaves its own full blocks cached on the device)."""
    h.add("a", P, max_tokens=1)
    h.step()
    h.add("b", list(range(500, 500 + 4 * h.alloc.num_blocks - 1)), max_tokens=1)
    out, _ = h.step()
    assert len(out.swap_out) == 2
    assert len(h.tier.lookup(P_HASHES)) == 2 and h.alloc.lookup_prefix(P_HASHES) == []


def ids(out):
    return [s.request_id for s in out.requests]


def test_a_loading_request_waits_while_the_others_run():
    h = delayed_harness(num_blocks=6, host_blocks=8)
    put_p_on_host(h)
    h.add("r", [90, 91, 92], max_tokens=6, ignore_eos=True)
    h.add("c", P, max_tokens=2, ignore_eos=True)
    out = h.schedule()
    assert ids(out) == ["r"] and len(out.swap_in) == 2 and out.load_id is not None
    load = out.load_id
    h.update(out, {"r": 7})
    for _ in range(3):  # not landed: r decodes, c waits, nothing blocks
        out, _ = h.step()
        assert ids(out) == ["r"] and not out.swap_in
    assert h.delayed.waited == [] and h.delayed.polls >= 3
    h.delayed.land(load)
    out = h.schedule()
    c = next(s for s in out.requests if s.request_id == "c")
    assert (c.start_position, c.token_ids) == (8, [9])
    assert h.sched.loads.in_flight == []


def test_a_prefix_hit_on_blocks_still_loading_waits_for_that_load():
    h = delayed_harness(num_blocks=8, host_blocks=8)
    put_p_on_host(h)
    h.add("c", P, max_tokens=2, ignore_eos=True)
    out = h.schedule()
    load = out.load_id
    loaded = h.sched.requests["c"].block_ids[:2]
    h.update(out, {})
    h.add("d", P + [5, 5], max_tokens=2, ignore_eos=True)
    out = h.schedule()  # d shares c's loading blocks on the device: no copy, but it waits
    d = h.sched.requests["d"]
    assert d.block_ids[:2] == loaded and d.num_cached_tokens == 8
    assert ids(out) == [] and not out.swap_in and h.sched.loads.is_waiting("d")
    h.update(out, {})
    h.delayed.land(load)
    out = h.schedule()
    assert sorted(ids(out)) == ["c", "d"]


def test_aborted_loading_request_keeps_its_blocks_until_the_load_lands():
    h = delayed_harness(num_blocks=6, host_blocks=8)
    put_p_on_host(h)
    h.add("c", P, max_tokens=2, ignore_eos=True)
    out = h.schedule()
    load = out.load_id
    loaded = h.sched.requests["c"].block_ids[:2]
    h.update(out, {})
    h.sched.abort("c")
    assert [h.alloc.ref_count[b] for b in loaded] == [1, 1]  # the load's own reference
    h.add("e", list(range(200, 215)), max_tokens=1)  # 15 tokens: the 4 other blocks
    out = h.schedule()
    assert ids(out) == ["e"] and not set(loaded) & set(out.requests[0].block_ids)
    h.update(out, {"e": 7})
    assert h.delayed.waited == []
    h.add("f", list(range(250, 273)), max_tokens=1)  # the whole pool: 2 blocks still held
    out = h.schedule()  # nothing else can run: it blocks on that load, then f gets them
    assert h.delayed.waited == [load] and ids(out) == ["f"]
    assert set(loaded) <= set(out.requests[0].block_ids)
    h.update(out, {"f": 7})
    h.alloc.check_invariants()
    h.tier.check_invariants()
    h.assert_all_free()


def test_a_loading_request_that_is_preempted_recomputes_and_its_blocks_stay_held():
    h = delayed_harness(num_blocks=6, host_blocks=8)
    put_p_on_host(h)
    h.add("r", [90, 91, 92], max_tokens=8, ignore_eos=True)   # 1 block, a 2nd at 5 tokens
    h.add("s", [80, 81, 82, 83, 84], max_tokens=3, ignore_eos=True)  # 2 blocks throughout
    h.add("c", P, max_tokens=2, ignore_eos=True)              # 2 loaded blocks + 1
    out = h.schedule()
    load = out.load_id
    c = h.sched.requests["c"]
    loaded = c.block_ids[:2]
    h.update(out, {"r": 7, "s": 7})
    out, _ = h.step()
    assert ids(out) == ["r", "s"]
    out = h.schedule()  # r needs a second block: c (the tail) goes, still loading
    assert out.preempted_ids == ["c"]
    assert not any(d in loaded for d, _ in out.swap_out)  # never copied out mid-load
    assert c.host_block_ids is None and c.num_computed_tokens == 0 and c.block_ids == []
    assert [h.alloc.ref_count[b] for b in loaded] == [1, 1]
    h.update(out, {s.request_id: 7 for s in out.requests if s.needs_sample})
    h.delayed.land(load)
    h.step()
    assert h.alloc.lookup_prefix(P_HASHES) == loaded  # landed: P's prefix, cached on the device
    while h.sched.has_unfinished():
        h.step()
    h.tier.check_invariants()
    h.assert_all_free()


def test_host_blocks_read_by_a_load_in_flight_are_not_evicted():
    h = delayed_harness(num_blocks=6, host_blocks=2)  # the host holds exactly P's 2 blocks
    put_p_on_host(h)
    h.add("c", P, max_tokens=3, ignore_eos=True)
    out = h.schedule()
    load = out.load_id
    h.update(out, {})
    for _ in range(2):  # steps go by; the load is still reading both host blocks
        h.add(f"x{_}", list(range(300 + 20 * _, 305 + 20 * _)), max_tokens=1)
        out, _ = h.step()
        assert out.swap_out == []  # b's cached blocks are evicted, but no host block is free
        assert len(h.tier.lookup(P_HASHES)) == 2
    assert h.tier.num_available() == 0
    h.delayed.land(load)
    h.step()
    assert h.tier.num_available() == 2 and not h.tier.pinned  # landed: evictable again
    h.tier.check_invariants()


def test_resumed_request_frees_its_host_blocks_only_when_its_load_lands():
    h = delayed_harness(num_blocks=4, host_blocks=8, enable_prefix_caching=False)
    h.add("a", [1, 2, 3, 4, 5, 6], max_tokens=8, ignore_eos=True)
    h.add("b", [9, 8, 7, 6, 5, 4], max_tokens=8, ignore_eos=True)
    for _ in range(3):
        h.step()
    out, _ = h.step()
    assert out.preempted_ids == ["b"]
    b = h.sched.requests["b"]
    host_blocks = list(b.host_block_ids)
    while out.swap_in == []:
        out, _ = h.step()
    assert h.tier.releasing == set(host_blocks) and not (h.tier.owned & set(host_blocks))
    assert h.tier.num_available() == 8 - len(host_blocks)
    h.delayed.land(out.load_id)
    out, _ = h.step()
    assert ids(out) == ["b"] and not h.tier.releasing and h.tier.num_used_blocks == 0


def test_with_nothing_else_to_run_schedule_blocks_on_the_oldest_load():
    h = delayed_harness(num_blocks=8, host_blocks=8)
    put_p_on_host(h)
    h.add("c", P, max_tokens=2, ignore_eos=True)
    out = h.schedule()
    assert ids(out) == [] and out.swap_in  # the step issues the copy; no forward
    h.update(out, {})
    polls = h.delayed.polls
    out2 = h.schedule()  # only c, still loading: block on its load (never spin)
    assert h.delayed.waited == [out.load_id] and h.sched.loads.num_waits == 1
    assert ids(out2) == ["c"]
    assert h.delayed.polls - polls <= 3


def test_wait_all_loads_lands_everything():
    h = delayed_harness(num_blocks=8, host_blocks=8)
    put_p_on_host(h)
    h.add("c", P, max_tokens=2, ignore_eos=True)
    out = h.schedule()
    h.update(out, {})
    h.sched.wait_all_loads()
    assert h.delayed.waited == [out.load_id] and h.sched.loads.in_flight == []
    assert not h.sched.loads.is_waiting("c")
    assert not set(h.tier.lookup(P_HASHES)) & set(h.tier.pinned)  # the load's pins are gone


@pytest.mark.parametrize("seed", range(4))
def test_random_traffic_never_touches_blocks_in_flight(seed):
    """Random prompts over a few shared prefixes, aborts, preemptions and loads that land at
    random: no scheduled request, swap-out or new allocation uses a device block a load in
    flight writes, no swap-out writes a host block a load reads, and all ends freed."""
    rng = random.Random(seed)
    h = delayed_harness(num_blocks=12, host_blocks=12, max_num_seqs=4, max_num_batched_tokens=24)
    tracker = h.sched.loads
    prefixes = [[10 * p + t for t in range(1, 9)] for p in range(1, 6)]
    n = 0
    for _ in range(300):
        if rng.random() < 0.4 and n < 60:
            prompt = rng.choice(prefixes) + [rng.randrange(100, 200) for _ in range(rng.randrange(1, 6))]
            h.add(f"q{n}", prompt, max_tokens=rng.randrange(1, 14), ignore_eos=True)
            n += 1
        if rng.random() < 0.05 and h.sched.requests:
            h.sched.abort(rng.choice(sorted(h.sched.requests)))
        in_flight = set(tracker.in_flight)
        busy_device = set(tracker.block_load)
        busy_host = {b for i in in_flight for b in tracker._loads[i].host_pins + tracker._loads[i].host_release}
        out = h.schedule()
        landed_meanwhile = in_flight - set(tracker.in_flight)  # blocking waits land loads
        still = {b for b in busy_device if tracker.block_load.get(b) is not None}
        for s in out.requests:
            assert not still & set(s.block_ids), (s, still)
        assert not {d for d, _ in out.swap_out} & still
        if not landed_meanwhile:
            assert not {hb for _, hb in out.swap_out} & busy_host
        h.update(out, {s.request_id: 7 for s in out.requests if s.needs_sample})
        h.tier.check_invariants()
        for i in list(tracker.in_flight):
            if rng.random() < 0.3:
                h.delayed.land(i)
    for i in tracker.in_flight:
        h.delayed.land(i)
    while h.sched.has_unfinished():
        h.step()
    h.sched.wait_all_loads()
    h.tier.begin_step()
    h.tier.check_invariants()
    assert not h.tier.pinned and not h.tier.releasing
    h.assert_all_free()
    # the traffic did what it is for: prefix hits, swap-outs and their resumes, preemptions
    assert h.tier.num_hit_blocks and h.sched.num_swapped_out and h.tier.num_swapped_in_blocks
    assert h.sched.num_preemptions > h.sched.num_swapped_out  # and some victims recomputed
