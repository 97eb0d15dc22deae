"""Scheduler stop rules, aborts, errors, the request lifecycle, and random workloads against a
simulated KV cache (outputs must equal a one-request-at-a-time reference).
"""

import random

import pytest
from hypothesis import given, settings, strategies as st

from infer_cluster.protocol import OutOfMemoryError, RequestStatus, SamplingParams
from infer_cluster.worker.sched.request import Request

from .scheduler_harness import EOS, Harness, prompt_of, summary


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

