"""The scheduler's side of speculative decoding, with exact block ids: proposals as extra
positions of a decode row (budget, free blocks only, never a preemption), and
`update_verified`: accepted tokens appended under the stop rules, `num_computed_tokens` back to
the last accepted position, blocks holding only rejected positions returned, and no block with
a rejected token offered to the prefix cache."""

from infer_cluster.worker.sched.block_allocator import hash_full_blocks
from infer_cluster.worker.sched.output import ScheduledRequest

from tests.unit.scheduler_harness import Harness, prompt_of


class SpecHarness(Harness):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.sched.speculating = True

    def verify(self, out, sampled):
        result = self.sched.update_verified(out, sampled)
        self.alloc.check_invariants()
        return result

    def decoding(self, rid, prompt, first=50, **params):
        """A request whose prompt is computed and whose first token is sampled."""
        req = self.add(rid, prompt, **params)
        out = self.schedule()
        self.verify(out, {rid: [first]})
        assert req.num_computed_tokens == req.num_tokens - 1
        return req


def test_proposals_ride_as_extra_positions_and_rejected_blocks_go_back():
    h = SpecHarness(num_blocks=16, block_size=4)
    req = h.decoding("a", prompt_of(5), max_tokens=20)
    assert req.block_ids == [0, 1]
    req.spec_token_ids = [51, 52, 53, 54]
    out = h.schedule()
    # positions 5..9: the sampled token, then 4 proposals; block 2 for positions 8, 9
    assert out.requests == [ScheduledRequest("a", [50, 51, 52, 53, 54], 5, [0, 1, 2], True,
                                             num_spec_tokens=4)]
    assert out.num_batched_tokens == 5 and req.num_computed_tokens == 10
    advanced, finished = h.verify(out, {"a": [61]})  # the first proposal was rejected
    assert advanced == [req] and finished == []
    assert req.output_token_ids == [50, 61]
    assert req.num_computed_tokens == 6  # position 6 (token 61) is the next step's
    assert req.block_ids == [0, 1] and h.alloc.ref_count[2] == 0  # block 2 held only rejected ones

    req.spec_token_ids = [62, 63, 64]
    out = h.schedule()  # the LRU free list hands out block 3 before the freed block 2
    assert out.requests[0].block_ids == [0, 1, 3] and out.requests[0].num_spec_tokens == 3
    h.verify(out, {"a": [62, 63, 70]})  # two accepted, then a token of its own
    assert req.output_token_ids == [50, 61, 62, 63, 70]
    assert req.num_computed_tokens == 9 and req.block_ids == [0, 1, 3]
    # every full block is registered with the hash of its real tokens
    hashes = hash_full_blocks(req.all_token_ids, 4)
    assert [h.alloc.hash_of[b] for b in req.block_ids[:2]] == hashes[:2]
    assert h.alloc.hash_of[3] is None


def test_no_block_holding_a_rejected_token_is_hashed():
    h = SpecHarness(num_blocks=16, block_size=4)
    req = h.decoding("a", prompt_of(3), max_tokens=20)  # 4 tokens: block 0 is full once computed
    req.spec_token_ids = [51, 52, 53, 54, 55]  # positions 4..8: blocks 1 and 2 too
    out = h.schedule()
    assert out.requests[0].block_ids == [0, 1, 2]
    h.verify(out, {"a": [51, 52, 53, 60]})  # 3 accepted (positions 4..6), 60 at position 7
    # block 1 (positions 4..7) waits for 60's KV; block 2 held only the rejected 55
    assert req.num_computed_tokens == 7
    assert h.alloc.hash_of[0] == hash_full_blocks(req.all_token_ids, 4)[0]
    assert h.alloc.hash_of[1] is None  # not full of computed tokens yet (60's KV is next)
    assert req.block_ids == [0, 1] and h.alloc.ref_count[2] == 0
    out = h.schedule()
    h.verify(out, {"a": [71]})
    assert h.alloc.hash_of[1] == hash_full_blocks(req.all_token_ids, 4)[1]


def test_stop_token_and_max_tokens_inside_a_burst():
    h = SpecHarness(num_blocks=16, block_size=4)
    req = h.decoding("a", prompt_of(5), max_tokens=20, stop_token_ids=[52])
    req.spec_token_ids = [51, 52, 53]
    out = h.schedule()
    advanced, finished = h.verify(out, {"a": [51, 52, 53, 54]})
    assert req.output_token_ids == [50, 51, 52]  # what follows the stop token is dropped
    assert finished == [req] and req.finish_reason == "stop"
    b = h.decoding("b", prompt_of(5, start=300), max_tokens=3)
    b.spec_token_ids = [51, 52, 53]
    out = h.schedule()
    h.verify(out, {"b": [51, 52, 53, 54]})
    assert b.output_token_ids == [50, 51, 52] and b.finish_reason == "length"
    h.assert_all_free()


