"""The scheduler's pipeline micro-batches (`schedule(group=n)`) and their sizes
(`worker/sched/microbatch.py`): at most n sequences per group, no request in two uncollected groups,
no pending-input rows, no preemption while a group is in flight, and every block back at the end."""

from infer_cluster.worker.sched.microbatch import group_size

from .scheduler_harness import Harness, prompt_of


def ids(out):
    return [s.request_id for s in out.requests]


def test_groups_are_disjoint_and_capped():
    h = Harness(num_blocks=64, block_size=4, max_num_seqs=8)
    for i in range(5):
        h.add(f"r{i}", prompt_of(3 + i, start=10 * i), max_tokens=4)
    a = h.sched.schedule(group=3)
    assert ids(a) == ["r0", "r1", "r2"]
    b = h.sched.schedule(can_preempt=False, group=3)
    assert ids(b) == ["r3", "r4"]  # a's requests are in flight: skipped, not pending rows
    assert h.sched.schedule(can_preempt=False, group=3).is_empty  # everyone is in flight
    h.update(a, {rid: 7 for rid in ids(a)})
    a2 = h.sched.schedule(can_preempt=False, group=3)
    assert ids(a2) == ["r0", "r1", "r2"]
    assert all(not s.pending_input and s.token_ids == [7] for s in a2.requests)
    h.update(b, {rid: 7 for rid in ids(b)})
    b2 = h.sched.schedule(can_preempt=False, group=3)
    assert ids(b2) == ["r3", "r4"]
    for out in (a2, b2):
        h.update(out, {rid: 8 for rid in ids(out)})
    while h.sched.has_unfinished():
        h.step()
    h.assert_all_free()


def test_group_that_ends_or_aborts_while_the_other_is_in_flight():
    h = Harness(num_blocks=64, block_size=4, max_num_seqs=8)
    h.add("short", prompt_of(4), max_tokens=1)
    h.add("long", prompt_of(6, start=50), max_tokens=5)
    h.add("gone", prompt_of(5, start=80), max_tokens=5)
    a = h.sched.schedule(group=1)
    b = h.sched.schedule(can_preempt=False, group=2)
    assert ids(a) == ["short"] and ids(b) == ["long", "gone"]
    h.sched.abort("gone")  # its step is in flight: its blocks wait for that step's update
    advanced, finished = h.update(a, {"short": 7})
    assert [r.request_id for r in finished] == ["short"]
    assert not h.sched.schedule(can_preempt=False, group=1).requests  # "long" is still in flight
    h.update(b, {"long": 7, "gone": 7})
    while h.sched.has_unfinished():
        h.step()
    h.assert_all_free()


def test_blocked_group_does_not_preempt_while_another_is_in_flight():
    h = Harness(num_blocks=3, block_size=4, max_num_seqs=4, max_num_batched_tokens=64)
    h.add("a", prompt_of(4), max_tokens=8)
    h.add("b", prompt_of(4, start=40), max_tokens=8)
    first = h.sched.schedule(group=1)
    second = h.sched.schedule(can_preempt=False, group=1)
    assert ids(first) == ["a"] and ids(second) == ["b"]
    h.update(first, {"a": 7})
    third = h.sched.schedule(can_preempt=False, group=1)  # takes the last free block
    assert ids(third) == ["a"]
    h.update(second, {"b": 7})
    fourth = h.sched.schedule(can_preempt=False, group=1)  # "b" needs a block; "a" is in flight
    assert fourth.blocked and fourth.is_empty and not fourth.preempted_ids
    h.update(third, {"a": 7})
    fifth = h.sched.schedule(group=2)  # settled: now the tail may be preempted
    assert ids(fifth) == ["a"] and fifth.preempted_ids == ["b"]
    h.update(fifth, {"a": 7})
    while h.sched.has_unfinished():
        h.step()
    h.assert_all_free()


def test_group_size_spreads_the_batch_over_the_depth():
    assert group_size(0, 6, 256, 2) == 3
    assert group_size(7, 0, 256, 2) == 4
    assert group_size(3, 100, 8, 2) == 4  # only 5 more may be admitted
    assert group_size(1, 0, 256, 4) == 1
    assert group_size(0, 0, 256, 2) == 1
