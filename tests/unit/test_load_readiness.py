"""Host-tier loads that land steps later: the scheduler keeps a loading request (and requests
sharing its blocks) out of the forward until its load landed, keeps running the others, keeps
the load's device blocks and host blocks until it landed, and blocks only when nothing else can
run. Landing is driven here by a `Loads` stand-in for the runner's CUDA events (the injection
point the engine fills from `ModelRunner.loads_landed` / `wait_load`)."""

import random

from infer_cluster.worker.sched.host_tier import HostTier

from .scheduler_harness import Harness


class Loads:
    """Which loads finished: the test decides (`finish`); `wait` finishes the one waited for."""

    def __init__(self):
        self.finished: set[int] = set()
        self.waited: list[int] = []

    def landed(self, ids):
        return [i for i in ids if i in self.finished]

    def wait(self, load_id):
        self.waited.append(load_id)
        self.finished.add(load_id)


def tier_harness(num_blocks, host_blocks, **kw):
    h = Harness(num_blocks=num_blocks, block_size=4, **kw)
    h.tier = HostTier(host_blocks)
    h.sched.host = h.tier
    h.alloc.evicted = []
    h.loads = Loads()
    h.sched.loads_landed = h.loads.landed
    h.sched.wait_load = h.loads.wait
    return h


A = list(range(1, 10))  # 9 tokens: 2 full blocks + 1


def evict_a_to_host(h):
    """Run `a` (prompt A) to the end, then `b`, whose blocks evict A's prefix to the host."""
    h.add("a", A, max_tokens=1)
    h.step()
    h.add("b", list(range(50, 50 + 4 * h.alloc.num_blocks - 2)), max_tokens=1)  # every block
    out, _ = h.step()
    assert len(out.swap_out) == 2 and h.tier.num_cached_blocks == 2


def test_a_loading_request_waits_while_others_run_then_computes():
    h = tier_harness(num_blocks=8, host_blocks=8)
    evict_a_to_host(h)
    h.add("long", [70, 71, 72], max_tokens=20, ignore_eos=True)
    h.step()  # long prefilled
    h.add("c", A, max_tokens=2, ignore_eos=True)
    out = h.schedule()
    (load, n), = out.loads
    assert n == 2 and [s.request_id for s in out.requests] == ["long"]
    h.update(out, {"long": 7})
    for _ in range(3):  # the load has not landed: c stays out, long goes on
        out, _ = h.step()
        assert [s.request_id for s in out.requests] == ["long"] and not out.loads
    assert h.loads.waited == [] and h.tier._load_pins  # its host blocks stay pinned
    h.loads.finished.add(load)
    out = h.schedule()
    assert {s.request_id: (s.start_position, s.token_ids) for s in out.requests}["c"] == (8, [9])
    assert not h.tier._load_pins
    h.update(out, {"long": 7, "c": 7})
    h.tier.check_invariants()


def test_a_request_sharing_blocks_in_flight_waits_for_the_same_load():
    h = tier_harness(num_blocks=8, host_blocks=8)
    evict_a_to_host(h)
    h.add("c", A, max_tokens=1)
    out = h.schedule()
    (load, _), = out.loads
    h.update(out, {})
    h.add("d", A + [5, 5], max_tokens=1)  # hits c's blocks on the device while they load
    out = h.schedule()  # d is admitted (its admission may evict, so this step has copies)
    assert out.requests == [] and not out.loads
    assert h.sched.loads.waits == {"c": {load}, "d": {load}} and h.loads.waited == []
    h.update(out, {})
    out = h.schedule()  # nothing else to run: blocks on the load, then both compute
    assert h.loads.waited == [load] and h.sched.num_load_waits == 1
    assert sorted(s.request_id for s in out.requests) == ["c", "d"]
    h.update(out, {"c": 7, "d": 7})
    h.tier.check_invariants()
    h.assert_all_free()


def test_an_aborted_loading_request_keeps_its_blocks_until_the_load_landed():
    h = tier_harness(num_blocks=8, host_blocks=8)
    evict_a_to_host(h)
    h.add("c", A, max_tokens=1)
    out = h.schedule()
    (load, _), = out.loads
    blocks = list(h.sched.requests["c"].block_ids)
    h.update(out, {})
    h.sched.abort("c")
    assert all(h.alloc.ref_count[b] == 1 for b in blocks)  # the copy may still write them
    assert h.tier._load_pins
    h.loads.finished.add(load)
    h.add("e", [90, 91], max_tokens=1)
    out, _ = h.step()  # the landing frees them
    assert not h.tier._load_pins and all(h.alloc.ref_count[b] == 0 for b in blocks)
    while h.sched.has_unfinished():
        h.step()
    h.assert_all_free()


def test_preempting_a_loading_request_waits_for_its_load_first():
    h = tier_harness(num_blocks=4, host_blocks=16, enable_prefix_caching=False)
    h.add("a", [1, 2, 3, 4, 5, 6], max_tokens=8, ignore_eos=True)
    h.add("b", [9, 8, 7, 6, 5, 4], max_tokens=8, ignore_eos=True)
    for _ in range(3):
        h.step()
    out = h.schedule()
    assert out.preempted_ids == ["b"] and out.swap_out  # b's KV goes to the host
    h.update(out, {"a": 7})
    for _ in range(12):  # a runs until its end frees room, then b's load is issued
        out, _ = h.step()
        if out.loads:
            break
    (load, _), = out.loads
    assert "b" in h.sched.loads.waits
    h.sched._preempt(h.sched.requests["b"], out)  # as a resize or a preemption would
    assert h.loads.waited == [load] and "b" not in h.sched.loads.waits
    h.tier.check_invariants()


def test_random_traffic_with_late_loads_ends_every_request_and_frees_everything():
    rng = random.Random(3)
    h = tier_harness(num_blocks=24, host_blocks=64, max_num_seqs=6, max_num_batched_tokens=24)
    prefixes = [[p * 100 + i for i in range(12)] for p in range(6)]
    n = 0
    for step in range(400):
        if n < 60 and rng.random() < 0.5:
            prompt = prefixes[rng.randrange(6)] + [rng.randrange(1, 50) for _ in range(rng.randrange(1, 6))]
            h.add(f"r{n}", prompt, max_tokens=rng.randrange(1, 6), ignore_eos=True)
            n += 1
        in_flight = list(h.sched.loads.members)
        h.loads.finished.update(l for l in in_flight if rng.random() < 0.3)
        if rng.random() < 0.05 and h.sched.requests:
            h.sched.abort(rng.choice(sorted(h.sched.requests)))
        out = h.schedule()
        for s in out.requests:  # nothing computes on blocks a load still fills
            assert not any(h.sched.loads.blocks.get(b) is not None for b in s.block_ids)
        h.update(out, {s.request_id: 7 for s in out.requests if s.needs_sample})
        h.tier.check_invariants()
    while h.sched.has_unfinished():
        h.step()
    h.sched.land_all_loads()
    h.tier.begin_step()
    assert h.sched.prefix_cache_hit_tokens_host > 0 and h.tier.num_hit_blocks > 0
    assert not h.tier._load_pins
    h.assert_all_free()