def test_min_tokens_keeps_a_stop_token_inside_a_burst():
    h = SpecHarness(num_blocks=16, block_size=4)
    req = h.decoding("a", prompt_of(5), max_tokens=20, stop_token_ids=[52], min_tokens=3)
    req.spec_token_ids = [52, 53]
    out = h.schedule()
    h.verify(out, {"a": [52, 52, 9]})  # the first 52 is the 2nd token (< min_tokens): no stop
    assert req.output_token_ids == [50, 52, 52] and req.finish_reason == "stop"


def test_budget_limits_proposals_after_every_plain_token():
    h = SpecHarness(num_blocks=16, block_size=4, max_num_batched_tokens=6)
    a = h.decoding("a", prompt_of(5), max_tokens=20)
    b = h.add("b", prompt_of(3, start=200), max_tokens=20)
    b_out = h.schedule()  # b's prefill (a decodes its token 50)
    h.verify(b_out, {"a": [60], "b": [70]})
    a.spec_token_ids, b.spec_token_ids = [61, 62, 63, 64], [71, 72]
    out = h.schedule()
    # 2 plain tokens first, then a's proposals take the 4 left; none for b
    assert [(s.request_id, len(s.token_ids), s.num_spec_tokens) for s in out.requests] == [
        ("a", 5, 4), ("b", 1, 0)]
    assert out.num_batched_tokens == 6


def test_proposals_use_only_free_blocks_and_never_preempt():
    h = SpecHarness(num_blocks=4, block_size=4)
    a = h.add("a", prompt_of(7), max_tokens=2)
    b = h.add("b", prompt_of(7, start=300), max_tokens=2)
    h.verify(h.schedule(), {"a": [50], "b": [50]})  # blocks 0, 1 and 2, 3: the pool is full
    assert h.alloc.num_free_blocks == 0
    a.spec_token_ids, b.spec_token_ids = [1, 2, 3], [4, 5]
    out = h.schedule()  # position 7 is in each last block; no block is free for proposals
    assert out.preempted_ids == []
    assert [(s.request_id, s.num_spec_tokens) for s in out.requests] == [("a", 0), ("b", 0)]
    h.verify(out, {"a": [9], "b": [9]})
    assert a.output_token_ids == b.output_token_ids == [50, 9] and h.sched.num_preemptions == 0
    h.assert_all_free()


def test_proposals_fill_the_last_free_block_only():
    h = SpecHarness(num_blocks=3, block_size=4)
    a = h.decoding("a", prompt_of(6), max_tokens=6)  # 7 tokens, blocks 0, 1; one block free
    a.spec_token_ids = [1, 2, 3, 4, 5, 6, 7]
    out = h.schedule()
    # positions 6..11 fit blocks 1 and 2: 5 proposals, not 7
    assert out.requests[0].num_spec_tokens == 5 and out.requests[0].block_ids == [0, 1, 2]


def test_prompt_chunks_and_admissions_get_no_proposals():
    h = SpecHarness(num_blocks=16, block_size=4, max_num_batched_tokens=4)
    req = h.add("a", prompt_of(9), max_tokens=4)
    req.spec_token_ids = [1, 2]  # stale: a prefill row never takes them
    out = h.schedule()
    assert out.requests[0].num_spec_tokens == 0 and len(out.requests[0].token_ids) == 4
    h.verify(out, {})
    assert req.num_computed_tokens == 4 and req.output_token_ids == []


def test_a_preempted_request_keeps_no_proposals():
    # a speculating step proposed for every running row; the schedule then preempted one. Its
    # proposals must not survive into a later step, which may verify nothing.
    h = SpecHarness(num_blocks=4, block_size=4)
    a = h.add("a", prompt_of(7), max_tokens=8)
    b = h.add("b", prompt_of(7, start=300), max_tokens=8)
    h.verify(h.schedule(), {"a": [50], "b": [50]})  # the pool is full: 2 blocks each
    h.verify(h.schedule(), {"a": [51], "b": [51]})  # position 7: the last block's last slot
    a.spec_token_ids, b.spec_token_ids = [1, 2], [3, 4]
    out = h.schedule()  # position 8 needs a block and none is free: one request gives way
    assert len(out.preempted_ids) == 1
    preempted = a if a.request_id in out.preempted_ids else b
    assert preempted.spec_token_ids == [] and preempted.num_preemptions == 1
