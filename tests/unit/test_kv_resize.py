"""The bookkeeping half of a KV resize (worker/kv/resize.py), with exact block ids: who keeps
their KV, where their blocks go, and which targets are refused."""

from __future__ import annotations

import pytest

from infer_cluster.protocol import InvalidRequestError, SamplingParams
from infer_cluster.worker.sched.block_allocator import BlockAllocator
from infer_cluster.worker.kv.resize import adopt_survivors, check_target, plan_resize
from infer_cluster.worker.sched.request import Request


def _req(rid, blocks, seq):
    r = Request(rid, [1, 2, 3], SamplingParams(max_tokens=4), seq)
    r.block_ids = list(blocks)
    r.num_registered_blocks = len(blocks)
    return r


def test_head_of_running_keeps_its_kv_and_the_rest_are_victims():
    a, b, c = _req("a", [7, 3], 0), _req("b", [7, 9, 12], 1), _req("c", [5], 2)  # 7 is shared
    plan = plan_resize([a, b, c], num_blocks=4, kv_cache_dtype="auto", keep_kv=True)
    assert plan.block_map == {7: 0, 3: 1, 9: 2, 12: 3}
    assert plan.survivors == [a, b] and plan.victims == [c]
    alloc = BlockAllocator(4, 16)
    adopt_survivors(plan, alloc)
    assert a.block_ids == [0, 1] and b.block_ids == [0, 2, 3]
    assert alloc.ref_count == [2, 1, 1, 1] and alloc.num_free_blocks == 0
    assert a.num_registered_blocks == 0 and b.num_registered_blocks == 0  # prefix cache dropped
    alloc.check_invariants()
    alloc.free(a.block_ids)
    alloc.free(b.block_ids)
    assert alloc.num_free_blocks == 4


def test_a_request_that_does_not_fit_takes_everything_after_it_along():
    a, b, c = _req("a", [1, 2, 3], 0), _req("b", [4, 5, 6], 1), _req("c", [8], 2)
    plan = plan_resize([a, b, c], num_blocks=5, kv_cache_dtype="auto", keep_kv=True)
    assert plan.survivors == [a] and plan.victims == [b, c]  # c would fit, but b goes first
    assert plan.block_map == {1: 0, 2: 1, 3: 2}


def test_without_keep_kv_everyone_recomputes():
    a = _req("a", [1], 0)
    plan = plan_resize([a], num_blocks=100, kv_cache_dtype="int8", keep_kv=False)
    assert plan.survivors == [] and plan.victims == [a] and plan.block_map == {}


@pytest.mark.parametrize("blocks, dtype, match", [
    (None, None, "needs num_kv_blocks, kv_cache_dtype or both"),
    (7, None, "too small: one request of max_model_len 100 tokens needs 7"[:20]),
    (6, None, "needs 7 blocks of 16 tokens"),
    (64, "fp8", "kv_cache_dtype must be one of auto, int8"),
    (2.5, None, "must be an integer"),
    (None, "int8", "needs 7 blocks"),  # same bytes in int8 would be too few here
])
def test_bad_targets_are_refused_with_a_reason(blocks, dtype, match):
    if blocks == 7:  # the smallest pool that fits one max-length request is fine
        assert check_target(7, None, "auto", 100, 16, lambda d: 1) == (7, "auto")
        return
    with pytest.raises(InvalidRequestError, match=match):
        check_target(blocks, dtype, "auto", 100, 16, lambda d: 3)


def test_dtype_only_sizes_from_the_same_bytes():
    assert check_target(None, "int8", "auto", 100, 16, lambda d: {"int8": 40}[d]) == (40, "int8")
