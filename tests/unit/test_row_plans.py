"""`RowPlans` (worker/sampling/row_plans.py): the sampler's per-request rows are those the parameters
give, are refilled when the request's params object or the vocabulary changes, and their slots
are reused after `release`; rows without a request id live for one call only."""

import numpy as np

from infer_cluster.protocol import SamplingParams
from infer_cluster.worker.sampling import ops as sampling_ops
from infer_cluster.worker.sampling.row_plans import (FLAGS, LOGPROBS, MIN_P, MIN_TOKENS, NEED, PENALTIES, RANDOM,
                                            TEMPERATURE, TOP_K, TOP_P, RowPlans, rows_with)
from infer_cluster.worker.sampling.draw_io import SamplingRequestState


def row(params, rid, eos=(2,)):
    return SamplingRequestState(params, [1, 2], [], None, eos, rid)


KINDS = [SamplingParams(temperature=0.0),
         SamplingParams(temperature=0.8, top_k=50, top_p=0.9, seed=2 ** 63 - 1),
         SamplingParams(temperature=0.7, top_p=0.5),                        # top-p alone
         SamplingParams(temperature=1.0, top_k=5000),                       # top_k >= vocab: none
         SamplingParams(temperature=0.5, repetition_penalty=1.2, min_tokens=3, logprobs=2),
         SamplingParams(temperature=0.9, top_k=1, min_p=0.1)]               # top_k 1: greedy


def test_rows_hold_what_the_parameters_give():
    plans, scratch = RowPlans(capacity=2), []  # grows past its first capacity
    rows = [row(p, f"r{i}") for i, p in enumerate(KINDS)]
    table, seeds, seeded = plans.gather(plans.slots(rows, 1000, scratch))
    assert scratch == [] and len(plans) == len(KINDS)
    assert rows_with(table[:, FLAGS], RANDOM) == [1, 2, 3, 4]
    assert rows_with(table[:, FLAGS], PENALTIES) == [4]
    assert rows_with(table[:, FLAGS], LOGPROBS) == [4]
    assert rows_with(table[:, FLAGS], MIN_TOKENS) == [4]
    assert table[:, TOP_K].tolist() == [0, 50, 0, 0, 0, 1]
    assert table[:, TEMPERATURE].tolist() == [p.temperature for p in KINDS]
    assert table[:, TOP_P].tolist() == [p.top_p for p in KINDS]
    assert table[:, MIN_P].tolist() == [p.min_p for p in KINDS]
    want_need = sampling_ops.num_candidates([0, 50, 0, 0, 0, 1], [p.top_p for p in KINDS], 1000)
    assert table[:, NEED].astype(np.int64).tolist() == want_need
    assert seeded.tolist() == [False, True, False, False, False, False]
    assert int(seeds[1]) == 2 ** 63 - 1


def test_min_tokens_needs_an_end_to_suppress():
    plans = RowPlans()
    p = SamplingParams(min_tokens=3)
    table, _, _ = plans.gather(plans.slots([row(p, "a", eos=()), row(p, "b")], 100, []))
    assert rows_with(table[:, FLAGS], MIN_TOKENS) == [1]


def test_rows_follow_their_params_object_and_the_vocabulary():
    plans = RowPlans()
    r = row(SamplingParams(temperature=0.8, top_k=50), "a")
    first = plans.slots([r], 1000, []).tolist()
    assert plans.slots([r], 1000, []).tolist() == first  # found again: the same slot
    r.params = SamplingParams(temperature=0.8, top_k=7)  # a new params object: refilled
    table, _, _ = plans.gather(plans.slots([r], 1000, []))
    assert table[0, TOP_K] == 7 and len(plans) == 1
    table, _, _ = plans.gather(plans.slots([r], 5, []))  # a smaller vocabulary: top_k 7 is none
    assert table[0, TOP_K] == 0 and table[0, NEED] == 0


def test_released_and_scratch_slots_are_reused():
    plans = RowPlans(capacity=4)
    a, b = row(SamplingParams(), "a"), row(SamplingParams(), "b")
    sa, sb = plans.slots([a, b], 100, []).tolist()
    plans.release("a")
    plans.release("missing")  # unknown ids are ignored
    assert len(plans) == 1
    scratch = []
    anon = plans.slots([row(SamplingParams(top_k=3), None)], 100, scratch).tolist()
    assert anon == [sa] and scratch == [sa]  # the freed slot, held for this call only
    assert plans.gather(np.asarray(anon))[0][0, TOP_K] == 3
    plans.free_scratch(scratch)
    assert scratch == [] and len(plans) == 1
    assert plans.slots([b], 100, []).tolist() == [sb]
