"""The scheduler with a step in flight (async scheduling): pending tokens, the rows that wait on
them, no preemption while a step is uncollected, and blocks of requests that end meanwhile kept
until that step is collected."""

from .scheduler_harness import EOS, Harness, prompt_of


def test_pending_token_is_scheduled_as_a_placeholder_decode_row():
    h = Harness(block_size=4)
    req = h.add("a", prompt_of(5), max_tokens=3)
    first = h.sched.schedule()  # the prefill; its token is pending from here on
    assert req.num_pending == 1 and req.num_computed_tokens == 5
    second = h.sched.schedule(can_preempt=False)
    (row,) = second.requests
    assert row.pending_input and row.needs_sample and row.start_position == 5 and len(row.token_ids) == 1
    assert req.num_pending == 2 and req.num_computed_tokens == 6
    h.update(first, {"a": 9})
    assert req.output_token_ids == [9] and req.num_pending == 1
    third = h.sched.schedule(can_preempt=False)  # step 2's token is the one pending now
    assert third.requests[0].pending_input and third.requests[0].start_position == 6
    h.update(second, {"a": 8})
    h.update(third, {"a": 7})
    assert req.is_finished and req.finish_reason == "length" and req.output_token_ids == [9, 8, 7]
    h.assert_all_free()
    # settled (synchronous): the row carries the known token
    req = h.add("b", prompt_of(5), max_tokens=3)
    h.update(h.sched.schedule(), {"b": 9})
    row = h.sched.schedule().requests[0]
    assert not row.pending_input and row.token_ids == [9] and req.num_pending == 1


def test_a_pending_last_token_is_not_scheduled_again():
    h = Harness()
    h.add("a", prompt_of(3), max_tokens=1)
    first = h.sched.schedule()
    assert h.sched.schedule(can_preempt=False).is_empty  # its one token is already drawn
    h.update(first, {"a": 5})
    h.assert_all_free()


def test_end_while_in_flight_frees_blocks_after_the_step_is_collected():
    h = Harness(block_size=4)
    req = h.add("a", prompt_of(6), max_tokens=10)
    first = h.sched.schedule()
    second = h.sched.schedule(can_preempt=False)
    h.update(first, {"a": EOS})  # ended at step 1; step 2 still computes it
    assert req.is_finished and req.finish_reason == "stop"
    assert h.alloc.num_free_blocks < h.alloc.num_blocks
    advanced, _ = h.update(second, {"a": 3})  # its step-2 token is dropped
    assert advanced == [] and req.output_token_ids == [EOS]
    h.assert_all_free()


def test_no_preemption_while_a_step_is_in_flight():
    h = Harness(num_blocks=4, block_size=4, max_num_batched_tokens=64)
    a = h.add("a", prompt_of(4), max_tokens=8, ignore_eos=True)
    b = h.add("b", prompt_of(8, 300), max_tokens=8, ignore_eos=True)
    first = h.sched.schedule()  # a: 1 block, b: 2 blocks; one left
    blocked = h.sched.schedule(can_preempt=False)  # a needs a 2nd block (ok), then b a 3rd: none left
    assert [s.request_id for s in blocked.requests] == ["a"] and blocked.blocked
    assert not blocked.preempted_ids and b.block_ids
    h.update(first, {"a": 1, "b": 1})
    h.update(blocked, {"a": 2})
    settled = h.sched.schedule()  # settled: the tail is preempted as usual
    assert settled.preempted_ids == ["b"] and a.num_computed_tokens == 6
    h.update(settled, {"a": 3})


def test_rewind_drops_one_token_and_recomputes_its_position():
    # Step 1 drew 9 provisionally (the sampler's redo made it 4); step 2 already computed
    # position 3 from the 9: its token is dropped and position 3 is computed again from the 4.
    h = Harness(block_size=4)
    req = h.add("a", prompt_of(3), max_tokens=3)
    first = h.sched.schedule()
    second = h.sched.schedule(can_preempt=False)
    assert second.requests[0].pending_input and second.requests[0].start_position == 3
    h.update(first, {"a": 4})
    h.sched.rewind("a")
    advanced, _ = h.update(second, {"a": 8})  # computed from the wrong input: dropped
    assert advanced == [] and req.output_token_ids == [4]
    assert req.num_pending == 0 and req.num_computed_tokens == 3
    third = h.sched.schedule()
    (row,) = third.requests
    assert (row.start_position, row.token_ids, row.pending_input, row.needs_sample) == (3, [4], False, True)
    h.update(third, {"a": 5})
    h.update(h.sched.schedule(), {"a": 6})
    assert req.is_finished and req.finish_reason == "length" and req.output_token_ids == [4, 5, 6]
    h.assert_all_free()


def test_rewind_registers_no_block_computed_from_the_wrong_input():
    # The dropped position completes a block: that block must not enter the prefix cache.
    h = Harness(block_size=4)
    req = h.add("a", prompt_of(3), max_tokens=4)
    first = h.sched.schedule()
    second = h.sched.schedule(can_preempt=False)  # position 3: fills block 0
    h.update(first, {"a": 4})
    h.sched.rewind("a")
    h.update(second, {"a": 8})
    assert req.num_registered_blocks == 0
    third = h.sched.schedule()  # position 3 again, from the right token
    h.update(third, {"a": 5})
    assert req.num_registered_blocks == 1 and req.output_token_ids == [4, 5]
    other = h.add("b", prompt_of(3) + [4, 1], max_tokens=1)
    out = h.schedule()
    assert other.num_cached_tokens == 4  # the block of [prompt, 4] is cached and shared
    h.update(out, {"b": 1, "a": 2})
    while h.sched.has_unfinished():
        h.step()
    h.assert_all_free()


def test_rewind_of_a_request_that_ended_meanwhile_is_forgotten():
    h = Harness(block_size=4)
    req = h.add("a", prompt_of(3), max_tokens=5)
    first = h.sched.schedule()
    second = h.sched.schedule(can_preempt=False)
    h.update(first, {"a": EOS})  # the redone id ended it
    h.sched.rewind("a")  # nothing to rewind: it is gone
    advanced, _ = h.update(second, {"a": 3})
    assert advanced == [] and req.output_token_ids == [EOS] and not h.sched._rewind
    h.assert_all_free()
