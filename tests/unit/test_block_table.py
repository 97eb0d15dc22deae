"""`BlockTableMirror` gives exactly the stateless block table (`step_rows` without a mirror)
through any sequence of steps: requests growing in place, replaced lists (preemption,
re-admission, KV resize: a new `block_epoch`), request ids used again after their request
ended, requests skipped for some steps, more requests than rows and wider rows than columns
(the table grows), and rows reclaimed and reused. Only the blocks added since a row's last
step are written."""

import numpy as np
from hypothesis import given, settings, strategies as st

from infer_cluster.worker.kv.block_table import BlockTableMirror
from infer_cluster.worker.sched.request import Request
from infer_cluster.protocol import SamplingParams
from infer_cluster.worker.sched.output import SchedulerOutput, ScheduledRequest
from infer_cluster.worker.runner.step_rows import step_rows


def scheduled(rid, blocks, epoch):
    return ScheduledRequest(rid, [1], 0, list(blocks), True, False, epoch)


def stateless(reqs):
    return step_rows(SchedulerOutput(reqs, len(reqs)), 16).block_tables


# One action per step for each of a few request slots: grow by k blocks, replace the list
# (new epoch), end the request (its id comes back as a new request later), or sit the step out.
ACTION = st.tuples(st.sampled_from(["grow", "replace", "end", "skip"]), st.integers(0, 5))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(ACTION, min_size=6, max_size=6), min_size=1, max_size=25),
       st.integers(1, 4), st.integers(1, 3))
def test_mirror_equals_the_stateless_table(steps, rows, width):
    mirror = BlockTableMirror(rows=rows, width=width)
    live = {}  # rid -> [blocks, epoch]
    epochs = iter(range(1, 10**6))
    next_block = iter(range(1, 10**6))
    for step in steps:
        reqs = []
        for slot, (action, k) in enumerate(step):
            rid = f"r{slot}"
            if action == "end":
                live.pop(rid, None)
                continue
            state = live.setdefault(rid, [[next(next_block)], next(epochs)])
            if action == "grow":
                state[0].extend(next(next_block) for _ in range(k))
            elif action == "replace":  # a prefix may repeat ids (cached blocks), the rest is new
                state[0] = state[0][:k] + [next(next_block) for _ in range(k % 3 + 1)]
                state[1] = next(epochs)
            elif action == "skip":
                continue
            reqs.append(scheduled(rid, state[0], state[1]))
        if reqs:
            got = mirror.gather(reqs)
            want = stateless(reqs)
            assert got.dtype == want.dtype == np.int64
            np.testing.assert_array_equal(got, want)


def test_only_new_blocks_are_written():
    mirror = BlockTableMirror(rows=4, width=4)
    blocks = [7, 8, 9]
    mirror.gather([scheduled("a", blocks, 1)])
    mirror._table[mirror._row_of["a"], 0] = -1  # a marker the next gather must not overwrite
    blocks.append(10)
    got = mirror.gather([scheduled("a", blocks, 1)])
    assert got.tolist() == [[-1, 8, 9, 10]]
    assert mirror.gather([scheduled("a", [7, 8], 2)]).tolist() == [[7, 8]]  # new epoch: rewritten


def test_request_block_epoch_changes_on_every_new_list():
    a = Request("a", [1, 2], SamplingParams(), 0)
    b = Request("a", [1, 2], SamplingParams(), 0)  # the same id again, e.g. after "a" ended
    a.block_ids = [1]
    b.block_ids = [1]
    assert a.block_epoch != b.block_epoch
    before = a.block_epoch
    a.block_ids.extend([2, 3])  # growth in place keeps the epoch
    assert a.block_epoch == before
    a.block_ids = []
    assert a.block_epoch != before
